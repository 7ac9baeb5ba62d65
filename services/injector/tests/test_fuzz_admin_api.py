"""Schemathesis against the injector's admin API: the real route over the real Onboarder,
with its seams (certmanager, catalog, proxy-cp's address) faked as in test_rest.py, and the
onboarding token routes over a token store in memory.

The app is built once, at import: schemathesis generates one test per operation from it
(its fixture-based loader does not work with pytest 9). With the token, valid bodies
onboard a proxy; invalid ones must get a 422 that names the field.
"""

from __future__ import annotations

from typing import Any

import schemathesis
from fastapi import FastAPI
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from trellis_identity.identity import csr_for, new_key
from trellis_identity.tokens import AdminToken
from trellis_injector.metrics import InjectorMetrics
from trellis_injector.onboarder import Onboarder
from trellis_injector.testing import FakeCatalog, FakeCertificates, FixedControlPlane
from trellis_injector.transport import rest
from trellis_runtime import admin
from trellis_runtime.health import Health
from trellis_testing import adminfuzz
from trellis_testing import strategies as fuzz
from trellis_testing.onboarding import InMemoryTokenStore

SPIFFE = "spiffe://cluster.local/ns/trellis-system/sa/proxy-cp"
CSR_PEM = csr_for(new_key()[1], "fuzzed proxy").decode()


def admin_app() -> FastAPI:
    metrics = CollectorRegistry()
    app = admin.create_app("injector", metrics, {}, Health(metrics))
    onboarder = Onboarder(FakeCertificates(), FakeCatalog(), FixedControlPlane(), SPIFFE)
    rest.add_routes(
        app,
        onboarder,
        admin.token_guard(AdminToken.of(adminfuzz.TOKEN)),
        AdminToken.of(adminfuzz.TOKEN),
        InMemoryTokenStore(),
        InjectorMetrics(metrics),
    )
    return app


schema = adminfuzz.schema_of(admin_app())
BOOTSTRAPS = st.fixed_dictionaries(
    {
        "namespace": fuzz.mostly(st.sampled_from(["shop", "bookstore"]), fuzz.names()),
        "service": fuzz.mostly(fuzz.dns_labels(), fuzz.names()),
        "inbound_port": fuzz.mostly(st.just(15003), st.integers(0, 70_000)),
        "outbound_port": fuzz.mostly(st.just(15001), st.integers(0, 70_000)),
        "admin_port": fuzz.mostly(st.just(15000), st.integers(0, 70_000)),
        "output_dir": fuzz.mostly(st.just("/srv/proxy"), fuzz.names()),
        "csr_pem": fuzz.mostly(st.just(CSR_PEM), fuzz.names()),
    },
    optional={
        "service_account": fuzz.mostly(fuzz.dns_subdomains(), fuzz.names()),
        "app_port": fuzz.mostly(st.sampled_from([0, 8080]), st.integers(0, 70_000)),
        "protocol": fuzz.mostly(st.sampled_from(["sotw", "delta"]), fuzz.names()),
    },
)
TOKENS = st.fixed_dictionaries(
    {
        "namespace": fuzz.mostly(st.sampled_from(["shop", "trellis-system"]), fuzz.names()),
        "service": fuzz.mostly(st.just("cart"), fuzz.names()),
        "service_account": fuzz.mostly(fuzz.dns_subdomains(), fuzz.names()),
    },
    optional={
        "ttl_seconds": fuzz.mostly(st.just(3600.0), st.floats(allow_nan=False)),
        "uses": fuzz.mostly(st.just(1), st.integers()),
    },
)
adminfuzz.steer(schema, bodies={"POST /v1/bootstrap": BOOTSTRAPS, "POST /v1/tokens": TOKENS})


@schema.parametrize()
def test_admin_api(case: schemathesis.Case[Any]) -> None:
    adminfuzz.exercise(case)

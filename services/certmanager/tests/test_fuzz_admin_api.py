"""Schemathesis against certmanager's admin API: real routes over a real manager in memory.

The app is built once, at import: schemathesis generates one test per operation from it
(its fixture-based loader does not work with pytest 9). Certificates of both kinds are on
record, so the path parameters that name them can hit.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import schemathesis
from fastapi import FastAPI
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from trellis_certmanager.domain.authority import generate_root
from trellis_certmanager.domain.issuer import IssuancePolicy
from trellis_certmanager.domain.keys import KeyAlgorithm
from trellis_certmanager.manager import CertificateManager, utcnow
from trellis_certmanager.metrics import CertMetrics
from trellis_certmanager.testing import InMemoryCertificateStore, proxy_key
from trellis_certmanager.transport import rest
from trellis_common.model import MeshService
from trellis_identity.tokens import AdminToken
from trellis_runtime import admin
from trellis_runtime.health import Health
from trellis_testing import adminfuzz


async def _bell(kind: str, key: str) -> int:
    return 1


def admin_app() -> FastAPI:
    store = InMemoryCertificateStore()
    store.ca = generate_root(
        KeyAlgorithm.ECDSA_P256, dt.timedelta(days=365), utcnow(), "cluster.local"
    )
    metrics = CollectorRegistry()
    manager = CertificateManager(
        store, _bell, IssuancePolicy(), KeyAlgorithm.ECDSA_P256, CertMetrics(metrics)
    )

    async def start() -> None:
        await manager.start()
        await manager.issue_service(MeshService("shop", "cart"))
        await manager.issue_proxy(MeshService("shop", "cart"), public_key=proxy_key())

    asyncio.run(start())
    KNOWN.extend({"common_name": record.common_name} for record in manager.list())
    app = admin.create_app("certmanager", metrics, {"ca": manager.ready.is_set}, Health(metrics))
    rest.add_routes(app, manager, admin.token_guard(AdminToken.of(adminfuzz.TOKEN)))
    return app


KNOWN: list[dict[str, str]] = []  # the common names on record, filled by admin_app()
schema = adminfuzz.schema_of(admin_app())
adminfuzz.steer(
    schema,
    paths={
        "/v1/certificates/{common_name}": KNOWN,
        "/v1/certificates/{common_name}/rotate": KNOWN,
    },
    queries={
        "/v1/certificates": st.fixed_dictionaries(
            {},
            optional={"kind": st.sampled_from(["service", "proxy"]), "namespace": st.just("shop")},
        )
    },
)


@schema.parametrize()
def test_admin_api(case: schemathesis.Case[Any]) -> None:
    adminfuzz.exercise(case)

"""Schemathesis against endpoints-vm's admin API: real routes over a real manager in memory.

The app is built once, at import: schemathesis generates one test per operation from it
(its fixture-based loader does not work with pytest 9). One workload is registered, so
the path parameters that name it can hit; the admin token lets register and deregister
run (a heartbeat with it is refused, 403: only the workload's own token beats).
"""

from __future__ import annotations

import asyncio
from typing import Any

import schemathesis
from fastapi import FastAPI
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from trellis_endpoints_vm.domain.workloads import Workload
from trellis_endpoints_vm.manager import EndpointsManager
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_endpoints_vm.testing import InMemoryWorkloadStore
from trellis_endpoints_vm.transport import rest
from trellis_endpoints_vm.transport.credentials import Credentials
from trellis_identity.tokens import AdminToken
from trellis_runtime import admin
from trellis_runtime.health import Health
from trellis_testing import adminfuzz
from trellis_testing import strategies as fuzz
from trellis_testing.onboarding import InMemoryTokenStore


def admin_app() -> FastAPI:
    metrics = CollectorRegistry()
    counted = EndpointMetrics(metrics)
    manager = EndpointsManager(InMemoryWorkloadStore(), counted)

    async def start() -> None:
        await manager.start()
        await manager.register(
            Workload(
                namespace="shop",
                name="vm-1",
                services=("api",),
                address="10.0.0.1",
                ports=(("http", 8080),),
                ttl=30.0,
            )
        )

    asyncio.run(start())
    app = admin.create_app("endpoints-vm", metrics, {"registry": manager.ready.is_set}, Health())
    documents: dict[str, Any] = {"spec_dir": None, "documents": [], "conflicts": []}
    credentials = Credentials(AdminToken.of(adminfuzz.TOKEN), InMemoryTokenStore(), counted)
    rest.add_routes(app, manager, credentials, lambda: documents)
    return app


schema = adminfuzz.schema_of(admin_app())
KNOWN = [{"namespace": "shop", "name": "vm-1"}, {"namespace": "shop", "name": "vm-2"}]
REGISTRATIONS = st.fixed_dictionaries(
    {
        "namespace": st.just("shop"),
        "name": st.sampled_from(["vm-1", "vm-2", "vm-3"]),
        "services": st.lists(fuzz.dns_labels(), min_size=1, max_size=2, unique=True),
        "address": st.sampled_from(["10.0.0.2", "::1", "192.0.2.1"]),
        "ports": st.just([{"name": "http", "number": 8080}]) | st.just([{"number": 9090}]),
    },
    optional={
        "labels": st.dictionaries(fuzz.dns_labels(), fuzz.names(), max_size=2),
        "service_account": fuzz.dns_subdomains(),
        "locality": st.sampled_from(["eu", "eu/west", "eu/west/a"]),
        "network": fuzz.names(),
        "weight": st.integers(0, 2**32 - 1),
        "ttl": st.floats(1, 86400) | st.none(),
    },
)
adminfuzz.steer(
    schema,
    paths={
        "/v1/workloads/{namespace}/{name}": KNOWN,
        "/v1/workloads/{namespace}/{name}/heartbeat": KNOWN,
        "/v1/services/{namespace}/{name}": [{"namespace": "shop", "name": "api"}],
    },
    bodies={"POST /v1/workloads": REGISTRATIONS},
)


@schema.parametrize()
def test_admin_api(case: schemathesis.Case[Any]) -> None:
    adminfuzz.exercise(case)

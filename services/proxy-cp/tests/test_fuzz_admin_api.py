"""Schemathesis against proxy-cp's admin API: real routes over a real control plane.

Two proxies are attached the way the ADS server attaches them (snapshots built from fake
catalog views), so ``/v1/proxies/{proxy_id}/config`` can hit. The app is built once, at
import: schemathesis generates one test per operation from it (its fixture-based loader
does not work with pytest 9).
"""

from __future__ import annotations

import asyncio
from typing import Any

import schemathesis
from fastapi import FastAPI
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from trellis_proxy_cp import testing as t
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.transport import rest
from trellis_proxy_cp.transport.streams import StreamRegistry
from trellis_runtime import admin
from trellis_runtime.health import Health
from trellis_testing import adminfuzz


def admin_app() -> FastAPI:
    cache = SnapshotCache()
    control_plane = t.FakeSources().control_plane(cache)
    streams = StreamRegistry()

    async def attach() -> None:
        store = await t.connect(
            control_plane, streams, t.proxy_common_name("bookstore", "bookstore", 1)
        )
        snapshot = cache.get(store.key)
        assert snapshot is not None
        t.acknowledge(store, snapshot)
        await t.connect(
            control_plane,
            streams,
            t.proxy_common_name("bookbuyer", "bookbuyer", 2),
            protocol="delta",
        )

    asyncio.run(attach())
    metrics = CollectorRegistry()
    app = admin.create_app("proxy-cp", metrics, {"catalog": lambda: True}, Health(metrics))
    rest.add_routes(app, streams, cache, control_plane)
    return app


schema = adminfuzz.schema_of(admin_app())
PROXIES = [
    t.proxy_common_name("bookstore", "bookstore", 1),
    t.proxy_common_name("bookbuyer", "bookbuyer", 2),
]
adminfuzz.steer(
    schema,
    paths={"/v1/proxies/{proxy_id}/config": [{"proxy_id": p} for p in PROXIES]},
    queries={
        "/v1/proxies/{proxy_id}/config": st.fixed_dictionaries(
            {}, optional={"type": st.lists(st.sampled_from(["cds", "eds", "lds", "rds", "sds"]))}
        )
    },
)


@schema.parametrize()
def test_admin_api(case: schemathesis.Case[Any]) -> None:
    adminfuzz.exercise(case)

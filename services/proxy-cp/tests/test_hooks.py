"""What proxy-cp does on stream events: metrics, the catalog's (un)registration, detaching."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import grpc
import pytest
from prometheus_client import CollectorRegistry

from trellis_proxy_cp import testing as t
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.hooks import ProxyHooks
from trellis_proxy_cp.metrics import XdsMetrics
from trellis_proxy_cp.transport.streams import ProxyStream, StreamRefused, StreamRegistry
from trellis_proxy_cp.types import CLUSTER, ROUTE, TypeUrl
from trellis_runtime.health import Rejections

PROXY = t.proxy_common_name("bookstore", "bookstore", 1)
OTHER = t.proxy_common_name("bookstore", "bookstore", 2)


@dataclass
class FakeCatalog:
    """RegisterProxy and UnregisterProxy, recorded; ``broken`` makes them fail."""

    registered: list[tuple[str, str]] = field(default_factory=list)
    unregistered: list[str] = field(default_factory=list)
    broken: bool = False

    async def register(self, common_name: str, address: str) -> None:
        await asyncio.sleep(0)
        if self.broken:
            raise ConnectionError("catalog unreachable")
        self.registered.append((common_name, address))

    async def unregister(self, common_name: str) -> None:
        await asyncio.sleep(0)
        if self.broken:
            raise ConnectionError("catalog unreachable")
        self.unregistered.append(common_name)


@dataclass
class World:
    registry: CollectorRegistry
    sources: t.FakeSources
    control_plane: ProxyControlPlane
    streams: StreamRegistry
    catalog: FakeCatalog
    hooks: ProxyHooks
    rejections: Rejections

    def sample(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    async def connect(self, proxy: str = PROXY, protocol: str = "sotw") -> ProxyStream:
        return await t.connect(self.control_plane, self.streams, proxy, protocol=protocol)


@pytest.fixture
def world() -> World:
    registry = CollectorRegistry()
    sources = t.FakeSources()
    control_plane = sources.control_plane(SnapshotCache())
    catalog = FakeCatalog()
    rejections = Rejections(registry)
    hooks = ProxyHooks(
        control_plane,
        XdsMetrics(registry),
        catalog.register,
        catalog.unregister,
        rejections,
    )
    return World(registry, sources, control_plane, StreamRegistry(), catalog, hooks, rejections)


async def test_open_counts_the_stream_and_registers_the_proxy(world: World) -> None:
    sotw = await world.connect(PROXY)
    delta = await world.connect(OTHER, protocol="delta")

    world.hooks.on_open(sotw)
    world.hooks.on_open(delta)
    await world.hooks.idle()

    assert world.sample("trellis_proxy_cp_connected_proxies", protocol="sotw") == 1
    assert world.sample("trellis_proxy_cp_connected_proxies", protocol="delta") == 1
    assert world.sample("trellis_proxy_cp_streams_total", protocol="sotw") == 1
    assert world.sample("trellis_proxy_cp_streams_total", protocol="delta") == 1
    assert world.catalog.registered == [(PROXY, ""), (OTHER, "")]


async def test_a_refusal_is_counted_and_kept_until_the_proxy_connects(world: World) -> None:
    too_big = StreamRefused(
        grpc.StatusCode.INVALID_ARGUMENT, "node metadata is 20000 bytes", "node_metadata_too_large"
    )
    world.hooks.on_refused(PROXY, "delta", too_big)
    world.hooks.on_refused(PROXY, "delta", too_big)

    labels = {"code": "INVALID_ARGUMENT", "reason": "node_metadata_too_large"}
    assert world.sample("trellis_proxy_cp_refused_streams_total", **labels) == 2
    assert world.sample("trellis_rejected_records_total", source="xds") == 2
    assert [(r.source, r.key, r.reason, r.count) for r in world.rejections.items()] == [
        ("xds", PROXY, "INVALID_ARGUMENT: node metadata is 20000 bytes", 2)
    ]

    world.hooks.on_open(await world.connect(PROXY))
    await world.hooks.idle()
    assert world.rejections.items() == []


async def test_the_old_stream_of_a_reconnected_proxy_closing_unregisters_nothing(
    world: World,
) -> None:
    old = await world.connect(PROXY)
    world.hooks.on_open(old)
    new = await world.connect(PROXY)
    world.hooks.on_open(new)

    world.hooks.on_close(old)
    await world.hooks.idle()

    assert world.catalog.unregistered == []
    assert world.control_plane.groups[new.key].proxies == {PROXY}
    world.hooks.on_close(new)
    await world.hooks.idle()
    assert world.catalog.unregistered == [PROXY]


async def test_close_detaches_from_the_control_plane_and_unregisters(world: World) -> None:
    stream = await world.connect()
    world.hooks.on_open(stream)

    world.hooks.on_close(stream)
    await world.hooks.idle()

    assert world.sample("trellis_proxy_cp_connected_proxies", protocol="sotw") == 0
    assert world.sample("trellis_proxy_cp_streams_total", protocol="sotw") == 1
    assert stream.key not in world.control_plane.groups
    assert world.control_plane.cache.get(stream.key) is None
    assert world.sources.forgotten == ["bookstore/bookstore"]
    assert world.catalog.unregistered == [PROXY]


async def test_a_stream_without_a_protocol_counts_as_sotw(world: World) -> None:
    stream = await world.connect(protocol="")

    world.hooks.on_open(stream)
    await world.hooks.idle()

    assert world.sample("trellis_proxy_cp_connected_proxies", protocol="sotw") == 1


async def test_a_failing_catalog_is_ignored(world: World) -> None:
    world.catalog.broken = True
    stream = await world.connect()

    world.hooks.on_open(stream)
    world.hooks.on_close(stream)
    await world.hooks.idle()

    assert world.catalog.registered == []
    assert world.catalog.unregistered == []
    assert world.sample("trellis_proxy_cp_connected_proxies", protocol="sotw") == 0


async def test_sent_acks_and_nacks_are_counted_per_type(world: World) -> None:
    stream = await world.connect()

    world.hooks.on_sent(stream, CLUSTER, "v1")
    world.hooks.on_sent(stream, ROUTE, "v1")
    world.hooks.on_ack(stream, CLUSTER, "v1")
    world.hooks.on_nack(stream, ROUTE, "v1", "duplicate domain")
    world.hooks.on_sent(stream, TypeUrl("type.googleapis.com/some.Other"), "v1")

    assert world.sample("trellis_proxy_cp_pushes_total", type="cds") == 1
    assert world.sample("trellis_proxy_cp_pushes_total", type="rds") == 1
    assert world.sample("trellis_proxy_cp_pushes_total", type="type.googleapis.com/some.Other") == 1
    assert world.sample("trellis_proxy_cp_acks_total", type="cds") == 1
    assert world.sample("trellis_proxy_cp_acks_total", type="rds") == 0
    assert world.sample("trellis_proxy_cp_nacks_total", type="rds") == 1


async def test_an_ack_observes_the_time_since_the_snapshot_was_set(world: World) -> None:
    stream = await world.connect()
    world.control_plane.set_at[stream.key] = time.monotonic() - 0.3

    world.hooks.on_ack(stream, CLUSTER, "v1")

    latency = "trellis_proxy_cp_push_latency_seconds"
    assert world.sample(f"{latency}_count", type="cds") == 1
    assert 0.3 <= world.sample(f"{latency}_sum", type="cds") < 5
    assert world.sample(f"{latency}_bucket", type="cds", le="0.25") == 0
    assert world.sample(f"{latency}_bucket", type="cds", le="2.5") == 1


async def test_an_ack_for_a_key_without_a_snapshot_observes_nothing(world: World) -> None:
    stream = await world.connect()
    world.control_plane.set_at.clear()

    world.hooks.on_ack(stream, CLUSTER, "v1")

    assert world.sample("trellis_proxy_cp_acks_total", type="cds") == 1
    assert world.sample("trellis_proxy_cp_push_latency_seconds_count", type="cds") == 0

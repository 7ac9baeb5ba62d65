"""Caps on what one proxy may ask, over a real grpc.aio server and client, SotW and delta."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from google.protobuf import struct_pb2

from trellis_proxy_cp import testing as t
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.translate.names import gateway_cert
from trellis_proxy_cp.transport import limits
from trellis_proxy_cp.transport.limits import StreamLimits
from trellis_proxy_cp.transport.streams import ProxyStream
from trellis_proxy_cp.types import CLUSTER, ENDPOINT, SECRET

LIMITS = StreamLimits(
    max_node_metadata_bytes=1024,
    max_resource_names=10,
    max_resource_name_bytes=40,
    max_streams_per_proxy=2,
)


class CountingAuthorizer(t.StaticAuthorizer):
    """The static authorizer, counting the nodes it was asked about."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    async def authorize(
        self, context: grpc.aio.ServicerContext[Any, Any], node: Any
    ) -> ProxyStream:
        self.asked.append(node.id)
        return await super().authorize(context, node)


@pytest.fixture
def hooks() -> t.RecordingHooks:
    return t.RecordingHooks()


@pytest.fixture
def authorizer() -> CountingAuthorizer:
    return CountingAuthorizer()


@pytest.fixture
async def ads(
    hooks: t.RecordingHooks, authorizer: CountingAuthorizer
) -> AsyncIterator[t.AdsHarness]:
    cache = SnapshotCache()
    cache.set_snapshot("mesh", t.mesh("1"))
    async with t.ads_server(
        cache, authorizer=authorizer, hooks=hooks, stream_limits=LIMITS
    ) as harness:
        yield harness


def node_with_metadata(size: int, node_id: str = "envoy-1") -> base_pb2.Node:
    metadata = struct_pb2.Struct()
    metadata.update({"padding": "x" * size})
    return base_pb2.Node(id=node_id, cluster="test", metadata=metadata)


def names(count: int, length: int = 8) -> list[str]:
    return [f"{n:0{length}d}" for n in range(count)]


async def refused(envoy: t.AdsClient) -> tuple[grpc.StatusCode, str]:
    return await envoy.status(), await envoy.details()


async def opened(envoy: t.AdsClient, node_id: str = "envoy-1") -> None:
    """Send the first request and see it answered (the stream is open)."""
    await envoy.send(node=t.node(node_id), type_url=CLUSTER)
    assert (await envoy.recv()).type_url == CLUSTER


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_node_metadata_over_the_cap_is_refused_before_authorization(
    ads: t.AdsHarness, hooks: t.RecordingHooks, authorizer: CountingAuthorizer, delta: bool
) -> None:
    envoy = await ads.open(delta=delta)
    await envoy.send(node=node_with_metadata(2000), type_url=CLUSTER)

    code, details = await refused(envoy)

    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("node metadata is 20")
    assert "bytes serialized, over the limit of 1024 bytes" in details
    assert "setting max_node_metadata_bytes, TRELLIS_PROXY_CP_MAX_NODE_METADATA_BYTES" in details
    assert authorizer.asked == []
    protocol = "delta" if delta else "sotw"
    assert hooks.calls == [
        ("refused", "envoy-1", protocol, "INVALID_ARGUMENT", "node_metadata_too_large")
    ]


async def test_node_metadata_within_the_cap_is_served(ads: t.AdsHarness) -> None:
    envoy = await ads.open()
    await envoy.send(node=node_with_metadata(900), type_url=CLUSTER)
    assert (await envoy.recv()).type_url == CLUSTER


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_too_many_names_in_one_request_end_the_stream(
    ads: t.AdsHarness, hooks: t.RecordingHooks, delta: bool
) -> None:
    envoy = await ads.open(delta=delta)
    await opened(envoy)
    field = "resource_names_subscribe" if delta else "resource_names"
    await envoy.send(type_url=ENDPOINT, **{field: names(10)})  # at the cap: served
    assert (await envoy.recv()).type_url == ENDPOINT

    await envoy.send(type_url=ENDPOINT, **{field: names(11)})
    code, details = await refused(envoy)

    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details == (
        f"11 resource names in one {ENDPOINT} request, over the limit of 10 "
        "(setting max_resource_names, TRELLIS_PROXY_CP_MAX_RESOURCE_NAMES)"
    )
    protocol = "delta" if delta else "sotw"
    assert ("refused", "envoy-1", protocol, "RESOURCE_EXHAUSTED", "too_many_names") in hooks.calls
    assert hooks.of("close") == [("close", "envoy-1")]


async def test_delta_initial_versions_count_as_names(ads: t.AdsHarness) -> None:
    envoy = await ads.open(delta=True)
    await envoy.send(
        node=t.node(),
        type_url=CLUSTER,
        initial_resource_versions={name: "v1" for name in names(11)},
    )
    assert await envoy.status() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_a_delta_subscription_cannot_grow_past_the_cap(
    ads: t.AdsHarness, hooks: t.RecordingHooks
) -> None:
    envoy = await ads.open(delta=True)
    await opened(envoy)
    await envoy.send(type_url=ENDPOINT, resource_names_subscribe=names(6))
    assert (await envoy.recv()).type_url == ENDPOINT
    await envoy.send(type_url=ENDPOINT, resource_names_subscribe=names(12)[6:])

    code, details = await refused(envoy)

    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details.startswith(f"subscribed to 12 resource names of {ENDPOINT}, over the limit")
    assert "max_resource_names" in details


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_a_name_over_the_length_cap_is_invalid(
    ads: t.AdsHarness, hooks: t.RecordingHooks, delta: bool
) -> None:
    envoy = await ads.open(delta=delta)
    await opened(envoy)
    field = "resource_names_subscribe" if delta else "resource_names"
    await envoy.send(type_url=ENDPOINT, **{field: ["c0", "é" * 21]})  # 42 bytes in UTF-8

    code, details = await refused(envoy)

    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "is 42 bytes, over the limit of 40 bytes" in details
    assert "TRELLIS_PROXY_CP_MAX_RESOURCE_NAME_BYTES" in details
    protocol = "delta" if delta else "sotw"
    assert ("refused", "envoy-1", protocol, "INVALID_ARGUMENT", "name_too_long") in hooks.calls


async def test_one_stream_too_many_replaces_the_proxys_oldest(
    ads: t.AdsHarness, hooks: t.RecordingHooks
) -> None:
    first = await ads.open()
    await opened(first)
    second = await ads.open(delta=True)
    await opened(second)
    other = await ads.open()
    await opened(other, "envoy-2")  # another proxy's streams do not count

    third = await ads.open()
    await opened(third)

    code, details = await refused(first)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details.startswith("replaced by a newer stream of proxy envoy-1: at most 2 streams")
    assert "TRELLIS_PROXY_CP_MAX_STREAMS_PER_PROXY" in details
    await second.quiet()
    await third.quiet()
    await other.quiet()
    assert ("refused", "envoy-1", "sotw", "RESOURCE_EXHAUSTED", "replaced") in hooks.calls
    assert len(ads.servicer.registry.of_proxy("envoy-1")) == 2
    assert len(ads.servicer.registry.of_proxy("envoy-2")) == 1


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_sds_serves_only_the_proxys_own_secrets_and_refuses_any_other_name(
    ads: t.AdsHarness, hooks: t.RecordingHooks, delta: bool
) -> None:
    envoy = await ads.open(delta=delta)
    await opened(envoy)
    field = "resource_names_subscribe" if delta else "resource_names"
    await envoy.send(type_url=SECRET, **{field: [t.CERT, t.CA]})  # its own: served
    assert (await envoy.recv()).type_url == SECRET

    other = "spiffe://cluster.local/ns/trellis-system/sa/proxy-cp"
    await envoy.send(type_url=SECRET, **{field: [t.CERT, t.CA, other]})
    code, details = await refused(envoy)

    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert details == (
        "SDS serves this proxy's own secrets only (mesh-trust-bundle, service-cert); "
        f"refused: {other!r}"
    )
    protocol = "delta" if delta else "sotw"
    assert ("refused", "envoy-1", protocol, "PERMISSION_DENIED", "foreign_secret") in hooks.calls
    assert hooks.of("close") == [("close", "envoy-1")]


def test_a_gateways_listener_certificates_are_its_own_secrets() -> None:
    """``gateway-cert/<ns>/<name>`` names are file references a gateway's own view holds
    (never key material): asking for them is not refused; anything else still is."""
    limits.check_secrets([t.CERT, t.CA, gateway_cert("shop", "web-tls")])
    with pytest.raises(limits.LimitExceeded) as refused_:
        limits.check_secrets([gateway_cert("shop", "web-tls"), "gateway-certs/x"])
    assert refused_.value.reason == "foreign_secret"

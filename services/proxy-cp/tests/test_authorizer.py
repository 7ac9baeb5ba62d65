"""Who may open an xDS stream: certificate, expectation, node id, node metadata.

The gRPC context is a fake whose ``auth_context()`` is what grpc gives after an mTLS
handshake; the node is a real ``envoy.config.core.v3.Node``; the control plane is real.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any, cast

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from google.protobuf import struct_pb2

from trellis_proxy_cp import testing as t
from trellis_proxy_cp.authorizer import MeshAuthorizer
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.clients.catalog import CatalogClient
from trellis_proxy_cp.clients.expected import Expectation
from trellis_proxy_cp.clients.revoked import RevokedSerials
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.translate.settings import ProxySettings
from trellis_proxy_cp.transport.streams import StreamRefused

PROXY = t.proxy_common_name("bookstore", "bookstore", 1)
STRANGER = t.proxy_common_name("bookstore", "bookstore", 9)


CURRENT, OLD = 0xC0FFEE, 0xDEAD
AGE = dt.timedelta(minutes=5)  # how long ago a peer certificate was issued


class FakeContext:
    """What the authorizer reads of a ``grpc.aio.ServicerContext``."""

    def __init__(
        self, common_name: str | None, serial: int | None, age: dt.timedelta = AGE
    ) -> None:
        self._auth: dict[str, list[bytes]] = {}
        if common_name is not None:
            self._auth["x509_common_name"] = [common_name.encode()]
            if serial is not None:
                pem = t.peer_certificate_pem(common_name, serial, age)
                self._auth["x509_pem_cert"] = [pem]

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth


def context(
    common_name: str | None, serial: int | None = CURRENT, age: dt.timedelta = AGE
) -> grpc.aio.ServicerContext[Any, Any]:
    return cast("grpc.aio.ServicerContext[Any, Any]", FakeContext(common_name, serial, age))


OWN_FILES = "/etc/trellis/proxy"


def node(
    node_id: str = PROXY, trellis: dict[str, Any] | None = None, own: bool = True
) -> base_pb2.Node:
    """A proxy's node; ``own``: its bootstrap names its own workload certificate's folder,
    as every onboarding path writes it."""
    metadata = struct_pb2.Struct()
    section = {"workload_dir": OWN_FILES} if own else {}
    section.update(trellis or {})
    if section:
        metadata.update({"trellis": section})
    return base_pb2.Node(id=node_id, cluster="bookstore", metadata=metadata)


class Expectations:
    """The catalog's expected proxies (common name -> service account, with the current
    serial :data:`CURRENT`), recording questions."""

    def __init__(self, expected: dict[str, str]) -> None:
        self.expected = expected
        self.asked: list[str] = []
        self.onboarding: list[bool] = []

    async def __call__(
        self, common_name: str, serial: str = "", *, onboarding: bool = False
    ) -> Expectation | None:
        self.asked.append(common_name)
        self.onboarding.append(onboarding)
        account = self.expected.get(common_name)
        return None if account is None else Expectation(account, f"{CURRENT:x}")


@pytest.fixture
def sources() -> t.FakeSources:
    return t.FakeSources()


@pytest.fixture
def control_plane(sources: t.FakeSources) -> ProxyControlPlane:
    return sources.control_plane(SnapshotCache())


@pytest.fixture
def expectations() -> Expectations:
    return Expectations({PROXY: "bookstore-sa"})


@pytest.fixture
def revoked() -> RevokedSerials:
    return RevokedSerials()


@pytest.fixture
def authorizer(
    control_plane: ProxyControlPlane, expectations: Expectations, revoked: RevokedSerials
) -> MeshAuthorizer:
    return MeshAuthorizer(control_plane, expectations, revoked)


async def refusal(
    authorizer: MeshAuthorizer, common_name: str | None, envoy_node: base_pb2.Node
) -> StreamRefused:
    with pytest.raises(StreamRefused) as caught:
        await authorizer.authorize(context(common_name), envoy_node)
    return caught.value


async def test_no_client_certificate_is_unauthenticated(
    authorizer: MeshAuthorizer, control_plane: ProxyControlPlane, expectations: Expectations
) -> None:
    refused = await refusal(authorizer, None, node())

    assert refused.code == grpc.StatusCode.UNAUTHENTICATED
    assert "no client certificate" in refused.message
    assert expectations.asked == []
    assert control_plane.groups == {}


@pytest.mark.parametrize(
    "common_name",
    ["bookstore", "catalog.trellis-system", "not-a-uuid.bookstore.bookstore"],
)
async def test_a_certificate_that_is_not_a_proxys_is_denied_and_named(
    authorizer: MeshAuthorizer, expectations: Expectations, common_name: str
) -> None:
    refused = await refusal(authorizer, common_name, node(common_name))

    assert refused.code == grpc.StatusCode.PERMISSION_DENIED
    assert common_name in refused.message
    assert expectations.asked == []


async def test_a_proxy_nobody_expects_is_denied(
    authorizer: MeshAuthorizer, control_plane: ProxyControlPlane, expectations: Expectations
) -> None:
    refused = await refusal(authorizer, STRANGER, node(STRANGER))

    assert refused.code == grpc.StatusCode.PERMISSION_DENIED
    assert f"proxy {STRANGER} is not expected" in refused.message
    assert expectations.asked == [STRANGER]
    assert control_plane.groups == {}


async def test_a_node_id_other_than_the_common_name_is_denied(
    authorizer: MeshAuthorizer, control_plane: ProxyControlPlane
) -> None:
    refused = await refusal(authorizer, PROXY, node(STRANGER))

    assert refused.code == grpc.StatusCode.PERMISSION_DENIED
    assert repr(STRANGER) in refused.message
    assert repr(PROXY) in refused.message
    assert control_plane.groups == {}


@pytest.mark.parametrize(
    ("trellis", "named"),
    [
        ({"inbound_port": "http"}, "node.metadata.trellis.inbound_port"),
        ({"outbound_port": 70000}, "node.metadata.trellis.outbound_port"),
        ({"app_address": "localhost"}, "node.metadata.trellis.app_address"),
        (
            {"inbound_port": 15001, "inbound_address": "127.0.0.1"},
            "inbound and outbound ports collide",
        ),
    ],
)
async def test_bad_node_metadata_is_an_invalid_argument_naming_the_key(
    authorizer: MeshAuthorizer,
    control_plane: ProxyControlPlane,
    trellis: dict[str, Any],
    named: str,
) -> None:
    refused = await refusal(authorizer, PROXY, node(PROXY, trellis))

    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT
    assert named in refused.message
    assert control_plane.groups == {}


async def test_a_good_proxy_gets_a_stream_with_its_key_and_identity(
    authorizer: MeshAuthorizer, control_plane: ProxyControlPlane, sources: t.FakeSources
) -> None:
    trellis = {"outbound_port": 16001, "inbound_port": 16003, "app_port": 9000}

    stream = await authorizer.authorize(context(PROXY), node(PROXY, trellis))

    settings = ProxySettings(
        outbound_port=16001, inbound_port=16003, app_port=9000, workload_dir=OWN_FILES
    )
    assert stream.key == ProxyControlPlane.key_of("bookstore/bookstore", settings)
    assert stream.identity == "bookstore/bookstore"
    assert stream.proxy_id == stream.node_id == PROXY
    assert control_plane.groups[stream.key].proxies == {PROXY}
    assert control_plane.cache.get(stream.key) is not None
    # The view is fetched for the account certmanager issued the proxy certificate for.
    assert sources.view_fetches == [("bookstore/bookstore", "bookstore-sa")]


async def test_no_other_metadata_means_default_settings(
    authorizer: MeshAuthorizer, control_plane: ProxyControlPlane
) -> None:
    stream = await authorizer.authorize(context(PROXY), node(PROXY))

    default = ProxySettings(workload_dir=OWN_FILES)
    assert stream.key == ProxyControlPlane.key_of("bookstore/bookstore", default)


async def test_a_sidecar_without_its_own_workload_certificate_is_refused_not_sent_a_key(
    authorizer: MeshAuthorizer, control_plane: ProxyControlPlane
) -> None:
    """A bootstrap made before every proxy had its own workload certificate would need its
    service's shared key: the stream is refused, saying how to fix it."""
    refused = await refusal(authorizer, PROXY, node(PROXY, own=False))

    assert (refused.code, refused.reason) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "no_workload_dir",
    )
    assert "trellis vm bootstrap" in refused.message
    assert control_plane.groups == {}
    # a proxyless client reads its own files through its certificate provider
    proxyless = await authorizer.authorize(
        context(PROXY), node(PROXY, {"proxyless": True}, own=False)
    )
    assert proxyless.proxy_id == PROXY


async def test_a_storm_of_authorizations_asks_the_catalog_once(
    control_plane: ProxyControlPlane,
) -> None:
    names = [t.proxy_common_name("bookstore", "bookstore", n) for n in range(200)]
    async with t.fake_catalog({name: "bookstore-sa" for name in names}) as catalog:
        client = CatalogClient(t.locator(catalog.address), on_resources=ignore_resources)
        try:
            authorizer = MeshAuthorizer(control_plane, client.expected)
            streams = await asyncio.gather(
                *(authorizer.authorize(context(name), node(name)) for name in names)
            )
        finally:
            await client.close()

    assert {s.proxy_id for s in streams} == set(names)
    assert catalog.calls == 1


async def test_when_the_catalog_cannot_tell_the_stream_is_unavailable_not_denied(
    control_plane: ProxyControlPlane,
) -> None:
    async with t.fake_catalog({PROXY: "bookstore-sa"}) as catalog:
        catalog.failing = True
        client = CatalogClient(t.locator(catalog.address), on_resources=ignore_resources)
        try:
            refused = await refusal(MeshAuthorizer(control_plane, client.expected), PROXY, node())
        finally:
            await client.close()

    assert refused.code == grpc.StatusCode.UNAVAILABLE
    assert refused.reason == "catalog_unavailable"
    assert f"cannot tell whether proxy {PROXY} is expected" in refused.message
    assert "UNAVAILABLE: catalog is restarting" in refused.message
    assert control_plane.groups == {}


async def test_a_revoked_serial_is_denied_before_the_catalog_is_asked(
    authorizer: MeshAuthorizer,
    revoked: RevokedSerials,
    expectations: Expectations,
    control_plane: ProxyControlPlane,
) -> None:
    revoked.add(PROXY, [f"{CURRENT:x}"])

    refused = await refusal(authorizer, PROXY, node())

    assert refused.code == grpc.StatusCode.PERMISSION_DENIED
    assert refused.reason == "revoked"
    assert f"serial {CURRENT:x}) is revoked" in refused.message
    assert expectations.asked == []
    assert control_plane.groups == {}


async def test_a_serial_other_than_the_current_one_is_denied_as_stale(
    authorizer: MeshAuthorizer, control_plane: ProxyControlPlane
) -> None:
    with pytest.raises(StreamRefused) as caught:
        await authorizer.authorize(context(PROXY, OLD), node())

    assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert caught.value.reason == "stale_serial"
    assert f"serial {OLD:x}) is not its current one (serial {CURRENT:x})" in caught.value.message
    assert control_plane.groups == {}


async def test_a_certificate_whose_serial_cannot_be_read_is_unauthenticated(
    authorizer: MeshAuthorizer, expectations: Expectations
) -> None:
    with pytest.raises(StreamRefused) as caught:
        await authorizer.authorize(context(PROXY, None), node())

    assert caught.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert caught.value.reason == "no_serial"
    assert expectations.asked == []


async def test_the_stream_carries_the_serial_it_was_opened_with(
    authorizer: MeshAuthorizer,
) -> None:
    stream = await authorizer.authorize(context(PROXY), node())

    assert stream.serial == f"{CURRENT:x}"


async def ignore_resources(policies: object, slices: object) -> None:
    return None


async def test_a_certificate_issued_moments_ago_is_asked_about_as_onboarding(
    authorizer: MeshAuthorizer, expectations: Expectations
) -> None:
    """certmanager backdates notBefore by a minute: issued just now reads as 60 s old."""
    await authorizer.authorize(context(PROXY, age=dt.timedelta(seconds=60)), node())
    await authorizer.authorize(context(PROXY), node())  # five minutes old
    assert expectations.onboarding == [True, False]

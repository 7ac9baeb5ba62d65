"""Who is on the other end of an xDS stream, and may it be served?

The TLS handshake already required a client certificate from the mesh CA (a foreign CA
never reaches this code). Here: its common name must be a proxy certificate's
(``<proxy-uuid>.<service>.<namespace>``), its serial must not be revoked
(:mod:`.clients.revoked`), the catalog must expect that proxy (certmanager issued for it at
onboarding) with that serial (the current one: a rotated-away certificate is stale), the
Envoy node id must be that common name, and the node metadata must give valid per-proxy
settings. A common name alone is never enough: the serial is read from the peer's
certificate itself. Each refusal names what is wrong. Certificate renewals
(:mod:`.transport.renewal`) are checked the same way (:meth:`MeshAuthorizer.identify`). Whether a
proxy is expected is asked of ``expected`` (the catalog client's cache of ``ListProxies``);
when the catalog cannot tell, the stream is refused UNAVAILABLE (retry), not PERMISSION_DENIED.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from cryptography import x509
from google.protobuf import json_format

from trellis_common.ids import InvalidIdentifier, ProxyCommonName
from trellis_proxy_cp.clients.expected import Expectation, ExpectationUnknown
from trellis_proxy_cp.clients.revoked import RevokedSerials
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.translate import locality
from trellis_proxy_cp.translate.settings import InvalidNodeMetadata, from_metadata
from trellis_proxy_cp.transport.streams import ProxyStream, StreamRefused, StreamRunner

log = logging.getLogger(__name__)

#: A certificate whose notBefore is less than this ago was issued moments ago (certmanager
#: backdates notBefore by a minute, for clock skew between hosts).
ONBOARDING_WINDOW = dt.timedelta(seconds=90)


class Expected(Protocol):
    """What the catalog expects of a proxy (its client's cache of ``ListProxies``)."""

    async def __call__(
        self, common_name: str, serial: str = "", /, *, onboarding: bool = False
    ) -> Expectation | None: ...


def peer_common_name(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    values = list(context.auth_context().get("x509_common_name") or [])
    return values[0].decode() if values else ""


def peer_certificate(context: grpc.aio.ServicerContext[Any, Any]) -> x509.Certificate | None:
    """The peer's certificate, if it presented one that can be read."""
    values = list(context.auth_context().get("x509_pem_cert") or [])
    if not values:
        return None
    try:
        return x509.load_pem_x509_certificate(bytes(values[0]))
    except ValueError:
        return None


def onboarding(certificate: x509.Certificate | None, now: dt.datetime | None = None) -> bool:
    """Whether ``certificate`` was issued moments ago: its proxy may be connecting before the
    catalog heard of it (see :class:`~.clients.expected.ExpectedProxies`)."""
    if certificate is None:
        return False
    now = now or dt.datetime.now(dt.UTC)
    return now - certificate.not_valid_before_utc < ONBOARDING_WINDOW


@dataclass(frozen=True, slots=True)
class PresentedProxy:
    """A proxy that presented its current, unrevoked certificate, and was expected."""

    common_name: str
    proxy: ProxyCommonName
    serial: str
    """Of the presented certificate, lowercase hex."""
    expected: Expectation


class MeshAuthorizer:
    def __init__(
        self,
        control_plane: ProxyControlPlane,
        expected: Expected,
        revoked: RevokedSerials | None = None,
    ) -> None:
        self._control_plane = control_plane
        self._expected = expected
        self._revoked = revoked if revoked is not None else RevokedSerials()

    async def identify(self, context: grpc.aio.ServicerContext[Any, Any]) -> PresentedProxy:
        """The proxy presenting its certificate on this call, or :class:`StreamRefused`
        naming what is wrong. xDS streams and certificate renewals check the same way."""
        common_name = peer_common_name(context)
        if not common_name:
            raise StreamRefused(
                grpc.StatusCode.UNAUTHENTICATED,
                "no client certificate: proxy-cp serves only proxies presenting a proxy "
                "certificate from the mesh CA",
                "no_certificate",
            )
        try:
            proxy = ProxyCommonName.parse(common_name)
        except InvalidIdentifier as exc:
            raise StreamRefused(
                grpc.StatusCode.PERMISSION_DENIED, str(exc), "not_a_proxy_certificate"
            ) from None
        certificate = peer_certificate(context)
        serial = f"{certificate.serial_number:x}" if certificate is not None else ""
        if not serial:
            raise StreamRefused(
                grpc.StatusCode.UNAUTHENTICATED,
                f"the client certificate of {common_name} could not be read for its serial",
                "no_serial",
            )
        if serial in self._revoked:
            raise StreamRefused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the certificate of proxy {common_name} (serial {serial}) is revoked: onboard "
                f"the proxy again, or use its current certificate",
                "revoked",
            )
        try:
            expected = await self._expected(common_name, serial, onboarding=onboarding(certificate))
        except ExpectationUnknown as exc:
            raise StreamRefused(
                grpc.StatusCode.UNAVAILABLE,
                f"cannot tell whether proxy {common_name} is expected: the catalog did not "
                f"answer ({exc}); retry later",
                "catalog_unavailable",
            ) from None
        if expected is None:
            raise StreamRefused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"proxy {common_name} is not expected: no proxy certificate was issued for it "
                f"(onboard it with `trellis vm bootstrap` or the injector)",
                "not_expected",
            )
        if not expected.fits(serial):
            raise StreamRefused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the certificate of proxy {common_name} (serial {serial}) is not its current "
                f"one (serial {expected.serial}): it was replaced; use the current certificate",
                "stale_serial",
            )
        return PresentedProxy(common_name, proxy, serial, expected)

    async def authorize(
        self, context: grpc.aio.ServicerContext[Any, Any], node: Any
    ) -> ProxyStream:
        presented = await self.identify(context)
        common_name, proxy, serial = presented.common_name, presented.proxy, presented.serial
        expected = presented.expected
        if node.id != common_name:
            raise StreamRefused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"node id {node.id!r} does not match the certificate's common name {common_name!r}",
                "node_id_mismatch",
            )
        try:
            settings = from_metadata(
                json_format.MessageToDict(node.metadata), locality.of_node(node.locality)
            )
        except InvalidNodeMetadata as exc:
            raise StreamRefused(
                grpc.StatusCode.INVALID_ARGUMENT, str(exc), "invalid_metadata"
            ) from None
        identity = f"{proxy.namespace}/{proxy.service}"
        if not settings.workload_dir and not settings.proxyless:
            # a bootstrap made before every proxy had its own workload certificate: it
            # would need its service's shared key, which no proxy is sent any more
            raise StreamRefused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"proxy {common_name}'s bootstrap names no trellis.workload_dir (a folder "
                "holding its own workload certificate); no proxy is sent its service's key: "
                "onboard it again (`trellis vm bootstrap`)",
                "no_workload_dir",
            )
        key = await self._control_plane.attach(common_name, identity, expected.account, settings)
        return ProxyStream(
            proxy_id=common_name, key=key, node_id=node.id, identity=identity, serial=serial
        )


def end_revoked(runner: StreamRunner, common_name: str, serials: set[str]) -> int:
    """End the open streams of ``common_name`` opened with a revoked serial (PERMISSION_DENIED,
    reason ``revoked``: logged and counted as every refusal); returns how many."""
    refused = StreamRefused(
        grpc.StatusCode.PERMISSION_DENIED,
        f"the certificate of proxy {common_name} was revoked",
        "revoked",
    )
    ended = runner.end(common_name, refused, lambda stream: stream.serial in serials)
    if ended:
        log.warning("ads.revoked_streams_ended proxy=%s streams=%d", common_name, ended)
    return ended

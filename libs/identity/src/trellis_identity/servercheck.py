"""Clients check the server's SPIFFE id, not only its DNS name.

A component calls another over mTLS (:meth:`~trellis_identity.identity.ComponentIdentity.channel`):
the server must present a certificate of the mesh's trust bundle that names
``<component>.trellis-system.svc`` (``grpc.ssl_target_name_override``), and gRPC's core
checks that on every connection. It cannot check the URI SAN (the SPIFFE id) in the
handshake from Python, for want of any hook:

- ``grpc.ssl_channel_credentials`` takes roots, a key and a chain, nothing else: the only
  check of who the server is, is the target name the core matches against DNS and IP SANs;
- the core's own hooks (``grpc_tls_credentials_options_set_certificate_verifier``, in C++
  ``experimental::TlsChannelCredentialsOptions``) are not exposed by grpcio;
- a client call has no auth context in Python (``cygrpc.auth_context`` takes a server-side
  call only), and what a call-credentials plugin is given (``grpc.AuthMetadataContext``)
  carries ``service_url`` and ``method_name`` only, not the core's ``channel_auth_context``;
- ``grpc.xds_channel_credentials`` matches SANs only for ``xds:///`` targets whose cluster
  an xDS server describes: internal calls would need proxy-cp to reach certmanager.

So the check is made in two layers, neither of which needs a hook in the handshake:

1. **The name is the identity** (certmanager's issuance). A component's DNS names go into
   that component's certificate only: certmanager issues no service, proxy or workload
   certificate in the control plane's namespace, and a component's certificate names its own
   component only (``localhost`` and the loopback addresses: proxy-cp's alone, for local
   proxyless clients). Under the mesh CA, a certificate naming ``certmanager.trellis-system.svc``
   is one certmanager issued to certmanager: gRPC's name check, made on every connection,
   stands for a check of the SPIFFE id.
2. **The served certificate, read** (:class:`ServerCheck`). Before the first call on a
   channel, and before any call made while the channel is not connected (gRPC is about to
   open a connection), the client opens a TLS connection of its own to the same address,
   with the same roots, name and client certificate, reads the certificate served, and
   requires its URI SAN to be the expected component's SPIFFE id
   (``spiffe://<td>/ns/trellis-system/sa/<component>``). This catches what the first layer
   cannot: a certificate of another CA in the trust bundle (an operator's root that signs
   for more than this mesh) that names a component.

A refusal fails the call with ``UNAVAILABLE`` (a locator then looks the owner up again), is
logged (``grpc.server_refused component=... address=... reason=... presented=...``) and
counted in ``trellis_grpc_server_refusals_total{component, reason}``: ``wrong_identity``
(another SPIFFE id), ``no_spiffe_id``, ``unverified`` (not of the trust bundle, or not naming
the component). A server that cannot be reached is no refusal: the call fails as gRPC
would have failed it.

What the second layer does not do: its connection is not gRPC's. A server swapped between
the check and gRPC's own connection (the time it takes gRPC to connect, on a channel that
was not connected) meets the first layer only.

:func:`verify_server` is the same check for a blocking client (the CLI and the pod agent
dialing proxy-cp).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

import grpc
from cryptography import x509
from prometheus_client import CollectorRegistry, Counter

from trellis_common import components
from trellis_identity import tls

log = logging.getLogger(__name__)

#: Seconds a check stands for a channel that is not connected yet (calls made while gRPC
#: connects after the check do not each check again).
FRESH = 5.0
#: Seconds the check's own connection and handshake may take.
TIMEOUT = 5.0
_READY = grpc.ChannelConnectivity.READY


class ServerRefused(Exception):
    """The server is not the one the client meant; ``reason`` is the counted label."""

    def __init__(self, reason: str, message: str, presented: str = "-") -> None:
        super().__init__(message)
        self.reason = reason
        self.presented = presented


class Unreachable(Exception):
    """No TLS connection to the server (nobody there, or it refused this client)."""


def spiffe_ids(certificate: x509.Certificate) -> list[str]:
    """The certificate's URI SANs that are SPIFFE ids."""
    try:
        sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    uris = sans.value.get_values_for_type(x509.UniformResourceIdentifier)
    return [u for u in uris if u.startswith("spiffe://")]


def check_presented(certificate: x509.Certificate, expected: str) -> None:
    """:class:`ServerRefused` unless the certificate's SPIFFE id is exactly ``expected``
    (one SPIFFE id, as SPIFFE requires of an SVID)."""
    found = spiffe_ids(certificate)
    if not found:
        raise ServerRefused(
            "no_spiffe_id", f"the server's certificate has no SPIFFE id, not {expected}"
        )
    if found != [expected]:
        presented = ",".join(found)
        raise ServerRefused(
            "wrong_identity",
            f"the server presented {presented}, not {expected}",
            presented,
        )


def target(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``, ``dns:///host:port``) -> (host, port)."""
    bare = address.removeprefix("dns:///").removeprefix("ipv4:").removeprefix("ipv6:")
    host, colon, port = bare.rpartition(":")
    if not colon or not port.isdigit() or not host:
        raise ValueError(f"{address!r} is not host:port")
    return host.removeprefix("[").removesuffix("]"), int(port)


def client_context(
    trust_bundle_pem: bytes, cert_chain_pem: bytes | None = None, key_pem: bytes | None = None
) -> ssl.SSLContext:
    """TLS as the gRPC channel makes it: the roots, the server's name checked, HTTP/2 asked
    for, and the client's certificate when it has one (internal servers require it)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(cadata=trust_bundle_pem.decode())
    context.set_alpn_protocols(["h2"])
    if cert_chain_pem is not None and key_pem is not None:
        tls.load_chain(context, cert_chain_pem, key_pem)
    return context


async def served_certificate(
    address: str, server_name: str, context: ssl.SSLContext, timeout: float = TIMEOUT
) -> x509.Certificate:
    """The certificate the server at ``address`` presents for ``server_name``, verified
    against ``context``'s roots and name: :class:`ServerRefused` (``unverified``) if it does
    not verify, :class:`Unreachable` if no handshake completes."""
    host, port = target(address)
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(
                host, port, ssl=context, server_hostname=server_name
            )
    except ssl.SSLCertVerificationError as exc:
        raise ServerRefused(
            "unverified", f"the server's certificate: {exc.verify_message}"
        ) from None
    except (OSError, TimeoutError) as exc:
        raise Unreachable(f"no TLS connection to {address}: {exc!r}") from None
    try:
        tls_object = writer.get_extra_info("ssl_object")
        der = tls_object.getpeercert(binary_form=True) if tls_object is not None else None
    finally:
        writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(1.0):
                await writer.wait_closed()
    if not der:
        raise Unreachable(f"{address} presented no certificate")
    return x509.load_der_x509_certificate(der)


def verify_server(
    address: str,
    server_name: str,
    expected: str,
    trust_bundle_pem: bytes,
    cert_chain_pem: bytes | None = None,
    key_pem: bytes | None = None,
    timeout: float = TIMEOUT,
) -> x509.Certificate:
    """The check, blocking: the certificate the server at ``address`` presents for
    ``server_name`` must verify against ``trust_bundle_pem`` and carry the SPIFFE id
    ``expected``; :class:`ServerRefused` or :class:`Unreachable` otherwise."""
    context = client_context(trust_bundle_pem, cert_chain_pem, key_pem)
    host, port = target(address)
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=server_name) as wrapped,
        ):
            der = wrapped.getpeercert(binary_form=True)
    except ssl.SSLCertVerificationError as exc:
        raise ServerRefused(
            "unverified", f"the server's certificate: {exc.verify_message}"
        ) from None
    except OSError as exc:
        raise Unreachable(f"no TLS connection to {address}: {exc!r}") from None
    if not der:
        raise Unreachable(f"{address} presented no certificate")
    certificate = x509.load_der_x509_certificate(der)
    check_presented(certificate, expected)
    return certificate


class ServerCheck:
    """One component's check of the servers it calls (see the module docstring).

    ``current()`` is the component's certificate, key and trust bundle (a new object after
    each renewal: the TLS context is made again for it)."""

    def __init__(self, trust_domain: str, current: Callable[[], tls.ServedPair]) -> None:
        self.trust_domain = trust_domain
        self._current = current
        self._context: tuple[tls.ServedPair, ssl.SSLContext] | None = None
        self._refusals: Counter | None = None

    def count_in(self, registry: CollectorRegistry) -> None:
        """Count refusals in ``registry`` (the service's); once."""
        if self._refusals is None:
            self._refusals = Counter(
                "trellis_grpc_server_refusals",
                "Servers this component called and refused: their certificate was not the "
                "component's they were called as, by component and reason",
                ["component", "reason"],
                registry=registry,
            )

    def context(self) -> ssl.SSLContext:
        pair = self._current()
        if self._context is None or self._context[0] is not pair:
            made = client_context(pair.trust_bundle_pem, pair.cert_chain_pem, pair.key_pem)
            self._context = (pair, made)
        return self._context[1]

    async def verify(self, address: str, component: str) -> None:
        """The server at ``address`` is ``component``; else an ``UNAVAILABLE``
        :class:`grpc.aio.AioRpcError` (a refusal is logged and counted first)."""
        expected = components.spiffe_id(self.trust_domain, component).uri
        try:
            presented = await served_certificate(
                address, components.server_name(component), self.context()
            )
            check_presented(presented, expected)
        except ServerRefused as exc:
            if self._refusals is not None:
                self._refusals.labels(component, exc.reason).inc()
            log.warning(
                "grpc.server_refused component=%s address=%s reason=%s presented=%s",
                component,
                address,
                exc.reason,
                exc.presented,
            )
            raise _unavailable(f"{component} at {address} refused: {exc}") from None
        except (Unreachable, ValueError) as exc:
            raise _unavailable(f"{component} at {address}: {exc}") from None

    def gate(self, address: str, component: str) -> ChannelGate:
        return ChannelGate(self, address, component)


def _unavailable(details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details
    )


class ChannelGate(
    grpc.aio.UnaryUnaryClientInterceptor,
    grpc.aio.UnaryStreamClientInterceptor,
    grpc.aio.StreamUnaryClientInterceptor,
    grpc.aio.StreamStreamClientInterceptor,
):
    """The interceptor of one channel: every call waits for the server check when the
    channel has not been checked since it was last connected (see the module docstring)."""

    def __init__(self, check: ServerCheck, address: str, component: str) -> None:
        self._check = check
        self.address = address
        self.component = component
        #: set once the channel is made (the interceptor is made before it)
        self.channel: grpc.aio.Channel | None = None
        self._checked_at: float | None = None
        self._connected = False  # the channel was seen connected since the last check
        self._lock = asyncio.Lock()

    def _standing(self) -> bool:
        """The last check stands: the channel is connected (to the server checked, unless
        it was swapped in the moments gRPC took to connect), or is connecting after a check
        made moments ago. A channel seen connected, then not, checks again."""
        if self._checked_at is None:
            return False
        if self._is_ready():
            return True
        return not self._connected and time.monotonic() - self._checked_at < FRESH

    def _is_ready(self) -> bool:
        ready = self.channel is not None and self.channel.get_state() is _READY
        self._connected = self._connected or ready
        return ready

    def _call_done(self, call: object) -> None:
        self._is_ready()  # a call that ended on a connected channel: it connected

    def _called(self, call: Any) -> Any:
        call.add_done_callback(self._call_done)
        return call

    async def checked(self) -> None:
        if self._standing():
            return
        async with self._lock:
            if self._standing():
                return
            await self._check.verify(self.address, self.component)
            self._checked_at = time.monotonic()
            self._connected = False

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        await self.checked()
        return self._called(await continuation(client_call_details, request))

    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        await self.checked()
        return self._called(await continuation(client_call_details, request))

    async def intercept_stream_unary(
        self,
        continuation: Any,
        client_call_details: grpc.aio.ClientCallDetails,
        request_iterator: Any,
    ) -> Any:
        await self.checked()
        return self._called(await continuation(client_call_details, request_iterator))

    async def intercept_stream_stream(
        self,
        continuation: Any,
        client_call_details: grpc.aio.ClientCallDetails,
        request_iterator: Any,
    ) -> Any:
        await self.checked()
        return self._called(await continuation(client_call_details, request_iterator))

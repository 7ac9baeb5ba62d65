"""A component's own identity: its certificate and key, held in memory, renewed in time.

Every service of the control plane serves its internal gRPC API and its admin REST API over
TLS with this identity, and presents it when it calls another service (mTLS). The key is
made in the process (:func:`new_key`) and never leaves it: certmanager signs a CSR. It is
never written in the clear: the admin server's TLS library reads keys from files only, so
it gets the key encrypted under a random passphrase that exists only in memory, in a file
deleted as soon as it is read.

:class:`ComponentIdentity` renews the certificate once ``RENEW_AT`` of its lifetime has
passed (its ``run`` loop, retried with backoff while certmanager is away; the loop shows
as ``identity`` on ``/readyz``). New connections then use the new certificate: the gRPC
server's credentials are dynamic, the admin server's TLS context is reloaded, and callers
registered with :meth:`ComponentIdentity.on_renewed` (the locators) open new channels.

A channel to another component checks that the server is that component: by its DNS name
(gRPC, each connection) and by the SPIFFE id of the certificate it serves
(:mod:`trellis_identity.servercheck`, before calls on a channel not yet connected).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from trellis_common import backoff, components
from trellis_common.defaults import GRPC_OPTIONS
from trellis_identity import servercheck, tls
from trellis_identity.trustctx import client_context as client_context

log = logging.getLogger(__name__)

#: Renew once this share of the certificate's lifetime has passed.
RENEW_AT = 2 / 3


@dataclass(frozen=True, slots=True)
class Issued:
    """What certmanager answers to a CSR (no key: the requester has it)."""

    cert_chain_pem: bytes
    trust_bundle_pem: bytes


#: Sends a CSR (PEM) to certmanager, returns what it signed.
Renew = Callable[[bytes], Awaitable[Issued]]


@dataclass(frozen=True, slots=True)
class Material:
    cert_chain_pem: bytes
    key_pem: bytes = field(repr=False)
    trust_bundle_pem: bytes
    leaf: x509.Certificate = field(repr=False)

    @classmethod
    def of(cls, issued: Issued, key_pem: bytes) -> Material:
        return cls(
            issued.cert_chain_pem,
            key_pem,
            issued.trust_bundle_pem,
            x509.load_pem_x509_certificate(issued.cert_chain_pem),
        )

    @property
    def spiffe_id(self) -> str:
        try:
            sans = self.leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        except x509.ExtensionNotFound:
            return ""
        uris = sans.value.get_values_for_type(x509.UniformResourceIdentifier)
        return uris[0] if uris else ""

    @property
    def renew_at(self) -> dt.datetime:
        start, end = self.leaf.not_valid_before_utc, self.leaf.not_valid_after_utc
        return start + (end - start) * RENEW_AT


def new_key() -> tuple[bytes, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return pem, key


def csr_for(key: ec.EllipticCurvePrivateKey, common_name: str) -> bytes:
    """A CSR for ``key``; certmanager takes only its public key (and checks its signature)."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    request = x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, hashes.SHA256())
    return request.public_bytes(serialization.Encoding.PEM)


class ComponentIdentity:
    """The certificate a component serves and calls with, and its renewal."""

    def __init__(self, component: str, material: Material, renew: Renew) -> None:
        self.component = components.checked(component)
        self._renew = renew
        self._material = material
        self.generation = 1
        self._listeners: list[Callable[[], None]] = []
        self._server_contexts: list[ssl.SSLContext] = []
        self.trust_domain = material.spiffe_id.removeprefix("spiffe://").split("/", 1)[0]
        #: checks that a server called is the component it was called as
        self.server_check = servercheck.ServerCheck(self.trust_domain, lambda: self._material)

    @property
    def material(self) -> Material:
        return self._material

    @property
    def trust_bundle_pem(self) -> bytes:
        return self._material.trust_bundle_pem

    def on_renewed(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    # -- gRPC ------------------------------------------------------------------------

    def server_credentials(self, require_client_auth: bool = True) -> grpc.ServerCredentials:
        """Credentials for one port (call once per port): the certificate presented follows
        renewals (gRPC asks at each new handshake). ``require_client_auth`` (mTLS): the
        client must present a certificate of the mesh CA."""
        return tls.dynamic_server_credentials(
            lambda: self._material, require_client_auth=require_client_auth
        )

    def channel(
        self,
        address: str,
        component: str,
        options: Sequence[tuple[str, int | str]] = GRPC_OPTIONS,
    ) -> grpc.aio.Channel:
        """An mTLS channel to ``component`` at ``address``: the server must present that
        component's certificate, checked by name whatever the address (gRPC, at each
        connection) and by SPIFFE id (:mod:`~trellis_identity.servercheck`, before calls on
        the channel while it is not connected)."""
        m = self._material
        credentials = grpc.ssl_channel_credentials(
            root_certificates=m.trust_bundle_pem,
            private_key=m.key_pem,
            certificate_chain=m.cert_chain_pem,
        )
        # A component's certificate names its trust domain; one without (a test's
        # impostor: a proxy's certificate) has no SPIFFE id to expect of a server.
        gate = self.server_check.gate(address, component) if self.trust_domain else None
        channel = grpc.aio.secure_channel(
            address,
            credentials,
            options=[
                *options,
                ("grpc.ssl_target_name_override", components.server_name(component)),
            ],
            interceptors=[gate] if gate is not None else None,
        )
        if gate is not None:
            gate.channel = channel
        return channel

    # -- the admin REST API ------------------------------------------------------------

    def server_ssl_context(self) -> ssl.SSLContext:
        """TLS for the admin server (no client certificate: operators use the admin token)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        tls.load_chain(context, self._material.cert_chain_pem, self._material.key_pem)
        self._server_contexts.append(context)
        return context

    def client_ssl_context(self) -> ssl.SSLContext:
        """Verifies a component's server certificate against the mesh's trust bundle."""
        return client_context(self._material.trust_bundle_pem)

    # -- renewal -----------------------------------------------------------------------

    async def renew(self) -> None:
        key_pem, key = new_key()
        issued = await self._renew(csr_for(key, self.component))
        material = Material.of(issued, key_pem)
        if material.leaf.public_key() != key.public_key():
            raise ValueError("renewal returned a certificate for another key than the CSR's")
        if material.spiffe_id != self._material.spiffe_id:
            raise ValueError(
                f"renewal returned {material.spiffe_id!r}, not {self._material.spiffe_id!r}"
            )
        self._material = material
        self.generation += 1
        for context in self._server_contexts:
            tls.load_chain(context, material.cert_chain_pem, material.key_pem)
        for listener in self._listeners:
            listener()
        log.info(
            "identity.renewed component=%s serial=%x not_after=%s",
            self.component,
            material.leaf.serial_number,
            material.leaf.not_valid_after_utc.isoformat(),
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Renew at each renewal point until ``stop``; a failed renewal is retried with
        backoff (and fails the loop, so the supervisor reports it) until it succeeds."""
        while not stop.is_set():
            wait = (self._material.renew_at - dt.datetime.now(dt.UTC)).total_seconds()
            if wait > 0:
                await backoff.wait_or_stop(stop, wait)
                if stop.is_set():
                    return
            await self.renew()

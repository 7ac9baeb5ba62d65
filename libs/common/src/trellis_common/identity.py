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
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import secrets
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from trellis_common import backoff, components
from trellis_common.grpcserver import DEFAULT_OPTIONS

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
        self._served = 0  # the generation the gRPC server's credentials carry
        self.trust_domain = material.spiffe_id.removeprefix("spiffe://").split("/", 1)[0]

    @property
    def material(self) -> Material:
        return self._material

    @property
    def trust_bundle_pem(self) -> bytes:
        return self._material.trust_bundle_pem

    def on_renewed(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    # -- gRPC ------------------------------------------------------------------------

    def _server_config(self) -> grpc.ServerCertificateConfiguration:
        m = self._material
        return grpc.ssl_server_certificate_configuration(
            [(m.key_pem, m.cert_chain_pem)], root_certificates=m.trust_bundle_pem
        )

    def server_credentials(self) -> grpc.ServerCredentials:
        """mTLS: the client must present a certificate of the mesh CA; the certificate the
        server presents follows renewals (fetched at each new handshake)."""

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            if self._served == self.generation:
                return None
            self._served = self.generation
            return self._server_config()

        self._served = self.generation
        return grpc.dynamic_ssl_server_credentials(
            self._server_config(),
            fetch,  # type: ignore[arg-type]  # None (no change) is what grpc expects too
            require_client_authentication=True,
        )

    def channel(
        self,
        address: str,
        component: str,
        options: Sequence[tuple[str, int | str]] = DEFAULT_OPTIONS,
    ) -> grpc.aio.Channel:
        """An mTLS channel to ``component`` at ``address``: the server must present that
        component's certificate (checked by name, whatever the address)."""
        m = self._material
        credentials = grpc.ssl_channel_credentials(
            root_certificates=m.trust_bundle_pem,
            private_key=m.key_pem,
            certificate_chain=m.cert_chain_pem,
        )
        return grpc.aio.secure_channel(
            address,
            credentials,
            options=[
                *options,
                ("grpc.ssl_target_name_override", components.server_name(component)),
            ],
        )

    # -- the admin REST API ------------------------------------------------------------

    def server_ssl_context(self) -> ssl.SSLContext:
        """TLS for the admin server (no client certificate: operators use the admin token)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        _load_chain(context, self._material)
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
            _load_chain(context, material)
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


def client_context(trust_bundle_pem: bytes) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=trust_bundle_pem.decode())
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _load_chain(context: ssl.SSLContext, material: Material) -> None:
    """``load_cert_chain`` reads files only: hand it the key encrypted under a passphrase
    that never leaves memory, in a private file removed at once."""
    passphrase = secrets.token_bytes(32)
    key = serialization.load_pem_private_key(material.key_pem, password=None)
    sealed = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(passphrase),
    )
    with tempfile.TemporaryDirectory(prefix="trellis-tls-") as folder:
        base = Path(folder)
        os.chmod(base, 0o700)
        chain, sealed_key = base / "chain.pem", base / "key.pem"
        chain.write_bytes(material.cert_chain_pem)
        fd = os.open(sealed_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(sealed)
        context.load_cert_chain(chain, sealed_key, password=passphrase)

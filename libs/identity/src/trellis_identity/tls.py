"""Credentials for TLS and mTLS, from PEM bytes held in memory.

gRPC servers and channels take PEM bytes (:func:`server_credentials`,
:func:`channel_credentials`); a server whose certificate is renewed while it runs takes
:func:`dynamic_server_credentials`, which gRPC asks at each new handshake. Python's ``ssl``
reads keys from files only: :func:`load_chain` hands it the key encrypted under a
passphrase that never leaves memory, in a private file removed at once.
"""

from __future__ import annotations

import functools
import os
import secrets
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization


class ServedPair(Protocol):
    """A certificate chain, its key, and the roots a server checks its clients against."""

    @property
    def cert_chain_pem(self) -> bytes: ...

    @property
    def key_pem(self) -> bytes: ...

    @property
    def trust_bundle_pem(self) -> bytes: ...


def server_credentials(
    cert_chain_pem: bytes, key_pem: bytes, client_ca_pem: bytes | None, *, require_client_auth: bool
) -> grpc.ServerCredentials:
    """TLS server credentials; with ``require_client_auth`` the peer must chain to the CA."""
    if require_client_auth and not client_ca_pem:
        raise ValueError("require_client_auth needs client_ca_pem")
    return grpc.ssl_server_credentials(
        [(key_pem, cert_chain_pem)],
        root_certificates=client_ca_pem,
        require_client_auth=require_client_auth,
    )


def dynamic_server_credentials(
    current: Callable[[], ServedPair], *, require_client_auth: bool
) -> grpc.ServerCredentials:
    """Credentials for one port that follow ``current()`` (a new object is a renewal): gRPC
    asks at each new handshake and gets a new configuration once per new object, so the
    next connection presents the new certificate, with no restart. Each port needs its own
    (one port's question must not hide a renewal from another). With
    ``require_client_auth`` a client must present a certificate of ``trust_bundle_pem``."""

    def configuration(pair: ServedPair) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(pair.key_pem, pair.cert_chain_pem)],
            root_certificates=pair.trust_bundle_pem if require_client_auth else None,
        )

    served = current()

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        nonlocal served
        now = current()
        if now is served:
            return None
        served = now
        return configuration(now)

    return grpc.dynamic_ssl_server_credentials(
        configuration(served),
        fetch,  # type: ignore[arg-type]  # gRPC documents None as "no change"
        require_client_authentication=require_client_auth,
    )


def channel_credentials(
    ca_pem: bytes, cert_chain_pem: bytes | None = None, key_pem: bytes | None = None
) -> grpc.ChannelCredentials:
    """TLS channel credentials; with a certificate and key the client authenticates too."""
    if (cert_chain_pem is None) != (key_pem is None):
        raise ValueError("client certificate and key go together")
    return grpc.ssl_channel_credentials(
        root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_chain_pem
    )


def load_chain(context: ssl.SSLContext, cert_chain_pem: bytes, key_pem: bytes) -> None:
    """``load_cert_chain`` reads files only: hand it the key encrypted under a passphrase
    that never leaves memory, in a private file removed at once."""
    passphrase = secrets.token_bytes(32)
    key = serialization.load_pem_private_key(key_pem, password=None)
    sealed = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(passphrase),
    )
    with tempfile.TemporaryDirectory(prefix="trellis-tls-") as folder:
        base = Path(folder)
        os.chmod(base, 0o700)
        chain, sealed_key = base / "chain.pem", base / "key.pem"
        chain.write_bytes(cert_chain_pem)
        fd = os.open(sealed_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(sealed)
        context.load_cert_chain(chain, sealed_key, password=passphrase)


@functools.lru_cache(maxsize=256)
def serial_of(cert_pem: bytes) -> str:
    """The serial of a PEM certificate, lowercase hex (each peer's is parsed once)."""
    return f"{x509.load_pem_x509_certificate(cert_pem).serial_number:x}"

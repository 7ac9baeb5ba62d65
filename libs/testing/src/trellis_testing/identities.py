"""Tests that call an internal gRPC API do it as a component, with a real identity.

:func:`join_as` does what a component does at start: mints a join token with the mesh's
join key (from the state directory), makes a key and a CSR, and trades them with the
running certmanager for the component's certificate. The test then calls with
``identity.channel(address, component)``, and the server's policy judges it as that
component; a test of the policy joins as the wrong one on purpose.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from trellis_common import components, statefile
from trellis_identity import authz, jointoken
from trellis_identity.identity import ComponentIdentity, Issued, Material, csr_for, new_key
from trellis_runtime import adminhttp


def allowed_caller(method: str, request: Any = None) -> str:
    """A component the policy lets call ``method`` with ``request`` (tests that are not
    about the policy call as whoever may)."""
    cell = authz.cell(method, request)
    allowed = sorted(authz.POLICY.get(cell, ()))
    if not allowed:
        raise ValueError(f"no component may call {cell}")
    return allowed[0]


async def _no_renewal(csr_pem: bytes) -> Issued:
    raise RuntimeError("a test identity is not renewed")


def join_as(state_dir: Path, component: str) -> ComponentIdentity:
    """The certificate of ``component``, from the certmanager running on ``state_dir``."""
    endpoint = statefile.read_endpoint(state_dir, "certmanager")
    if endpoint is None:
        raise RuntimeError(f"no certmanager has announced itself in {state_dir}")
    token = jointoken.mint(jointoken.load_or_create_key(jointoken.key_path(state_dir)), component)
    key_pem, key = new_key()
    answer = adminhttp.request(
        state_dir,
        "certmanager",
        "POST",
        endpoint.admin_url + "/v1/join",
        json={"token": token, "csr_pem": csr_for(key, component).decode()},
    )
    answer.raise_for_status()
    body = answer.json()
    issued = Issued(body["cert_chain_pem"].encode(), body["trust_bundle_pem"].encode())
    return ComponentIdentity(component, Material.of(issued, key_pem), _no_renewal)


class LocalCA:
    """A throwaway CA made here, for tests of one process that need TLS but no
    certmanager: component identities, and the certificates an attacker would bring (a
    proxy's, an expired one)."""

    def __init__(self, trust_domain: str = "cluster.local") -> None:
        self.trust_domain = trust_domain
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    @property
    def bundle_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        common_name: str,
        sans: Sequence[x509.GeneralName],
        *,
        expired: bool = False,
    ) -> Material:
        """A leaf of this CA for a key made here (``expired``: it ended an hour ago)."""
        key_pem, key = new_key()
        leaf = self._leaf(common_name, sans, key.public_key(), expired)
        issued = Issued(leaf.public_bytes(serialization.Encoding.PEM), self.bundle_pem)
        return Material.of(issued, key_pem)

    def sign_csr(self, component: str, csr_pem: bytes) -> Issued:
        """What certmanager answers a component's renewal with."""
        key = x509.load_pem_x509_csr(csr_pem).public_key()
        assert isinstance(key, ec.EllipticCurvePublicKey)
        leaf = self._leaf(component, self._sans(component), key, expired=False)
        return Issued(leaf.public_bytes(serialization.Encoding.PEM), self.bundle_pem)

    def _sans(self, component: str) -> list[x509.GeneralName]:
        uri = components.spiffe_id(self.trust_domain, component).uri
        names: list[x509.GeneralName] = [
            x509.DNSName(n) for n in components.dns_names(component, "cluster.local")
        ]
        if component == components.PROXY_CP:  # as certmanager's proxy_cp_extra_sans
            names += [
                x509.DNSName("localhost"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("::1")),
            ]
        return [*names, x509.UniformResourceIdentifier(uri)]

    def _leaf(
        self,
        common_name: str,
        sans: Sequence[x509.GeneralName],
        public_key: ec.EllipticCurvePublicKey,
        expired: bool,
    ) -> x509.Certificate:
        now = dt.datetime.now(dt.UTC)
        start, end = (
            (now - dt.timedelta(hours=2), now - dt.timedelta(hours=1))
            if expired
            else (now - dt.timedelta(minutes=1), now + dt.timedelta(hours=1))
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        return builder.sign(self.key, hashes.SHA256())

    def identity(self, component: str, *, expired: bool = False) -> ComponentIdentity:
        material = self.issue(component, self._sans(component), expired=expired)
        return ComponentIdentity(component, material, _no_renewal)


def local_identity(component: str) -> ComponentIdentity:
    """A component identity of a CA of its own (one process, no peers to trust it)."""
    return LocalCA().identity(component)

"""SDS secrets: the identity's certificate and key, and the mesh trust bundle.

Only the identity's own material goes in: a snapshot is per identity, so a proxy can never
be sent another service's key. A pod's proxy (its agent keeps its own workload certificate
and key in ``workload_dir``) is sent no key at all: its ``service-cert`` names those files,
and Envoy reads them there, again whenever the agent swaps the folder's ``..data`` link.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2

from trellis_common.bootstrap import KEY_FILE, WORKLOAD_CERT_FILE
from trellis_proxy_cp.translate import names


@dataclass(frozen=True, slots=True)
class SecretMaterial:
    cert_chain_pem: bytes
    key_pem: bytes = field(repr=False)
    trust_bundle_pem: bytes
    serial: str = ""


def _own_files(folder: str) -> common_pb2.TlsCertificate:
    return common_pb2.TlsCertificate(
        certificate_chain=base_pb2.DataSource(filename=f"{folder}/{WORKLOAD_CERT_FILE}"),
        private_key=base_pb2.DataSource(filename=f"{folder}/{KEY_FILE}"),
        watched_directory=base_pb2.WatchedDirectory(path=folder),
    )


def secrets(material: SecretMaterial, workload_dir: str = "") -> list[secret_pb2.Secret]:
    return [
        secret_pb2.Secret(
            name=names.SERVICE_CERT,
            tls_certificate=_own_files(workload_dir)
            if workload_dir
            else common_pb2.TlsCertificate(
                certificate_chain=base_pb2.DataSource(inline_bytes=material.cert_chain_pem),
                private_key=base_pb2.DataSource(inline_bytes=material.key_pem),
            ),
        ),
        secret_pb2.Secret(
            name=names.MESH_CA,
            validation_context=common_pb2.CertificateValidationContext(
                trusted_ca=base_pb2.DataSource(inline_bytes=material.trust_bundle_pem)
            ),
        ),
    ]

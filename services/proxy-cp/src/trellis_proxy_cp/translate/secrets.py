"""SDS secrets: where the proxy's own certificate and key are, and the mesh trust bundle.

No key is ever sent. Every proxy has its own workload certificate, for the key its host
made (a pod's agent, ``trellis vm bootstrap``, ``trellis proxy renew``), in the folder its
bootstrap names as ``workload_dir``: ``service-cert`` names those files, and Envoy reads
them there, again whenever the folder's ``..data`` link is swapped. A proxyless workload's
gRPC reads its own files through its bootstrap's certificate provider, and a proxy whose
bootstrap names no folder (one made before proxies had their own certificates) gets no
``service-cert`` at all: its service's shared key never leaves certmanager. Only the trust
bundle travels inline.
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
    mesh_ca = secret_pb2.Secret(
        name=names.MESH_CA,
        validation_context=common_pb2.CertificateValidationContext(
            trusted_ca=base_pb2.DataSource(inline_bytes=material.trust_bundle_pem)
        ),
    )
    if not workload_dir:
        return [mesh_ca]
    return [
        secret_pb2.Secret(name=names.SERVICE_CERT, tls_certificate=_own_files(workload_dir)),
        mesh_ca,
    ]

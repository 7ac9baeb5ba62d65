"""SDS secrets: where the proxy's own certificate and key are, and the mesh trust bundle.

No key is ever sent. Every proxy has its own workload certificate, for the key its host
made (a pod's agent, ``trellis vm bootstrap``, ``trellis proxy renew``), in the folder its
bootstrap names as ``workload_dir``: ``service-cert`` names those files, and Envoy reads
them there, again whenever the folder's ``..data`` link is swapped. A proxyless workload's
gRPC reads its own files through its bootstrap's certificate provider, and a proxy whose
bootstrap names no folder (one made before proxies had their own certificates) gets no
``service-cert`` at all: its service's shared key never leaves certmanager. Only the trust
bundle travels inline.

A Gateway's Envoy serves the certificates of its HTTPS listeners the same way: each
Secret a listener names (``certificateRefs``) is a folder of the bootstrap's
``gateway_certs_dir``, ``<dir>/<namespace>/<name>/tls.crt`` and ``tls.key``, as a Kubernetes
Secret volume lays it out, and ``gateway-cert/<namespace>/<name>`` names those files; Envoy
reads them, again when the volume's ``..data`` link is swapped. Those keys never pass
through the control plane either.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2

from trellis_common.bootstrap import KEY_FILE, WORKLOAD_CERT_FILE
from trellis_proxy_cp.translate import names

GATEWAY_CERT_FILE = "tls.crt"  # a kubernetes.io/tls Secret's keys
GATEWAY_KEY_FILE = "tls.key"
# a Kubernetes object name (a DNS subdomain): a plain folder name, never "." or ".."
_OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


@dataclass(frozen=True, slots=True)
class SecretMaterial:
    cert_chain_pem: bytes
    key_pem: bytes = field(repr=False)
    trust_bundle_pem: bytes
    serial: str = ""


def _own_files(
    folder: str, cert: str = WORKLOAD_CERT_FILE, key: str = KEY_FILE
) -> common_pb2.TlsCertificate:
    return common_pb2.TlsCertificate(
        certificate_chain=base_pb2.DataSource(filename=f"{folder}/{cert}"),
        private_key=base_pb2.DataSource(filename=f"{folder}/{key}"),
        watched_directory=base_pb2.WatchedDirectory(path=folder),
    )


def servable(namespace: str, name: str) -> bool:
    """A certificate reference that names a folder under ``gateway_certs_dir``: Kubernetes
    object names, so no reference reaches outside it."""
    return all(_OBJECT_NAME.fullmatch(part) for part in (namespace, name))


def gateway_certificates(
    refs: Iterable[tuple[str, str]], certs_dir: str
) -> list[secret_pb2.Secret]:
    """A ``gateway-cert/<namespace>/<name>`` secret per distinct reference that is
    :func:`servable` (the listeners leave the others out): the files of that Secret's folder."""
    found = []
    for namespace, name in dict.fromkeys(refs):
        if not servable(namespace, name):
            continue
        folder = f"{certs_dir}/{namespace}/{name}"
        found.append(
            secret_pb2.Secret(
                name=names.gateway_cert(namespace, name),
                tls_certificate=_own_files(folder, GATEWAY_CERT_FILE, GATEWAY_KEY_FILE),
            )
        )
    return found


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

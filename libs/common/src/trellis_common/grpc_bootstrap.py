"""The ``GRPC_XDS_BOOTSTRAP`` file of a proxyless gRPC workload, and its folder's layout.

``trellis grpc bootstrap`` writes one folder (``DIR``); every path in it is absolute:

- ``bootstrap.json``: ``xds_servers`` (proxy-cp, ``tls`` channel credentials with the proxy
  certificate: mTLS, as a sidecar has), ``node`` (id: the proxy certificate's common name;
  metadata ``trellis.proxyless``, which proxy-cp translates for), and
  ``certificate_providers`` whose ``file_watcher`` names the workload's files below.
- ``proxy-cert.pem``, ``proxy-key.pem`` (0600): the proxy certificate, for the xDS channel
  only; its key was made on this host.
- ``cert.pem``, ``key.pem`` (0600), ``ca.pem``: the workload's data-plane certificate (the
  SPIFFE id of its service account), its key and the mesh CA. gRPC's xDS credentials use
  them for calls to other workloads; a plain gRPC server serves mTLS with them;
  ``trellis grpc agent`` replaces them as they rotate (gRPC re-reads them every
  :data:`REFRESH_INTERVAL`).

gRPC's TLS channel credentials check proxy-cp's host name, with no override: the
``server_uri`` host must be a name in the certificate proxy-cp serves, its component
certificate (``proxy-cp``, ``proxy-cp.trellis-system``, ``...svc``, ``...svc.<cluster
domain>``, and certmanager's ``proxy_cp_extra_sans``). A loopback address is written as
``localhost``, which of all component certificates proxy-cp's alone carries.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

BOOTSTRAP_FILE: Final = "bootstrap.json"
PROXY_CERT_FILE: Final = "proxy-cert.pem"
PROXY_KEY_FILE: Final = "proxy-key.pem"
CERT_FILE: Final = "cert.pem"
KEY_FILE: Final = "key.pem"
CA_FILE: Final = "ca.pem"
#: The ``certificate_providers`` instance proxy-cp's clusters name.
CERTIFICATE_PROVIDER: Final = "trellis"
#: The SDS secrets proxy-cp serves a proxy: its identity's certificate, and the mesh CA.
SERVICE_SECRET: Final = "service-cert"
TRUST_BUNDLE_SECRET: Final = "mesh-trust-bundle"
#: How often gRPC's file_watcher re-reads the workload's files.
REFRESH_INTERVAL: Final = "2s"


@dataclass(frozen=True, slots=True)
class GrpcFolder:
    """The files of one proxyless workload (absolute paths)."""

    folder: Path

    @property
    def bootstrap(self) -> Path:
        return self.folder / BOOTSTRAP_FILE

    @property
    def proxy_cert(self) -> Path:
        return self.folder / PROXY_CERT_FILE

    @property
    def proxy_key(self) -> Path:
        return self.folder / PROXY_KEY_FILE

    @property
    def cert(self) -> Path:
        return self.folder / CERT_FILE

    @property
    def key(self) -> Path:
        return self.folder / KEY_FILE

    @property
    def ca(self) -> Path:
        return self.folder / CA_FILE


def server_host(host: str) -> str:
    """The host to dial proxy-cp by: a loopback address becomes ``localhost``."""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return "localhost"
    except ValueError:
        pass
    return host


def grpc_bootstrap(
    node_id: str, namespace: str, service: str, xds_host: str, xds_port: int, files: GrpcFolder
) -> dict[str, Any]:
    """The bootstrap document (JSON) of a proxyless workload of ``namespace/service``."""
    return {
        "xds_servers": [
            {
                "server_uri": f"{server_host(xds_host)}:{xds_port}",
                "channel_creds": [
                    {
                        "type": "tls",
                        "config": {
                            "ca_certificate_file": str(files.ca),
                            "certificate_file": str(files.proxy_cert),
                            "private_key_file": str(files.proxy_key),
                        },
                    }
                ],
                "server_features": ["xds_v3"],
            }
        ],
        "node": {
            "id": node_id,
            "cluster": f"{namespace}/{service}",
            "metadata": {"trellis": {"proxyless": True}},
            "locality": {},
        },
        "certificate_providers": {
            CERTIFICATE_PROVIDER: {
                "plugin_name": "file_watcher",
                "config": {
                    "certificate_file": str(files.cert),
                    "private_key_file": str(files.key),
                    "ca_certificate_file": str(files.ca),
                    "refresh_interval": REFRESH_INTERVAL,
                },
            }
        },
    }

"""Envoy bootstraps for mesh proxies: node identity, the ADS cluster, mTLS to proxy-cp.

One pure function used by every onboarding path (``trellis vm bootstrap``, the injector's
Kubernetes webhook, tests). The node id is the proxy certificate's common name, the
metadata carries the per-proxy settings proxy-cp reads, and the ADS cluster verifies
proxy-cp's certificate by its SPIFFE id, not by host name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

#: Envoy's ``--drain-time-s`` for a mesh sidecar. A TCP policy change replaces the inbound
#: filter chain: new connections get the new rules at once, and connections opened under
#: the old chain are closed when this drain ends (Envoy's default is 600 s, far too long
#: for a revoked permission). HTTP rules live in the routes and apply on the next request.
SIDECAR_DRAIN_SECONDS = 5


def sidecar_args() -> list[str]:
    """The Envoy flags every mesh sidecar runs with (after ``-c <bootstrap>``)."""
    return ["--disable-hot-restart", "--drain-time-s", str(SIDECAR_DRAIN_SECONDS)]


@dataclass(frozen=True, slots=True)
class ProxyFiles:
    """Where the proxy certificate, its key and the mesh CA are on the proxy's host."""

    cert_chain: Path
    key: Path
    trust_bundle: Path


@dataclass(frozen=True, slots=True)
class BootstrapSpec:
    node_id: str  # the proxy certificate's CN: <proxy-uuid>.<service>.<namespace>
    namespace: str
    service: str
    files: ProxyFiles
    xds_host: str = "127.0.0.1"
    xds_port: int = 15128
    proxy_cp_spiffe_id: str = "spiffe://cluster.local/ns/trellis-system/sa/proxy-cp"
    outbound_port: int = 15001
    inbound_port: int = 15003
    app_port: int = 0
    admin_port: int = 15000
    admin_address: str = "127.0.0.1"
    protocol: Literal["sotw", "delta"] = "sotw"
    extra_metadata: dict[str, Any] = field(default_factory=dict)


def _file(path: Path) -> dict[str, str]:
    return {"filename": str(path)}


def envoy_bootstrap(spec: BootstrapSpec) -> dict[str, Any]:
    tls = {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/"
            "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {
                "tls_certificates": [
                    {
                        "certificate_chain": _file(spec.files.cert_chain),
                        "private_key": _file(spec.files.key),
                    }
                ],
                "validation_context": {
                    "trusted_ca": _file(spec.files.trust_bundle),
                    "match_typed_subject_alt_names": [
                        {"san_type": "URI", "matcher": {"exact": spec.proxy_cp_spiffe_id}}
                    ],
                },
            },
        },
    }
    ads = {"ads": {}, "resource_api_version": "V3"}
    return {
        "node": {
            "id": spec.node_id,
            "cluster": f"{spec.namespace}/{spec.service}",
            "metadata": {
                "trellis": {
                    "outbound_port": spec.outbound_port,
                    "inbound_port": spec.inbound_port,
                    "app_port": spec.app_port,
                    "admin_port": spec.admin_port,
                },
                **spec.extra_metadata,
            },
        },
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC" if spec.protocol == "delta" else "GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": True,
                "grpc_services": [{"envoy_grpc": {"cluster_name": "trellis-xds"}}],
            },
            "cds_config": ads,
            "lds_config": ads,
        },
        "static_resources": {
            "clusters": [
                {
                    "name": "trellis-xds",
                    "type": "STRICT_DNS",
                    "connect_timeout": "1s",
                    "load_assignment": {
                        "cluster_name": "trellis-xds",
                        "endpoints": [
                            {
                                "lb_endpoints": [
                                    {
                                        "endpoint": {
                                            "address": {
                                                "socket_address": {
                                                    "address": spec.xds_host,
                                                    "port_value": spec.xds_port,
                                                }
                                            }
                                        }
                                    }
                                ]
                            }
                        ],
                    },
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": "type.googleapis.com/"
                            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                            "explicit_http_config": {"http2_protocol_options": {}},
                        }
                    },
                    "transport_socket": tls,
                }
            ]
        },
        "admin": {
            "address": {
                "socket_address": {
                    "address": spec.admin_address,
                    "port_value": spec.admin_port,
                }
            }
        },
    }

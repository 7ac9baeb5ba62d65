"""Envoy bootstraps for mesh proxies: node identity, the ADS cluster, mTLS to proxy-cp.

One pure function used by every onboarding path (``trellis vm bootstrap``, the injector's
Kubernetes webhook, tests). The node id is the proxy certificate's common name, the
metadata carries the per-proxy settings proxy-cp reads, and the ADS cluster verifies
proxy-cp's certificate by its SPIFFE id, not by host name.

Renewal without a restart: when :class:`ProxyFiles` names an ``sds`` file, the ADS cluster
takes its client certificate over file-based SDS (``path_config_source`` with a
``watched_directory``: the proxy's folder). That file (:func:`proxy_secret_document`) names
the certificate and key files; ``trellis proxy renew`` writes a new pair under new names,
then moves a new SDS file into place, and Envoy reloads it on that move: the pair changes
at once, never half. New connections to proxy-cp use it. The cluster allows one request per
connection (ADS is one long stream), so when proxy-cp ends a stream opened with a revoked
certificate, Envoy's next attempt is a new TLS handshake with the current certificate
rather than a retry on the old connection. Without ``sds`` the certificate files are named
directly, as bootstraps made before renewal existed do.
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

#: How soon Envoy retries its ADS stream after proxy-cp went away. Envoy's default is a
#: jittered exponential backoff from 500 ms up to 30 s, with full jitter: a sidecar whose
#: stream broke while proxy-cp restarted (a couple of seconds) could wait half a minute
#: more before it asks again, running on stale configuration all that time. A mesh proxy
#: should be back within seconds; the full jitter over up to 3 s still spreads a reconnect
#: storm, and proxy-cp sheds what it cannot take (the proxy then waits again).
ADS_RETRY_BACK_OFF = {"base_interval": "0.25s", "max_interval": "3s"}


def sidecar_args() -> list[str]:
    """The Envoy flags every mesh sidecar runs with (after ``-c <bootstrap>``)."""
    return ["--disable-hot-restart", "--drain-time-s", str(SIDECAR_DRAIN_SECONDS)]


#: The SDS secret of the proxy's own certificate (its name in the SDS file).
PROXY_SECRET = "trellis-proxy-certificate"
#: The SDS file's name in the proxy's folder.
SDS_FILE = "proxy-sds.yaml"
#: In a pod agent's folder: the key it made (one for both certificates), the proxy
#: certificate (xDS client), the workload certificate (mesh mTLS) and the mesh CA.
KEY_FILE = "key.pem"
PROXY_CERT_FILE = "cert.pem"
WORKLOAD_CERT_FILE = "workload.pem"
CA_FILE = "ca.pem"
_SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"


@dataclass(frozen=True, slots=True)
class ProxyFiles:
    """Where the proxy certificate, its key and the mesh CA are on the proxy's host, and
    the SDS file naming the certificate and key in use (None: the bootstrap names them)."""

    cert_chain: Path
    key: Path
    trust_bundle: Path
    sds: Path | None = None


def proxy_secret_document(cert_chain: Path, key: Path) -> dict[str, Any]:
    """The SDS file's content: the proxy's certificate and key, by file name."""
    return {
        "resources": [
            {
                "@type": _SECRET_TYPE,
                "name": PROXY_SECRET,
                "tls_certificate": {
                    "certificate_chain": _file(cert_chain),
                    "private_key": _file(key),
                },
            }
        ]
    }


def _client_certificate(files: ProxyFiles) -> dict[str, Any]:
    if files.sds is None:
        pair = {"certificate_chain": _file(files.cert_chain), "private_key": _file(files.key)}
        return {"tls_certificates": [pair]}
    source = {
        "path_config_source": {
            "path": str(files.sds),
            "watched_directory": {"path": str(files.sds.parent)},
        },
        "resource_api_version": "V3",
    }
    return {"tls_certificate_sds_secret_configs": [{"name": PROXY_SECRET, "sds_config": source}]}


@dataclass(frozen=True, slots=True)
class ProbeRoute:
    """A kubelet HTTP probe rewritten to reach the application through the sidecar: the
    kubelet asks ``<pod>:<listener_port><path>`` in plaintext, and Envoy forwards it to
    ``127.0.0.1:<target_port><target_path>`` (as OSM does on 15901-15903), so an HTTP probe
    works on a port whose inbound traffic is mTLS only."""

    listener_port: int
    path: str
    target_port: int
    target_path: str


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
    # Envoy's statistics in Prometheus' format on <stats_address>:<stats_port>/stats/prometheus
    # (nothing else of the admin API); 0: not served.
    stats_port: int = 0
    stats_address: str = "0.0.0.0"
    # The pod redirects its traffic to Envoy (an injected pod): proxy-cp's listeners go by
    # original destination instead of by ports the application dials.
    capture: bool = False
    # Kubelet probes rewritten to Envoy's probe listeners (an injected pod).
    probes: tuple[ProbeRoute, ...] = ()
    # The folder where the pod's agent keeps the proxy's own workload certificate and key
    # (WORKLOAD_CERT_FILE, KEY_FILE): proxy-cp then has Envoy read them there, and never
    # sends a key. "": the identity's certificate and key come over SDS (VMs, local mesh).
    workload_dir: str = ""
    # Where the proxy runs, region[/zone[/subzone]] ("": not said): Envoy's node.locality,
    # which proxy-cp reads to give it its own locality's endpoints first (locality failover).
    locality: str = ""


def node_locality(text: str) -> dict[str, str]:
    """Envoy's ``node.locality`` for ``region[/zone[/subzone]]``. Raises ``ValueError``
    saying what is wrong: an empty part, or more than three."""
    found = text.split("/")
    if not all(found) or len(found) > 3:
        raise ValueError(f"locality {text!r} must be region[/zone[/subzone]], no part empty")
    return dict(zip(("region", "zone", "sub_zone"), found, strict=False))


def _file(path: Path) -> dict[str, str]:
    return {"filename": str(path)}


STATS_PATH = "/stats/prometheus"
#: Every connection manager's paths as its routes should see them (proxy-cp's
#: ``translate.common.normalized`` says why).
NORMALIZED_PATHS = {
    "normalize_path": True,
    "merge_slashes": True,
    "path_with_escaped_slashes_action": "REJECT_REQUEST",
}
STATS_LISTENER = "trellis-prometheus"
ADMIN_CLUSTER = "trellis-admin"


def _socket(address: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": address, "port_value": port}}


def stats_listener(spec: BootstrapSpec) -> dict[str, Any]:
    """A listener that serves the admin API's ``/stats/prometheus`` and nothing else (the
    admin API itself stays on loopback: it can change and dump the proxy), as OSM's
    sidecars do on 15010."""
    routes = {
        "virtual_hosts": [
            {
                "name": "prometheus",
                "domains": ["*"],
                "routes": [
                    {
                        "match": {"path": STATS_PATH},
                        "route": {"cluster": ADMIN_CLUSTER, "prefix_rewrite": STATS_PATH},
                    },
                    {"match": {"prefix": "/"}, "direct_response": {"status": 404}},
                ],
            }
        ]
    }
    manager = {
        "@type": "type.googleapis.com/"
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "prometheus",
        **NORMALIZED_PATHS,
        "route_config": routes,
        "http_filters": [
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            }
        ],
    }
    return {
        "name": STATS_LISTENER,
        "address": _socket(spec.stats_address, spec.stats_port),
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager",
                          "typed_config": manager}]}
        ],
    }  # fmt: skip


def admin_cluster(spec: BootstrapSpec) -> dict[str, Any]:
    return {
        "name": ADMIN_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": ADMIN_CLUSTER,
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _socket(spec.admin_address,
                                                                      spec.admin_port)}}]}
            ],
        },
    }  # fmt: skip


def _router() -> dict[str, Any]:
    return {
        "name": "envoy.filters.http.router",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
        },
    }


def probe_cluster(port: int) -> str:
    return f"trellis-probe|{port}"


def probe_listeners(spec: BootstrapSpec) -> list[dict[str, Any]]:
    """One plaintext listener per probe port, routing each rewritten probe path to the
    application's own port and path; anything else is 404."""
    found = []
    for port in sorted({p.listener_port for p in spec.probes}):
        routes: list[dict[str, Any]] = [
            {
                "match": {"path": probe.path},
                "route": {
                    "cluster": probe_cluster(probe.target_port),
                    "prefix_rewrite": probe.target_path,
                },
            }
            for probe in spec.probes
            if probe.listener_port == port
        ]
        routes.append({"match": {"prefix": "/"}, "direct_response": {"status": 404}})
        manager = {
            "@type": "type.googleapis.com/"
            "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": f"probe_{port}",
            **NORMALIZED_PATHS,
            "route_config": {
                "virtual_hosts": [{"name": "probes", "domains": ["*"], "routes": routes}]
            },
            "http_filters": [_router()],
        }
        found.append(
            {
                "name": f"trellis-probe-{port}",
                "address": _socket("0.0.0.0", port),
                "filter_chains": [
                    {"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                  "typed_config": manager}]}
                ],
            }
        )  # fmt: skip
    return found


def probe_clusters(spec: BootstrapSpec) -> list[dict[str, Any]]:
    return [
        {
            "name": probe_cluster(port),
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": {
                "cluster_name": probe_cluster(port),
                "endpoints": [
                    {"lb_endpoints": [{"endpoint": {"address": _socket("127.0.0.1", port)}}]}
                ],
            },
        }
        for port in sorted({p.target_port for p in spec.probes})
    ]


#: The bootstrap's static cluster of proxy-cp's xDS port.
XDS_CLUSTER = "trellis-xds"


def xds_server_identity(bootstrap: dict[str, Any]) -> str:
    """The SPIFFE id a bootstrap of :func:`envoy_bootstrap` accepts proxy-cp by (what the
    agent and ``trellis proxy renew`` check proxy-cp for too); ``KeyError``, ``IndexError``,
    ``TypeError`` or ``StopIteration`` if it is not such a bootstrap."""
    cluster = next(c for c in bootstrap["static_resources"]["clusters"] if c["name"] == XDS_CLUSTER)
    tls = cluster["transport_socket"]["typed_config"]["common_tls_context"]
    matched: str = tls["validation_context"]["match_typed_subject_alt_names"][0]["matcher"]["exact"]
    return matched


def envoy_bootstrap(spec: BootstrapSpec) -> dict[str, Any]:
    tls = {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/"
            "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {
                **_client_certificate(spec.files),
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
    listeners = [*([stats_listener(spec)] if spec.stats_port else []), *probe_listeners(spec)]
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
                    **({"stats_port": spec.stats_port} if spec.stats_port else {}),
                    **({"capture": True} if spec.capture else {}),
                    **({"workload_dir": spec.workload_dir} if spec.workload_dir else {}),
                },
                **spec.extra_metadata,
            },
            **({"locality": node_locality(spec.locality)} if spec.locality else {}),
        },
        "dynamic_resources": {
            "ads_config": {
                "api_type": "DELTA_GRPC" if spec.protocol == "delta" else "GRPC",
                "transport_api_version": "V3",
                "set_node_on_first_message_only": True,
                "grpc_services": [
                    {
                        "envoy_grpc": {
                            "cluster_name": XDS_CLUSTER,
                            "retry_policy": {"retry_back_off": ADS_RETRY_BACK_OFF},
                        }
                    }
                ],
            },
            "cds_config": ads,
            "lds_config": ads,
        },
        "static_resources": {
            "clusters": [
                {
                    "name": XDS_CLUSTER,
                    "type": "STRICT_DNS",
                    "connect_timeout": "1s",
                    "load_assignment": {
                        "cluster_name": XDS_CLUSTER,
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
                            "common_http_protocol_options": {"max_requests_per_connection": 1},
                        }
                    },
                    "transport_socket": tls,
                },
                *([admin_cluster(spec)] if spec.stats_port else []),
                *probe_clusters(spec),
            ],
            **({"listeners": listeners} if listeners else {}),
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

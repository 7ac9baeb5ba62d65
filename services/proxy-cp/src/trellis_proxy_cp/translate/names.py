"""The names of the resources Trellis gives each proxy, in one place."""

from __future__ import annotations

from trellis_common.grpc_bootstrap import SERVICE_SECRET, TRUST_BUNDLE_SECRET

OUTBOUND_LISTENER = "outbound"
INBOUND_LISTENER = "inbound"
OUTBOUND_ROUTES = "outbound-http"
INBOUND_ROUTES = "inbound-http"
SERVICE_CERT = SERVICE_SECRET  # the identity's certificate and key (SDS)
MESH_CA = TRUST_BUNDLE_SECRET  # the mesh CA (SDS validation context)
EGRESS = "egress"  # the dynamic forward proxy, when MeshConfig allows egress


def inbound_cluster(port: int) -> str:
    return f"inbound|{port}"


def outbound_tcp_listener(namespace: str, service: str, port: int) -> str:
    return f"outbound-tcp|{namespace}/{service}|{port}"


def gateway_listener(port: int) -> str:
    """A Gateway's Envoy listener on ``port`` (every Gateway listener on that port)."""
    return f"gateway_{port}"


def gateway_routes(port: int, chain: int | None = None) -> str:
    """The route configuration of a gateway port (HTTP), or of one of its TLS filter
    chains (HTTPS: one per Gateway listener, by its index among the port's)."""
    return f"gateway_{port}" if chain is None else f"gateway_{port}_{chain}"


#: The prefix of a gateway's listener certificates (file references, never keys).
GATEWAY_CERT_PREFIX = "gateway-cert/"


def gateway_cert(namespace: str, name: str) -> str:
    """The SDS secret of a Gateway listener's certificate: the Secret ``namespace/name``."""
    return f"{GATEWAY_CERT_PREFIX}{namespace}/{name}"

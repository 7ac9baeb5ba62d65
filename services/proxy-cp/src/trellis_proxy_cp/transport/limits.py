"""What one proxy may ask of the xDS server: caps on node metadata, names and streams.

A proxy that presents a mesh certificate is trusted to be a proxy, not to be well behaved.
Without caps, one bad (or buggy) Envoy could make proxy-cp parse megabytes of node metadata,
keep a subscription of millions of names, or open streams until memory runs out. Each cap
is a setting (``TRELLIS_PROXY_CP_<NAME>``), and a request past one ends its stream with a
status whose message names the limit, the value found and the setting:

* ``max_node_metadata_bytes``: the serialized size of the first request's
  ``node.metadata``, checked before anything parses it (INVALID_ARGUMENT).
* ``max_resource_names``: the names in one request (SotW ``resource_names``; delta
  subscribe + unsubscribe + ``initial_resource_versions``), and in a delta stream the names
  subscribed to per type, which accumulate over requests (RESOURCE_EXHAUSTED).
* ``max_resource_name_bytes``: the UTF-8 length of one name (INVALID_ARGUMENT).
* ``max_streams_per_proxy``: the open streams of one proxy (SotW and delta together). An
  Envoy has one ADS stream, but after a network fault the server may still hold the old
  one (it learns of a dead peer only from keepalives) while the new one starts. So the
  *newest* stream wins: when a proxy opens one stream too many, its *oldest* is ended
  (RESOURCE_EXHAUSTED, "replaced"). Refusing the newest instead would lock a reconnecting
  Envoy out until the dead stream times out; a duplicate with a stolen certificate gains
  nothing from either rule, since it can always reconnect.

Besides the caps, one rule on what is asked: **SDS names only the proxy's own secrets.** Its
identity's certificate and the trust bundle have fixed names (``service-cert``,
``mesh-trust-bundle``), served from the material of the identity its certificate proves,
so no name can reach another identity's key. A Secret request naming anything else (another
identity, a guessed key name) is a proxy probing for what is not its own: the stream ends
(PERMISSION_DENIED, reason ``foreign_secret``), logged and counted like every refusal.

Refusals are :class:`~.streams.StreamRefused` with a short ``reason`` word, which the
stream runner logs with the proxy id and reports to ``StreamHooks.on_refused`` (metrics and
the service's rejected records).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from trellis_proxy_cp.translate import names as resource_names
from trellis_proxy_cp.types import SECRET

SETTING_PREFIX = "TRELLIS_PROXY_CP_"


@dataclass(frozen=True, slots=True)
class StreamLimits:
    max_node_metadata_bytes: int = 16 * 1024
    max_resource_names: int = 1024
    max_resource_name_bytes: int = 512
    max_streams_per_proxy: int = 4


#: The SDS names a proxy may ask for: its own identity's (see the module docstring).
OWN_SECRETS = frozenset({resource_names.SERVICE_CERT, resource_names.MESH_CA})


class LimitExceeded(Exception):
    """A cap was passed: ``code``, a ``message`` naming limit, value and setting, and a short
    ``reason`` for metrics. The stream runner turns it into a refusal of the stream."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason


def setting(name: str) -> str:
    return f"setting {name}, {SETTING_PREFIX}{name.upper()}"


def check_node(node: Any, limits: StreamLimits) -> None:
    size = node.metadata.ByteSize()
    if size > limits.max_node_metadata_bytes:
        raise LimitExceeded(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"node metadata is {size} bytes serialized, over the limit of "
            f"{limits.max_node_metadata_bytes} bytes ({setting('max_node_metadata_bytes')})",
            "node_metadata_too_large",
        )


def check_request(request: Any, limits: StreamLimits) -> None:
    """The names of one SotW or delta request."""
    if isinstance(request, discovery_pb2.DeltaDiscoveryRequest):
        names = [
            *request.resource_names_subscribe,
            *request.resource_names_unsubscribe,
            *request.initial_resource_versions,
        ]
    else:
        names = request.resource_names
    if request.type_url == SECRET:
        check_secrets(names)
    if len(names) > limits.max_resource_names:
        raise LimitExceeded(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{len(names)} resource names in one {_type(request)} request, over the limit of "
            f"{limits.max_resource_names} ({setting('max_resource_names')})",
            "too_many_names",
        )
    short = limits.max_resource_name_bytes // 4  # no name this short is over, in UTF-8
    for name in names:
        if len(name) > short and len(name.encode()) > limits.max_resource_name_bytes:
            raise LimitExceeded(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"resource name {name[:64]!r}... is {len(name.encode())} bytes, over the limit "
                f"of {limits.max_resource_name_bytes} bytes "
                f"({setting('max_resource_name_bytes')})",
                "name_too_long",
            )


def check_subscription(type_url: str, count: int, limits: StreamLimits) -> None:
    """The names a delta stream subscribes to for one type, after a request."""
    if count > limits.max_resource_names:
        raise LimitExceeded(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"subscribed to {count} resource names of {type_url}, over the limit of "
            f"{limits.max_resource_names} ({setting('max_resource_names')})",
            "too_many_names",
        )


def check_secrets(names: Any) -> None:
    """Refuse a Secret request that names anything but the proxy's own secrets. A gateway's
    listener certificates (``gateway-cert/<namespace>/<name>``) are its own too: each is a
    reference to files on the gateway's host, never key material, and a proxy is only ever
    sent those its own view names (another name is simply never answered)."""
    foreign = sorted(
        n
        for n in set(names) - OWN_SECRETS
        if not str(n).startswith(resource_names.GATEWAY_CERT_PREFIX)
    )
    if foreign:
        raise LimitExceeded(
            grpc.StatusCode.PERMISSION_DENIED,
            f"SDS serves this proxy's own secrets only ({', '.join(sorted(OWN_SECRETS))}); "
            f"refused: {', '.join(repr(n[:64]) for n in foreign[:4])}"
            + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else ""),
            "foreign_secret",
        )


def replaced(proxy_id: str, limits: StreamLimits) -> LimitExceeded:
    """Why the oldest stream of a proxy that opened one too many is ended."""
    return LimitExceeded(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"replaced by a newer stream of proxy {proxy_id}: at most "
        f"{limits.max_streams_per_proxy} streams per proxy are open at once "
        f"({setting('max_streams_per_proxy')}); the oldest is closed",
        "replaced",
    )


def _type(request: Any) -> str:
    return str(request.type_url)[:200] or "(no type_url)"

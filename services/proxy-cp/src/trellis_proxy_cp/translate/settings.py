"""Per-proxy settings, from the Envoy node metadata the bootstrap sets.

Proxies of one identity share one snapshot when they also share these settings (the
snapshot key includes them), so two sidecars of a service on one host, with different
ports, each get listeners on their own ports.

Node metadata (``node.metadata``)::

    trellis:
      outbound_port: 15001      # where the local application sends mesh traffic
      inbound_port: 15003       # where peers reach this workload (mTLS)
      app_port: 8080            # the local application (0: the Service's target port)
      inbound_address: 0.0.0.0
      outbound_address: 127.0.0.1
      app_address: 127.0.0.1
      proxyless: true           # a gRPC client's own xDS client, not an Envoy
      capture: true             # the pod redirects its traffic to Envoy (Kubernetes):
                                # listeners match on the original destination (capture.py)
      workload_dir: /etc/trellis/proxy  # the pod agent's folder: Envoy reads the proxy's own
                                # workload certificate and key there (secrets.py)
      gateway: true             # a Gateway API Gateway's Envoy (its identity is
                                # "<namespace>/<gateway>"): it gets the Gateway's listeners
                                # (gateway_listeners.py) and no sidecar listener
      gateway_certs_dir: /etc/trellis/gateway-certs  # where that Envoy finds the certificates
                                # its HTTPS listeners serve, one folder per Secret, as a
                                # Kubernetes Secret volume lays it out:
                                # <dir>/<namespace>/<name>/tls.crt and tls.key (secrets.py);
                                # without it, HTTPS listeners are left out

A gateway's settings are ``gateway``, ``gateway_certs_dir``, ``workload_dir`` (its own
workload certificate, which it presents to the mesh services it routes to) and its
locality; the sidecar ports and addresses mean nothing to it (its listeners are on the
Gateway's ports), and it is neither ``proxyless`` nor ``capture``: those combinations are
refused, as is a ``gateway_certs_dir`` without ``gateway: true``.

And the node's own ``node.locality`` (region, zone, sub_zone: Envoy's field, not metadata),
where the proxy runs: load assignments of clusters that fail over by locality depend on it
(locality.py), so it is part of the snapshot key; proxyless clients do not use it.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

DEFAULT_OUTBOUND_PORT = 15001
DEFAULT_INBOUND_PORT = 15003


class InvalidNodeMetadata(ValueError):
    """The bootstrap's node metadata is wrong; the message names the key."""


@dataclass(frozen=True, slots=True)
class ProxySettings:
    outbound_port: int = DEFAULT_OUTBOUND_PORT
    inbound_port: int = DEFAULT_INBOUND_PORT
    app_port: int = 0
    inbound_address: str = "0.0.0.0"
    outbound_address: str = "127.0.0.1"
    app_address: str = "127.0.0.1"
    proxyless: bool = False
    capture: bool = False
    #: where the pod's agent keeps the workload certificate and key ("": sent over SDS)
    workload_dir: str = ""
    #: where the proxy runs, ``region[/zone[/subzone]]`` ("": it did not say)
    locality: str = ""
    #: a Gateway's Envoy: the Gateway's listeners, no sidecar listener
    gateway: bool = False
    #: where a gateway Envoy reads its listeners' certificates ("": no HTTPS listeners)
    gateway_certs_dir: str = ""

    @property
    def built_whole(self) -> bool:
        """Whether this proxy's resources are always translated all together: a proxyless
        client's and a gateway's (only a sidecar's are translated kind by kind)."""
        return self.proxyless or self.gateway

    def key(self) -> str:
        """The part of the snapshot key these settings make."""
        if self.proxyless:
            return "proxyless"  # no listener of its own: the ports mean nothing
        return (
            f"{self.outbound_address}:{self.outbound_port}|{self.inbound_address}:"
            f"{self.inbound_port}|{self.app_address}:{self.app_port}"
            + ("|capture" if self.capture else "")
            + (f"|files:{self.workload_dir}" if self.workload_dir else "")
            + (f"|locality:{self.locality}" if self.locality else "")
            + ("|gateway" if self.gateway else "")
            + (f"|gateway-certs:{self.gateway_certs_dir}" if self.gateway_certs_dir else "")
        )


_PORTS = ("outbound_port", "inbound_port", "app_port")
_ADDRESSES = ("inbound_address", "outbound_address", "app_address")


def _port(name: str, raw: object) -> int:
    # A protobuf Struct carries every number as a float; YAML may give a string.
    if isinstance(raw, bool):
        number = None
    elif isinstance(raw, int):
        number = raw
    elif (isinstance(raw, float) and raw.is_integer()) or (isinstance(raw, str) and raw.isdigit()):
        number = int(raw)
    else:
        number = None
    low = 0 if name == "app_port" else 1
    if number is None or not low <= number <= 65535:
        raise InvalidNodeMetadata(
            f"node.metadata.trellis.{name}: {raw!r} is not a port number in {low}..65535"
        )
    return number


_FOLDER = re.compile(r"(/[A-Za-z0-9._-]+)+")


def _folder(name: str, raw: object) -> str:
    """An absolute folder path of plain names (no ``..``, no spaces), at most 200 long."""
    text = str(raw)
    if (
        not isinstance(raw, str)
        or len(text) > 200
        or not _FOLDER.fullmatch(text)
        or any(part in (".", "..") for part in text.split("/"))
    ):
        raise InvalidNodeMetadata(
            f"node.metadata.trellis.{name}: {raw!r} is not an absolute folder path"
        )
    return text


def _check_gateway(values: dict[str, Any]) -> None:
    """A gateway Envoy is neither proxyless nor capturing; its certificates folder is a
    gateway's alone."""
    if values.get("gateway"):
        for flag in ("proxyless", "capture"):
            if values.get(flag):
                raise InvalidNodeMetadata(
                    f"node.metadata.trellis.gateway: a gateway Envoy cannot also be {flag}"
                )
    elif "gateway_certs_dir" in values:
        raise InvalidNodeMetadata(
            "node.metadata.trellis.gateway_certs_dir: only a gateway Envoy (gateway: true) "
            "serves certificates"
        )


def from_metadata(metadata: dict[str, Any] | None, locality: str = "") -> ProxySettings:
    """Settings from ``node.metadata`` (as a plain dict; unknown keys are ignored) and the
    node's locality text (``locality.of_node``)."""
    section = (metadata or {}).get("trellis") or {}
    if not isinstance(section, dict):
        raise InvalidNodeMetadata("node.metadata.trellis must be a mapping")
    values: dict[str, Any] = {}
    for name in _PORTS:
        if name in section:
            values[name] = _port(name, section[name])
    for name in _ADDRESSES:
        if name in section:
            raw = section[name]
            try:
                ipaddress.ip_address(str(raw))
            except ValueError:
                raise InvalidNodeMetadata(
                    f"node.metadata.trellis.{name}: {raw!r} is not an IP address"
                ) from None
            values[name] = str(raw)
    for flag in ("proxyless", "capture", "gateway"):
        if flag in section:
            if not isinstance(section[flag], bool):
                raise InvalidNodeMetadata(
                    f"node.metadata.trellis.{flag}: {section[flag]!r} is not true or false"
                )
            values[flag] = section[flag]
    for name in ("workload_dir", "gateway_certs_dir"):
        if name in section:
            values[name] = _folder(name, section[name])
    _check_gateway(values)
    settings = ProxySettings(**values, locality="" if values.get("proxyless") else locality)
    wildcard = {"0.0.0.0", "::"}
    if settings.inbound_port == settings.outbound_port and (
        settings.inbound_address == settings.outbound_address
        or {settings.inbound_address, settings.outbound_address} & wildcard
    ):
        raise InvalidNodeMetadata("node.metadata.trellis: inbound and outbound ports collide")
    return settings

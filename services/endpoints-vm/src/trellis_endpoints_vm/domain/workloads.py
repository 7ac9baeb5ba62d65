"""A workload registered over REST: where it listens, what it serves, whether it is alive.

A workload with a TTL must heartbeat: once ``last_heartbeat + ttl`` has passed it is taken
out of its services (its registration is kept) and comes back with the next heartbeat. A
workload without a TTL stays until it is deregistered.

Heartbeats are bound to the workload: each registration answers with a new random
heartbeat token (:func:`new_heartbeat_token`), and only its SHA-256 is kept with the
workload (``heartbeat_digest``, stored, never listed). A heartbeat or a deregistration
must carry that token (:func:`holds_token`). A record stored before heartbeat tokens has
none; it loads as it is and gets one at its next registration.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import secrets
from dataclasses import dataclass, field, replace

from trellis_common.ids import InvalidIdentifier, validate_dns_label, validate_dns_subdomain
from trellis_endpoints_vm.domain.views import EndpointInfo, Pairs, PortMap

MAX_WEIGHT = 2**32 - 1


class InvalidWorkload(ValueError):
    """A registration field is wrong; ``field`` names it."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Workload:
    namespace: str
    name: str
    services: tuple[str, ...]
    address: str
    ports: PortMap
    labels: Pairs = ()
    service_account: str = ""
    locality: str = ""
    network: str = ""
    weight: int = 1
    ttl: float | None = None
    registered_at: float = 0.0
    last_heartbeat: float = 0.0
    #: SHA-256 (hex) of the heartbeat token given at registration; "" for a record stored
    #: before heartbeat tokens (it gets one when it registers again).
    heartbeat_digest: str = field(default="", repr=False)

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}"

    def alive(self, now: float) -> bool:
        return self.ttl is None or now < self.last_heartbeat + self.ttl

    @property
    def expires_at(self) -> float | None:
        return None if self.ttl is None else self.last_heartbeat + self.ttl

    def beat(self, now: float) -> Workload:
        return replace(self, last_heartbeat=now)

    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    def endpoint(self, ports: PortMap | None = None, source: str = "registration") -> EndpointInfo:
        return EndpointInfo(
            address=self.address,
            ports=self.ports if ports is None else ports,
            labels=self.labels,
            locality=self.locality,
            network=self.network,
            weight=self.weight,
            service_account=self.service_account or "default",
            workload=self.id,
            source=source,
        )


HEARTBEAT_TOKEN_PREFIX = "trellis-hb."


def new_heartbeat_token() -> tuple[str, str]:
    """A new heartbeat token and its digest: the token goes to the workload, once; the
    digest is what is kept."""
    token = HEARTBEAT_TOKEN_PREFIX + secrets.token_urlsafe(32)
    return token, token_digest(token)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def holds_token(workload: Workload, token: str) -> bool:
    """Whether ``token`` is ``workload``'s heartbeat token (constant-time compare)."""
    if not workload.heartbeat_digest:
        return False
    return hmac.compare_digest(workload.heartbeat_digest, token_digest(token))


def _label(value: str, field: str) -> str:
    try:
        return validate_dns_label(value, field)
    except InvalidIdentifier as exc:
        raise InvalidWorkload(field, exc.reason) from None


def validate(workload: Workload) -> Workload:
    """Check every field; raises :class:`InvalidWorkload` naming the first bad one."""
    _label(workload.namespace, "namespace")
    try:
        validate_dns_subdomain(workload.name, "name")
    except InvalidIdentifier as exc:
        raise InvalidWorkload("name", exc.reason) from None
    if not workload.services:
        raise InvalidWorkload("services", "at least one service is required")
    for i, service in enumerate(workload.services):
        _label(service, f"services[{i}]")
    if len(set(workload.services)) != len(workload.services):
        raise InvalidWorkload("services", "lists a service twice")
    try:
        ipaddress.ip_address(workload.address)
    except ValueError:
        raise InvalidWorkload(
            "address", f"{workload.address!r} is not an IPv4 or IPv6 address"
        ) from None
    if not workload.ports:
        raise InvalidWorkload("ports", "at least one port is required")
    names = [name for name, _ in workload.ports]
    if len(set(names)) != len(names):
        raise InvalidWorkload("ports", "port names must be unique")
    if "" in names and len(names) > 1:
        raise InvalidWorkload(
            "ports", "a bare port number is only allowed alone; name the ports (NAME=NUMBER)"
        )
    for name, number in workload.ports:
        if name:
            _label(name, f"ports[{name}]")
        if not 1 <= number <= 65535:
            raise InvalidWorkload(f"ports[{name or number}]", f"{number} is not in 1..65535")
    if workload.service_account:
        try:
            validate_dns_subdomain(workload.service_account, "service_account")
        except InvalidIdentifier as exc:
            raise InvalidWorkload("service_account", exc.reason) from None
    if workload.locality and len(workload.locality.split("/")) > 3:
        raise InvalidWorkload("locality", "must be region[/zone[/subzone]]")
    if not 0 <= workload.weight <= MAX_WEIGHT:
        raise InvalidWorkload("weight", f"must be in 0..{MAX_WEIGHT}")
    if workload.ttl is not None and not 1 <= workload.ttl <= 86400:
        raise InvalidWorkload("ttl", "must be between 1 and 86400 seconds (or absent)")
    for key, _ in workload.labels:
        if not key or len(key) > 317:
            raise InvalidWorkload("labels", f"bad label key {key!r}")
    return workload


def to_json(workload: Workload) -> str:
    return json.dumps(
        {
            "namespace": workload.namespace,
            "name": workload.name,
            "services": list(workload.services),
            "address": workload.address,
            "ports": [[name, number] for name, number in workload.ports],
            "labels": dict(workload.labels),
            "service_account": workload.service_account,
            "locality": workload.locality,
            "network": workload.network,
            "weight": workload.weight,
            "ttl": workload.ttl,
            "registered_at": workload.registered_at,
            "last_heartbeat": workload.last_heartbeat,
            "heartbeat_token_sha256": workload.heartbeat_digest,
        },
        separators=(",", ":"),
    )


def _string(body: dict[str, object], name: str) -> str:
    value = body[name]
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    return value


def from_json(text: str | bytes) -> Workload:
    """Parse a stored record; ``ValueError`` names what is wrong with a bad one.

    Only the shape is checked here; :func:`validate` checks the values.
    """
    try:
        body = json.loads(text)
        if not isinstance(body, dict):
            raise TypeError(f"a record must be a JSON object, got {type(body).__name__}")
        services, ports, labels = body["services"], body["ports"], body["labels"]
        if not isinstance(services, list) or not all(isinstance(s, str) for s in services):
            raise TypeError("services must be a list of strings")
        if not isinstance(ports, list):
            raise TypeError("ports must be a list of [name, number] pairs")
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise TypeError("labels must map strings to strings")
        return Workload(
            namespace=_string(body, "namespace"),
            name=_string(body, "name"),
            services=tuple(services),
            address=_string(body, "address"),
            ports=tuple((str(n), int(p)) for n, p in ports),
            labels=tuple(sorted(labels.items())),
            service_account=_string(body, "service_account"),
            locality=_string(body, "locality"),
            network=_string(body, "network"),
            weight=int(body["weight"]),
            ttl=None if body["ttl"] is None else float(body["ttl"]),
            registered_at=float(body["registered_at"]),
            last_heartbeat=float(body["last_heartbeat"]),
            heartbeat_digest=_digest(body.get("heartbeat_token_sha256", "")),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"malformed workload record: {_describe(exc)}") from exc


def _digest(value: object) -> str:
    """A stored digest: 64 hex digits, or "" (a record from before heartbeat tokens)."""
    if value == "":
        return ""
    if not isinstance(value, str) or len(value) != 64 or value.strip("0123456789abcdef"):
        raise ValueError("heartbeat_token_sha256 must be 64 lowercase hex digits")
    return value


def _describe(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"field {exc.args[0]!r} is missing"
    return str(exc) or type(exc).__name__

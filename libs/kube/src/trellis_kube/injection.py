"""Sidecar injection: its names, and whether a pod is to be injected, as pure functions.

Two readers need the same answer: the injector's webhook, which acts on it, and
``trellis inject check``, which explains it to a user whose pod came up without a sidecar.
Both read it here, so the explanation cannot drift from what the webhook does.

Selection belongs to the API server: the MutatingWebhookConfiguration's namespaceSelector
is on the monitored label (``trellis.dev/monitored-by=<mesh>``), so the webhook is only ever
sent pods of monitored namespaces. Of those, a pod is injected unless it opts out with
``trellis.dev/sidecar-injection: disabled``, already has a container named ``envoy``, or
uses the node's network (``hostNetwork``: its iptables rules would be the node's).

Exclusions from the traffic redirection are annotations on the pod (comma-separated, as
OSM spells them): inbound and outbound ports, and outbound IPv4 ranges. A bad value is an
:class:`InvalidAnnotation` naming the annotation; the webhook denies such a pod with that
message rather than inject a redirection the user did not ask for.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

#: Per pod: ``disabled`` opts out, ``enabled`` (or nothing) leaves it to the namespace.
INJECTION_ANNOTATION: Final = "trellis.dev/sidecar-injection"
INBOUND_PORTS_ANNOTATION: Final = "trellis.dev/inbound-port-exclusion-list"
OUTBOUND_PORTS_ANNOTATION: Final = "trellis.dev/outbound-port-exclusion-list"
OUTBOUND_RANGES_ANNOTATION: Final = "trellis.dev/outbound-ip-range-exclusion-list"
#: OSM's names for the same three lists: an OSM user's pods keep their exclusions as they
#: are (both names may be set; the lists are joined).
OSM_INBOUND_PORTS_ANNOTATION: Final = "openservicemesh.io/inbound-port-exclusion-list"
OSM_OUTBOUND_PORTS_ANNOTATION: Final = "openservicemesh.io/outbound-port-exclusion-list"
OSM_OUTBOUND_RANGES_ANNOTATION: Final = "openservicemesh.io/outbound-ip-range-exclusion-list"
#: The mesh service a pod's proxy belongs to, when its labels do not say it.
SERVICE_ANNOTATION: Final = "trellis.dev/service"
#: The injected pod's proxy UUID (its certificate's CN starts with it): how endpoints-k8s
#: finds the pod of a proxy.
PROXY_UUID_LABEL: Final = "trellis.dev/proxy-uuid"

SIDECAR_CONTAINER: Final = "envoy"
INIT_CONTAINER: Final = "trellis-init"
#: The default name of the MutatingWebhookConfiguration (Helm chart, injector setting).
WEBHOOK_CONFIGURATION: Final = "trellis-injector"

ENABLED: Final = "enabled"
DISABLED: Final = "disabled"

Outcome = Literal[
    "inject", "skipped_opt_out", "skipped_already", "skipped_host_network", "denied_invalid"
]


class InvalidAnnotation(ValueError):
    """A pod annotation's value is not acceptable; ``annotation`` names it."""

    def __init__(self, annotation: str, reason: str) -> None:
        self.annotation = annotation
        self.reason = reason
        super().__init__(f"annotation {annotation}: {reason}")


@dataclass(frozen=True, slots=True)
class Exclusions:
    """What the init container leaves out of the redirection to Envoy."""

    inbound_ports: tuple[int, ...] = ()
    outbound_ports: tuple[int, ...] = ()
    outbound_ranges: tuple[str, ...] = ()

    def union(self, other: Exclusions) -> Exclusions:
        """Both sets of exclusions (MeshConfig's lists and a pod's annotations, as OSM
        merges them), each item once, in order."""
        return Exclusions(
            tuple(dict.fromkeys(self.inbound_ports + other.inbound_ports)),
            tuple(dict.fromkeys(self.outbound_ports + other.outbound_ports)),
            tuple(dict.fromkeys(self.outbound_ranges + other.outbound_ranges)),
        )


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether a pod the webhook is sent gets a sidecar, and why, in a user's words."""

    outcome: Outcome
    reason: str
    exclusions: Exclusions = field(default_factory=Exclusions)

    @property
    def inject(self) -> bool:
        return self.outcome == "inject"


def _items(annotation: str, text: str) -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if any(not item for item in items) and text.strip():
        raise InvalidAnnotation(annotation, f"an empty item in {text!r} (comma-separated)")
    return [item for item in items if item]


def parse_ports(annotation: str, text: str) -> tuple[int, ...]:
    """``"5432, 6379"`` -> ``(5432, 6379)``; each a TCP port 1..65535."""
    ports: list[int] = []
    for item in _items(annotation, text):
        if not item.isdigit() or not 1 <= int(item) <= 65535:
            raise InvalidAnnotation(annotation, f"{item!r} is not a port (1..65535)")
        if int(item) not in ports:
            ports.append(int(item))
    return tuple(ports)


def parse_ranges(annotation: str, text: str) -> tuple[str, ...]:
    """``"10.0.0.0/8, 192.168.1.7"`` -> ``("10.0.0.0/8", "192.168.1.7/32")``: IPv4 only,
    because the init container writes IPv4 (iptables) rules only."""
    ranges: list[str] = []
    for item in _items(annotation, text):
        try:
            network = ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise InvalidAnnotation(annotation, f"{item!r} is not an IP range (CIDR)") from None
        if network.version != 4:
            raise InvalidAnnotation(
                annotation, f"{item!r} is IPv6: only IPv4 traffic is redirected"
            )
        if str(network) not in ranges:
            ranges.append(str(network))
    return tuple(ranges)


def exclusions(annotations: Mapping[str, str]) -> Exclusions:
    """The pod's exclusion annotations, Trellis' and OSM's, checked and joined
    (:class:`InvalidAnnotation` names a bad one)."""
    found = Exclusions()
    for inbound, outbound, ranges in (
        (INBOUND_PORTS_ANNOTATION, OUTBOUND_PORTS_ANNOTATION, OUTBOUND_RANGES_ANNOTATION),
        (
            OSM_INBOUND_PORTS_ANNOTATION,
            OSM_OUTBOUND_PORTS_ANNOTATION,
            OSM_OUTBOUND_RANGES_ANNOTATION,
        ),
    ):
        found = found.union(
            Exclusions(
                inbound_ports=parse_ports(inbound, annotations.get(inbound, "")),
                outbound_ports=parse_ports(outbound, annotations.get(outbound, "")),
                outbound_ranges=parse_ranges(ranges, annotations.get(ranges, "")),
            )
        )
    return found


def _strings(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def annotations_of(pod: Mapping[str, Any]) -> dict[str, str]:
    metadata = pod.get("metadata")
    return _strings(metadata.get("annotations")) if isinstance(metadata, dict) else {}


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    metadata = obj.get("metadata")
    return _strings(metadata.get("labels")) if isinstance(metadata, dict) else {}


def container_names(pod: Mapping[str, Any], key: str = "containers") -> list[str]:
    spec = pod.get("spec")
    listed = spec.get(key) if isinstance(spec, dict) else None
    if not isinstance(listed, list):
        return []
    return [str(c.get("name", "")) for c in listed if isinstance(c, dict)]


def decide(pod: Mapping[str, Any]) -> Decision:
    """What the webhook does with ``pod`` (the namespace already selected by the API server)."""
    annotations = annotations_of(pod)
    setting = annotations.get(INJECTION_ANNOTATION, "").strip().lower()
    if setting == DISABLED:
        return Decision(
            "skipped_opt_out", f"the pod is annotated {INJECTION_ANNOTATION}: {DISABLED}"
        )
    if setting not in ("", ENABLED):
        return Decision(
            "denied_invalid",
            f"annotation {INJECTION_ANNOTATION}: {setting!r} is neither {ENABLED} nor {DISABLED}",
        )
    if SIDECAR_CONTAINER in container_names(pod):
        return Decision(
            "skipped_already", f"the pod already has a container named {SIDECAR_CONTAINER!r}"
        )
    spec = pod.get("spec")
    if isinstance(spec, dict) and spec.get("hostNetwork") is True:
        return Decision(
            "skipped_host_network",
            "the pod uses the node's network (hostNetwork): redirecting its traffic would "
            "redirect the node's",
        )
    try:
        excluded = exclusions(annotations)
    except InvalidAnnotation as exc:
        return Decision("denied_invalid", str(exc))
    return Decision("inject", "the pod does not opt out and has no sidecar yet", excluded)


def namespace_selected(labels: Mapping[str, str], label: str, mesh_name: str) -> bool:
    """Whether a namespace with ``labels`` matches the webhook's namespaceSelector."""
    return labels.get(label) == mesh_name


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A Kubernetes LabelSelector (``matchLabels``, ``matchExpressions``) against ``labels``;
    an absent or empty selector matches everything, as in a webhook configuration."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression.get("key", ""), expression.get("operator", "")
        values = expression.get("values") or []
        present = key in labels
        matched = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }.get(operator, False)
        if not matched:
            return False
    return True

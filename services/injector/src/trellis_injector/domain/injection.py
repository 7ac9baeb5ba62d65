"""What the webhook adds to a pod, as pure functions: the JSONPatch.

The patch applies to the pod exactly as the API server sends it for CREATE. Such a pod
often has ``generateName`` and no name, and no labels, annotations, init containers or
volumes, so each list or map is created when it is absent and appended to when it is
there (``add`` under a missing parent fails). After it applies: the pod's own containers
and volumes are kept, the added containers have images, their names are unique in the pod
and every mount names a volume. A pod whose own names clash with what is added is
:class:`InvalidPod`, named, rather than patched into one the API server refuses.

What is added, in the order the kubelet starts it:

1. ``trellis-init``: the traffic redirection (iptables), as root with NET_ADMIN;
2. ``trellis-agent``, a native sidecar (an init container with ``restartPolicy: Always``)
   from the Trellis image, as the proxy's uid: it enrolls the proxy with the pod's projected
   ServiceAccount token (volume ``trellis-token``, audience ``trellis``, bound to the pod by
   the kubelet) and writes the key it made, the certificates and Envoy's bootstrap into the
   memory-backed ``trellis-proxy`` volume (``trellis_cli.agent``); its startup probe holds
   the pod's containers back until the bootstrap is there;
3. ``envoy``, reading that volume (read-only).

Nothing is stored on the pod's behalf: no Secret, no certificate issued at admission. Who
the proxy is (namespace, ServiceAccount, pod name and uid) is what the token proves when the
agent enrolls, never what the pod's labels or annotations say.

The proxy's mesh service (the middle of its certificate's CN, and the DNS names of its
workload certificate) is, in order: the ``trellis.dev/service`` annotation, the
``app.kubernetes.io/name`` label, the ``app`` label, else its service account. Identity
for policy is always the service account.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from trellis_common.bootstrap import STATS_PATH, sidecar_args
from trellis_injector.domain import iptables, probes
from trellis_injector.domain.onboarding import (
    BOOTSTRAP_FILE,
    InvalidOnboarding,
    ProxyRequest,
)
from trellis_kube import injection

VOLUME: Final = "trellis-proxy"
TOKEN_VOLUME: Final = "trellis-token"
TOKEN_DIR: Final = "/var/run/secrets/trellis"
TOKEN_FILE: Final = "token"
#: The projected token's lifetime; the kubelet writes a fresh one at 80 % of it.
TOKEN_SECONDS: Final = 3600
#: The audience the token is for: certmanager asks the API server to review it for this.
TOKEN_AUDIENCE: Final = "trellis"
AGENT_CONTAINER: Final = "trellis-agent"
AGENT_COMMAND: Final = "trellis-agent"
_SERVICE_LABELS: Final = ("app.kubernetes.io/name", "app")


class InvalidPod(ValueError):
    """The pod cannot be injected as it is; the message says what to change."""


@dataclass(frozen=True, slots=True)
class Sidecar:
    """How sidecars are made (injector settings): images, ports, where the files go."""

    envoy_image: str
    init_image: str  # the redirection: iptables-restore only
    agent_image: str  # trellis-agent
    mount_path: str = "/etc/trellis/proxy"
    inbound_port: int = 15003
    outbound_port: int = 15001
    admin_port: int = 15000
    proxy_uid: int = iptables.PROXY_UID
    stats_port: int = 15010  # Envoy's Prometheus statistics (OSM's port); 0: none


def _escape(key: str) -> str:
    """A JSON pointer token (RFC 6901): ``~`` and ``/`` escaped."""
    return key.replace("~", "~0").replace("/", "~1")


def proxy_service(pod: Mapping[str, Any], service_account: str) -> tuple[str, str]:
    """The proxy's mesh service and where it came from (for messages)."""
    annotated = injection.annotations_of(pod).get(injection.SERVICE_ANNOTATION, "").strip()
    if annotated:
        return annotated, f"annotation {injection.SERVICE_ANNOTATION}"
    labels = injection.labels_of(pod)
    for label in _SERVICE_LABELS:
        if labels.get(label):
            return labels[label], f"label {label}"
    return service_account, "service account"


def service_account_of(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec")
    account = spec.get("serviceAccountName") if isinstance(spec, dict) else None
    return account if isinstance(account, str) and account else "default"


def proxy_request(pod: Mapping[str, Any], namespace: str, sidecar: Sidecar) -> ProxyRequest:
    """The onboarding request of the pod's proxy; :class:`InvalidPod` names what is wrong."""
    account = service_account_of(pod)
    service, source = proxy_service(pod, account)
    try:
        return ProxyRequest(
            namespace=namespace,
            service=service,
            service_account=account,
            inbound_port=sidecar.inbound_port,
            outbound_port=sidecar.outbound_port,
            admin_port=sidecar.admin_port,
            output_dir=sidecar.mount_path,
            stats_port=sidecar.stats_port,
            capture=True,
            probes=tuple(probes.rewrites(pod)[0]),
        )
    except InvalidOnboarding as exc:
        if exc.field == "service":
            raise InvalidPod(
                f"the proxy's service {service!r} (from the {source}): {exc.reason}; set the "
                f"annotation {injection.SERVICE_ANNOTATION} to a shorter DNS label"
            ) from None
        raise InvalidPod(f"the pod's {exc.field.replace('_', ' ')}: {exc.reason}") from None


@dataclass(frozen=True, slots=True)
class Agent:
    """What the pod's agent is told: where to enroll, whom to trust, and the bootstrap
    (without its node id: the proxy certificate names it)."""

    address: str  # proxy-cp's enrollment port, host:port
    server_name: str  # the DNS name proxy-cp's certificate is checked for
    ca_pem: str
    service: str
    bootstrap: dict[str, Any] = field(repr=False)


def _containers(pod: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    spec = pod.get("spec")
    listed = spec.get(key) if isinstance(spec, dict) else None
    return [c for c in listed if isinstance(c, dict)] if isinstance(listed, list) else []


def check_pod(pod: Mapping[str, Any]) -> None:
    """:class:`InvalidPod` if what the patch adds would clash with the pod's own names."""
    spec = pod.get("spec")
    if not isinstance(spec, dict) or not _containers(pod, "containers"):
        raise InvalidPod("the pod has no spec.containers")
    taken = {
        str(c.get("name"))
        for key in ("containers", "initContainers")
        for c in _containers(pod, key)
    }
    for name in (injection.INIT_CONTAINER, injection.SIDECAR_CONTAINER, AGENT_CONTAINER):
        if name in taken:
            raise InvalidPod(f"the pod already has a container named {name!r}: rename it")
    volumes = spec.get("volumes")
    listed = volumes if isinstance(volumes, list) else []
    named = {v.get("name") for v in listed if isinstance(v, dict)}
    for volume in (VOLUME, TOKEN_VOLUME):
        if volume in named:
            raise InvalidPod(f"the pod already has a volume named {volume!r}: rename it")


def init_container(sidecar: Sidecar, exclusions: injection.Exclusions) -> dict[str, Any]:
    # Prometheus scrapes the stats listener itself, and the kubelet the probe listeners,
    # not through the inbound redirect
    own = [sidecar.stats_port] if sidecar.stats_port else []
    own += list(probes.PROBE_PORTS.values())
    missing = tuple(p for p in own if p not in exclusions.inbound_ports)
    exclusions = replace(exclusions, inbound_ports=(*exclusions.inbound_ports, *missing))
    redirection = iptables.Redirection(
        sidecar.inbound_port, sidecar.outbound_port, sidecar.proxy_uid, exclusions
    )
    return {
        "name": injection.INIT_CONTAINER,
        "image": sidecar.init_image,
        "command": iptables.command(redirection),
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
        },
    }


def agent_container(sidecar: Sidecar, agent: Agent) -> dict[str, Any]:
    """The agent, a native sidecar: started after the redirection, before every container,
    which wait for its startup probe (the bootstrap written: the proxy is enrolled)."""
    folder = sidecar.mount_path.rstrip("/")
    env = {
        "TRELLIS_AGENT_ADDRESS": agent.address,
        "TRELLIS_AGENT_SERVER_NAME": agent.server_name,
        "TRELLIS_AGENT_CA": agent.ca_pem,
        "TRELLIS_AGENT_SERVICE": agent.service,
        "TRELLIS_AGENT_TOKEN": f"{TOKEN_DIR}/{TOKEN_FILE}",
        "TRELLIS_AGENT_DIR": folder,
        # JSON is YAML: the agent reads it, sets the node id, and writes envoy.yaml
        "TRELLIS_AGENT_BOOTSTRAP": json.dumps(agent.bootstrap, separators=(",", ":")),
    }
    return {
        "name": AGENT_CONTAINER,
        "image": sidecar.agent_image,
        "command": [AGENT_COMMAND],
        "restartPolicy": "Always",
        "env": [{"name": name, "value": value} for name, value in env.items()],
        "startupProbe": {
            "exec": {"command": ["test", "-s", f"{folder}/{BOOTSTRAP_FILE}"]},
            "periodSeconds": 1,
            "failureThreshold": 120,
        },
        "securityContext": {
            "runAsUser": sidecar.proxy_uid,  # its calls to proxy-cp leave unredirected
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
        },
        "volumeMounts": [
            {"name": VOLUME, "mountPath": sidecar.mount_path},
            {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True},
        ],
    }


def volumes() -> list[dict[str, Any]]:
    """The agent's folder (memory only: the key never touches a disk) and the pod's
    projected ServiceAccount token."""
    token = {"audience": TOKEN_AUDIENCE, "expirationSeconds": TOKEN_SECONDS, "path": TOKEN_FILE}
    return [
        {"name": VOLUME, "emptyDir": {"medium": "Memory"}},
        {"name": TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": token}]}},
    ]


def envoy_container(sidecar: Sidecar, log_level: str = "") -> dict[str, Any]:
    """The ``envoy`` container; ``log_level``: MeshConfig's ``sidecar.logLevel`` (OSM passes
    it as Envoy's ``--log-level``), or "" for Envoy's default."""
    bootstrap = f"{sidecar.mount_path.rstrip('/')}/{BOOTSTRAP_FILE}"
    levels = ["--log-level", log_level] if log_level else []
    return {
        "name": injection.SIDECAR_CONTAINER,
        "image": sidecar.envoy_image,
        "command": ["envoy"],
        "args": ["-c", bootstrap, *sidecar_args(), *levels],
        "ports": [
            {"name": "trellis-inbound", "containerPort": sidecar.inbound_port, "protocol": "TCP"},
            *(
                [{"name": "trellis-stats", "containerPort": sidecar.stats_port, "protocol": "TCP"}]
                if sidecar.stats_port
                else []
            ),
        ],
        "securityContext": {
            "runAsUser": sidecar.proxy_uid,  # the init container's rules let this uid out
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
        },
        "volumeMounts": [{"name": VOLUME, "mountPath": sidecar.mount_path, "readOnly": True}],
    }


def _add(pod: Mapping[str, Any], parent: str, key: str, *items: Any) -> list[dict[str, Any]]:
    """Append ``items`` to the list at ``/parent/key``, creating the list if absent."""
    holder = pod.get(parent)
    if isinstance(holder, dict) and isinstance(holder.get(key), list):
        return [{"op": "add", "path": f"/{parent}/{key}/-", "value": item} for item in items]
    return [{"op": "add", "path": f"/{parent}/{key}", "value": list(items)}]


#: Where Prometheus finds a pod's metrics, the annotations its usual scrape configuration reads.
SCRAPE_ANNOTATIONS: Final = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")


def _scrape_annotations(metadata: Mapping[str, Any], sidecar: Sidecar) -> list[dict[str, Any]]:
    """Annotations that point Prometheus at the sidecar's statistics; a pod that sets any of
    them itself keeps its own (its application may be what it wants scraped)."""
    annotations = metadata.get("annotations")
    if isinstance(annotations, dict) and any(k in annotations for k in SCRAPE_ANNOTATIONS):
        return []
    values = dict(
        zip(SCRAPE_ANNOTATIONS, ("true", str(sidecar.stats_port), STATS_PATH), strict=True)
    )
    if isinstance(annotations, dict):
        return [
            {"op": "add", "path": f"/metadata/annotations/{_escape(k)}", "value": v}
            for k, v in values.items()
        ]
    return [{"op": "add", "path": "/metadata/annotations", "value": values}]


def pod_patch(
    pod: Mapping[str, Any],
    sidecar: Sidecar,
    agent: Agent,
    exclusions: injection.Exclusions,
    log_level: str = "",
) -> list[dict[str, Any]]:
    """The RFC 6902 operations that inject ``pod``; :class:`InvalidPod` if they cannot."""
    check_pod(pod)
    metadata = pod.get("metadata")
    ops: list[dict[str, Any]] = []
    if not isinstance(metadata, dict):
        ops.append({"op": "add", "path": "/metadata", "value": {}})
    if sidecar.stats_port:
        ops += _scrape_annotations(metadata if isinstance(metadata, dict) else {}, sidecar)
    ops += probes.rewrites(pod)[1]
    inits = (init_container(sidecar, exclusions), agent_container(sidecar, agent))
    ops += _add(pod, "spec", "initContainers", *inits)
    ops += _add(pod, "spec", "containers", envoy_container(sidecar, log_level))
    ops += _add(pod, "spec", "volumes", *volumes())
    return ops

"""What the webhook adds to a pod, as pure functions: the JSONPatch and the proxy's Secret.

The patch applies to the pod exactly as the API server sends it for CREATE. Such a pod
often has ``generateName`` and no name, and no labels, annotations, init containers or
volumes, so each list or map is created when it is absent and appended to when it is
there (``add`` under a missing parent fails). After it applies: the pod's own containers
and volumes are kept, the added containers (``envoy``, ``trellis-init``) have images, their
names are unique in the pod, every mount names a volume, and the pod carries the
``trellis.dev/proxy-uuid`` label of its proxy certificate. A pod whose own names clash with
what is added is :class:`InvalidPod`, named, rather than patched into one the API server
refuses.

The proxy's files (bootstrap, certificate chain, key, trust bundle, SDS file) travel in a
Secret in the pod's namespace, named after the proxy's UUID (the pod may have no name yet),
mounted read-only into the ``envoy`` container only, at the paths its bootstrap names.

The proxy's mesh service (the middle of its certificate's CN) is, in order: the
``trellis.dev/service`` annotation, the ``app.kubernetes.io/name`` label, the ``app`` label,
else its service account. Identity for policy is always the service account.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from trellis_common import ids
from trellis_common.bootstrap import STATS_PATH, proxy_secret_document, sidecar_args
from trellis_common.kube import injection
from trellis_injector.domain import iptables, probes
from trellis_injector.domain.onboarding import (
    BOOTSTRAP_FILE,
    InvalidOnboarding,
    Onboarding,
    ProxyRequest,
)

VOLUME: Final = "trellis-proxy"
SECRET_PREFIX: Final = "trellis-proxy-"
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "trellis-injector"}
_SERVICE_LABELS: Final = ("app.kubernetes.io/name", "app")


class InvalidPod(ValueError):
    """The pod cannot be injected as it is; the message says what to change."""


@dataclass(frozen=True, slots=True)
class Sidecar:
    """How sidecars are made (injector settings): images, ports, where the files go."""

    envoy_image: str
    init_image: str
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


def secret_name(proxy_id: str) -> str:
    return f"{SECRET_PREFIX}{proxy_id}"


def proxy_id_of(common_name: str) -> str:
    return ids.ProxyCommonName.parse(common_name).proxy_id


def secret(onboarded: Onboarding, key_pem: bytes) -> dict[str, Any]:
    """The Secret holding one proxy's files, by the names its bootstrap gives them."""
    files = onboarded.files
    proxy_id = proxy_id_of(onboarded.common_name)
    sds = files.sds
    assert sds is not None  # every ProxyRequest names its SDS file
    content = {
        # JSON is YAML: Envoy reads the .yaml files, and the injector needs no YAML writer
        BOOTSTRAP_FILE: json.dumps(onboarded.bootstrap, indent=1),
        files.cert_chain.name: onboarded.certificate.cert_chain_pem,
        files.key.name: key_pem.decode(),
        files.trust_bundle.name: onboarded.certificate.trust_bundle_pem,
        sds.name: json.dumps(proxy_secret_document(files.cert_chain, files.key), indent=1),
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": secret_name(proxy_id),
            "namespace": onboarded.request.namespace,
            "labels": {injection.PROXY_UUID_LABEL: proxy_id, **MANAGED_BY},
            "annotations": {
                "trellis.dev/proxy-common-name": onboarded.common_name,
                # what a renewal of the certificate asks certmanager for again
                "trellis.dev/proxy-service-account": onboarded.request.service_account,
            },
        },
        "data": {name: base64.b64encode(text.encode()).decode() for name, text in content.items()},
    }


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
    for name in (injection.INIT_CONTAINER, injection.SIDECAR_CONTAINER):
        if name in taken:
            raise InvalidPod(f"the pod already has a container named {name!r}: rename it")
    volumes = spec.get("volumes")
    if isinstance(volumes, list) and any(
        isinstance(v, dict) and v.get("name") == VOLUME for v in volumes
    ):
        raise InvalidPod(f"the pod already has a volume named {VOLUME!r}: rename it")


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


def _add(pod: Mapping[str, Any], parent: str, key: str, item: Any) -> dict[str, Any]:
    """Append ``item`` to the list at ``/parent/key``, creating the list if absent."""
    holder = pod.get(parent)
    if isinstance(holder, dict) and isinstance(holder.get(key), list):
        return {"op": "add", "path": f"/{parent}/{key}/-", "value": item}
    return {"op": "add", "path": f"/{parent}/{key}", "value": [item]}


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
    proxy_id: str,
    exclusions: injection.Exclusions,
    log_level: str = "",
) -> list[dict[str, Any]]:
    """The RFC 6902 operations that inject ``pod``; :class:`InvalidPod` if they cannot."""
    check_pod(pod)
    metadata = pod.get("metadata")
    has_labels = isinstance(metadata, dict) and isinstance(metadata.get("labels"), dict)
    ops: list[dict[str, Any]] = []
    if not isinstance(metadata, dict):
        ops.append({"op": "add", "path": "/metadata", "value": {}})
    if has_labels:
        path = f"/metadata/labels/{_escape(injection.PROXY_UUID_LABEL)}"
        ops.append({"op": "add", "path": path, "value": proxy_id})
    else:
        labels = {injection.PROXY_UUID_LABEL: proxy_id}
        ops.append({"op": "add", "path": "/metadata/labels", "value": labels})
    # Readable by Envoy's uid: only the envoy container mounts it, so the key is not in
    # the application's containers at all.
    volume = {"name": VOLUME, "secret": {"secretName": secret_name(proxy_id), "defaultMode": 0o444}}
    if sidecar.stats_port:
        ops += _scrape_annotations(metadata if isinstance(metadata, dict) else {}, sidecar)
    ops += probes.rewrites(pod)[1]
    ops.append(_add(pod, "spec", "initContainers", init_container(sidecar, exclusions)))
    ops.append(_add(pod, "spec", "containers", envoy_container(sidecar, log_level)))
    ops.append(_add(pod, "spec", "volumes", volume))
    return ops

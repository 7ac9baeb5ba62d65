"""Kubelet probes of an injected pod, rewritten to pass through the sidecar.

The kubelet probes from the node, in plaintext, to the pod's address. In an injected pod
that connection is redirected to Envoy's inbound port, which speaks mTLS only: an HTTP
probe of the application's port would fail, and the pod never become ready. As OSM does,
each container's HTTP ``livenessProbe``, ``readinessProbe`` and ``startupProbe`` is rewritten
to Envoy's probe listener for its kind (15901, 15902, 15903; left out of the inbound
redirection) at ``/trellis-<kind>-probe/<container>``, and Envoy forwards it to the
application's own port and path on ``127.0.0.1`` (``trellis_common.bootstrap.ProbeRoute``).
The probe's timing, headers and thresholds are kept.

Left as written: ``tcpSocket`` probes (the redirected connection is accepted by Envoy, so
they pass while Envoy runs, as in OSM and Istio), ``exec`` and ``grpc`` probes, and HTTPS
probes (exclude their port with ``inbound-port-exclusion-list``); a probe whose port names
no container port is left for the API server to refuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from trellis_common.bootstrap import ProbeRoute

#: The probe kind -> Envoy's listener port for it (OSM's ports).
PROBE_PORTS: Final = {"livenessProbe": 15901, "readinessProbe": 15902, "startupProbe": 15903}
_NAMES: Final = {
    "livenessProbe": "liveness",
    "readinessProbe": "readiness",
    "startupProbe": "startup",
}


def _target(container: Mapping[str, Any], port: object) -> int | None:
    if isinstance(port, int) and not isinstance(port, bool):
        return port if 0 < port < 65536 else None
    if isinstance(port, str):
        if port.isdigit():
            return _target(container, int(port))
        for declared in container.get("ports") or []:
            if isinstance(declared, dict) and declared.get("name") == port:
                return _target(container, declared.get("containerPort"))
    return None


def rewrites(pod: Mapping[str, Any]) -> tuple[list[ProbeRoute], list[dict[str, Any]]]:
    """The probe routes Envoy serves and the RFC 6902 operations that point the pod's
    probes at them."""
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    routes: list[ProbeRoute] = []
    ops: list[dict[str, Any]] = []
    for index, container in enumerate(containers if isinstance(containers, list) else []):
        if not isinstance(container, dict):
            continue
        for kind, listener_port in PROBE_PORTS.items():
            probe = container.get(kind)
            action = probe.get("httpGet") if isinstance(probe, dict) else None
            if not isinstance(action, dict):
                continue
            if str(action.get("scheme") or "HTTP").upper() != "HTTP":
                continue
            target = _target(container, action.get("port"))
            if target is None:
                continue
            path = f"/trellis-{_NAMES[kind]}-probe/{container.get('name', index)}"
            routes.append(ProbeRoute(listener_port, path, target, str(action.get("path") or "/")))
            rewritten = {**action, "port": listener_port, "path": path, "scheme": "HTTP"}
            rewritten.pop("host", None)  # the pod's address, where Envoy listens
            ops.append(
                {
                    "op": "replace",
                    "path": f"/spec/containers/{index}/{kind}/httpGet",
                    "value": rewritten,
                }
            )
    return routes, ops

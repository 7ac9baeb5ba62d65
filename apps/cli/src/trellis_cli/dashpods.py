"""The dashboard's sidecars in a cluster: the injected pods, read through port-forwards.

``trellis dashboard --kubeconfig ...`` (cluster mode, :mod:`trellis_cli.cluster`) has no
state directory to find sidecars in. It lists the pods instead (every namespace, or the
``--pod-namespace`` ones) and keeps those the injector made sidecars of: a container named
``envoy`` and the init container ``trellis-agent`` (what
``trellis_injector.domain.injection`` adds; the injector puts no label on the pod, and the
Prometheus annotations it adds may be the application's own). Each sidecar's Envoy admin
API listens on the pod's loopback (the port is in the bootstrap the agent is given,
``TRELLIS_AGENT_BOOTSTRAP``; 15000 by default), which a port-forward reaches as it reaches
any port of the pod, so each pod is read as a local sidecar is
(:class:`~trellis_cli.dashsources.AdminReader`: identity, counters, transport) through a
tunnel of :class:`~trellis_cli.cluster.Cluster`. Only GETs are sent.

At most ``max_forwards`` pods are read at once, so at most that many port-forwards are
open: each read of a pod is one connection (an HTTP client of its own, kept alive for the
pod's few requests), one websocket, closed when the pod is read.
The pods are listed again every :data:`LIST_EVERY` reads; the tunnels of pods that are gone
are closed. A pod that cannot be reached is an error line of the reading, and the page and
the terminal say how many of the injected pods were read.

The operator needs ``list`` on ``pods`` (cluster-wide, or in each ``--pod-namespace``) and
``create`` on ``pods/portforward``, besides what the other cluster commands need.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from trellis_cli import dashsources
from trellis_cli.dashsources import Reading
from trellis_cli.errors import CliError

SIDECAR_CONTAINER = "envoy"  # trellis_kube.injection.SIDECAR_CONTAINER
AGENT_CONTAINER = "trellis-agent"  # trellis_injector.domain.injection.AGENT_CONTAINER
AGENT_BOOTSTRAP_ENV = "TRELLIS_AGENT_BOOTSTRAP"
DEFAULT_ADMIN_PORT = 15000
#: The pods are listed again once in this many reads.
LIST_EVERY = 5
RBAC_HINT = "the dashboard needs list on pods and create on pods/portforward"


@dataclass(frozen=True)
class InjectedPod:
    namespace: str
    name: str
    admin_port: int
    running: bool

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _names(items: Any) -> set[str]:
    return {str(c.get("name")) for c in items or [] if isinstance(c, dict)}


def admin_port(pod: dict[str, Any]) -> int:
    """The sidecar's admin port, from the bootstrap its agent is given (else the default)."""
    for container in (pod.get("spec") or {}).get("initContainers") or []:
        if container.get("name") != AGENT_CONTAINER:
            continue
        for variable in container.get("env") or []:
            if variable.get("name") != AGENT_BOOTSTRAP_ENV:
                continue
            try:
                address = json.loads(variable.get("value") or "")["admin"]["address"]
                return int(address["socket_address"]["port_value"])
            except (ValueError, KeyError, TypeError):
                break
    return DEFAULT_ADMIN_PORT


def injected_pods(listing: dict[str, Any]) -> list[InjectedPod]:
    """The pods of a ``PodList`` that carry a Trellis sidecar, by namespace and name."""
    found = []
    for pod in listing.get("items") or []:
        metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if metadata.get("deletionTimestamp"):
            continue
        if SIDECAR_CONTAINER not in _names(spec.get("containers")):
            continue
        if AGENT_CONTAINER not in _names(spec.get("initContainers")):
            continue
        running = (pod.get("status") or {}).get("phase") == "Running"
        found.append(
            InjectedPod(metadata.get("namespace", ""), metadata["name"], admin_port(pod), running)
        )
    return sorted(found, key=lambda p: p.key)


class ClusterSidecars:
    """The injected pods' sidecars of ``cluster`` (a :class:`~trellis_cli.cluster.Cluster`),
    read through port-forwards, ``max_forwards`` at a time. ``say`` tells the terminal when
    the set of pods that cannot be reached changes."""

    def __init__(
        self,
        cluster: Any,
        namespaces: tuple[str, ...] = (),
        max_forwards: int = 8,
        say: Callable[[str], None] = print,
    ) -> None:
        self.cluster, self.namespaces, self.max_forwards = cluster, namespaces, max_forwards
        self.say = say
        self.reader = dashsources.AdminReader()
        self.pods: list[InjectedPod] = []
        self._list_error = ""
        self._reads = 0
        self._unreachable: tuple[str, ...] = ()

    def list_pods(self) -> list[InjectedPod]:
        """Every namespace's pods, or each ``--pod-namespace``'s."""
        paths = [
            f"/api/v1/namespaces/{urllib.parse.quote(n, safe='')}/pods" for n in self.namespaces
        ] or ["/api/v1/pods"]
        found: list[InjectedPod] = []
        for path in paths:
            found += injected_pods(self.cluster.get(path) or {})
        return found

    def read(self) -> Reading:
        if self._reads % LIST_EVERY == 0:
            try:
                pods = self.list_pods()
            except CliError as exc:  # the last list stays: the page says why it is old
                self._list_error = f"cannot list the pods: {exc.format_message()} ({RBAC_HINT})"
            else:
                self._list_error = ""
                self._close_gone(pods)
                self.pods = pods
        self._reads += 1
        running = [p for p in self.pods if p.running]
        errors = [self._list_error] if self._list_error else []
        samples, unreachable = [], []
        if running:
            with ThreadPoolExecutor(self.max_forwards) as pool:
                results = list(pool.map(self._read_one, running))
            for pod, result in zip(running, results, strict=True):
                if isinstance(result, str):
                    unreachable.append(pod.key)
                    errors.append(result)
                else:
                    samples.append(result)
        self._tell(unreachable, len(running))
        source = {
            "kind": "cluster",
            "where": self.cluster.where,
            "injected_pods": len(self.pods),
            "not_running": len(self.pods) - len(running),
            "read": len(samples),
            "unreachable": unreachable,
        }
        return Reading(samples, errors, source=source)

    def _read_one(self, pod: InjectedPod) -> Any:
        """The pod's sample, or why it could not be read. A client of its own: its
        connection (the port-forward) closes when the pod is read, not when all are."""
        tunnel = self.cluster.tunnel(pod.name, pod.admin_port, pod.namespace)
        try:
            with dashsources.client() as http:
                return self.reader.sample(http, f"http://127.0.0.1:{tunnel.local_port}", pod.key)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            return (
                f"pod {pod.key}: its sidecar's admin port {pod.admin_port} is not reachable "
                f"through a port-forward ({dashsources.described(exc)})"
            )

    def _close_gone(self, pods: list[InjectedPod]) -> None:
        kept = {(p.namespace, p.name, p.admin_port) for p in pods}
        for pod in self.pods:
            if (pod.namespace, pod.name, pod.admin_port) not in kept:
                self.cluster.untunnel(pod.name, pod.admin_port, pod.namespace)
        self.reader.forget(p.key for p in pods)

    def _tell(self, unreachable: list[str], running: int) -> None:
        now = tuple(unreachable)
        if now == self._unreachable:
            return
        self._unreachable = now
        if now:
            self.say(
                f"dashboard: {len(now)} of {running} injected pods could not be reached "
                f"through a port-forward: {', '.join(now)} (the page says why)"
            )
        else:
            self.say(f"dashboard: every injected pod is reached again ({running})")

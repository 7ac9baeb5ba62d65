"""What endpoints-k8s knows: informers on the API server, and the services they make.

One informer per kind, across all namespaces (``trellis_kube.informer``: list, then
watch from the list's resourceVersion, resume a dropped watch, list again after 410 and
deliver the difference), filtered to the monitored namespaces
(:class:`~trellis_kube.namespaces.MonitoredNamespaces`: a namespace that gains or
loses the label brings its services in or takes them out at once). Each change recomputes
only the services it touches (a slice: its service; a pod: the services whose slices name
it; a namespace: all of its services) and pushes each whose report changed to the
catalog's watches (:attr:`Watcher.feed`, ``WatchServices``: the service as it is now, or
removed).

ServiceAccounts are watched too: an endpoint names its pod's service account, and
``/v1/kubernetes`` counts them. A proxy's UUID (an injected pod's proxy is enrolled under
its pod's uid) resolves to its pod (:meth:`Watcher.proxy`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes import client

from trellis_common.changefeed import ChangeFeed
from trellis_endpoints_k8s.domain.services import ServiceView, service_of_slice, view
from trellis_kube.informer import Informer, Object
from trellis_kube.namespaces import MonitoredNamespaces

log = logging.getLogger(__name__)

Key = tuple[str, str]


class Watcher:
    def __init__(self, api: client.ApiClient, mesh_name: str, watch_timeout: int = 60) -> None:
        core: Any = client.CoreV1Api(api)
        discovery: Any = client.DiscoveryV1Api(api)
        self.namespaces = MonitoredNamespaces(core, mesh_name, watch_timeout=watch_timeout)
        lists = {
            "services": core.list_service_for_all_namespaces,
            "endpointslices": discovery.list_endpoint_slice_for_all_namespaces,
            "pods": core.list_pod_for_all_namespaces,
            "serviceaccounts": core.list_service_account_for_all_namespaces,
        }
        self.informers = {
            name: Informer(name, call, watch_timeout=watch_timeout) for name, call in lists.items()
        }
        self.views: dict[Key, ServiceView] = {}
        self.revision = 0
        #: The services changed, for the catalog's watches (``WatchServices``).
        self.feed: ChangeFeed[Key] = ChangeFeed()
        self.ready = asyncio.Event()
        self._dirty: set[Key] = set()
        self._wake = asyncio.Event()
        self.namespaces.on_change(lambda namespace, _: self._touch_namespace(namespace))
        self.informers["services"].subscribe(self._on_service)
        self.informers["endpointslices"].subscribe(self._on_slice)
        self.informers["pods"].subscribe(self._on_pod)

    # -- what changed (on the event loop, from the informers) -------------------------------

    def _mark(self, key: Key) -> None:
        self._dirty.add(key)
        self._wake.set()

    def _touch_namespace(self, namespace: str) -> None:
        for ns, name in self.informers["services"].objects:
            if ns == namespace:
                self._mark((ns, name))
        self._mark(("", ""))  # at least one pass, for readiness

    def _on_service(self, kind: str, old: Object | None, new: Object | None) -> None:
        obj = new if new is not None else old
        meta = (obj or {}).get("metadata") or {}
        self._mark((meta.get("namespace") or "", meta.get("name") or ""))

    def _on_slice(self, kind: str, old: Object | None, new: Object | None) -> None:
        for obj in (old, new):
            owner = service_of_slice(obj) if obj is not None else None
            if owner is not None:
                self._mark(owner)

    def _on_pod(self, kind: str, old: Object | None, new: Object | None) -> None:
        obj = new if new is not None else old
        meta = (obj or {}).get("metadata") or {}
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        for slice_ in self.informers["endpointslices"].objects.values():
            targets = [
                (e.get("targetRef") or {}).get("name")
                for e in slice_.get("endpoints") or ()
                if isinstance(e, dict)
            ]
            if name in targets and (slice_.get("metadata") or {}).get("namespace") == namespace:
                owner = service_of_slice(slice_)
                if owner is not None:
                    self._mark(owner)

    # -- recomputing ------------------------------------------------------------------------

    def _compute(self, key: Key) -> ServiceView | None:
        namespace = key[0]
        service = self.informers["services"].objects.get(key)
        if service is None or not self.namespaces.monitors(namespace):
            return None
        slices = [
            s
            for s in self.informers["endpointslices"].objects.values()
            if service_of_slice(s) == key
        ]
        return view(service, slices, self.informers["pods"].objects)

    async def _flush(self) -> None:
        dirty, self._dirty = self._dirty, set()
        self._wake.clear()
        for key in sorted(k for k in dirty if k != ("", "")):
            found = self._compute(key)
            if found == self.views.get(key):
                continue
            if found is None:
                self.views.pop(key, None)
            else:
                self.views[key] = found
                for warning in found.warnings:
                    log.warning("service.port_refused service=%s/%s %s", *key, warning)
            self.revision += 1
            self.feed.changed((key,))
            log.info(
                "service.changed service=%s/%s endpoints=%d",
                *key,
                len(found.endpoints) if found else -1,
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Recompute what the informers touched, once they have all listed."""
        await self.namespaces.synced.wait()
        for informer in self.informers.values():
            await informer.synced.wait()
        for key in self.informers["services"].objects:
            self._mark(key)
        await self._flush()
        self.ready.set()
        log.info("watcher.synced services=%d", len(self.views))
        while not stop.is_set():
            waits = {asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for wait in waits:
                wait.cancel()
            await self._flush()

    def components(self) -> dict[str, Callable[[asyncio.Event], Awaitable[None]]]:
        """Each informer is its own supervised loop (``/readyz`` names the one down)."""
        parts: dict[str, Callable[[asyncio.Event], Awaitable[None]]] = {
            "watch-namespaces": self.namespaces.run
        }
        for name, informer in self.informers.items():
            parts[f"watch-{name}"] = informer.run
        parts["services"] = self.run
        return parts

    # -- queries ----------------------------------------------------------------------------

    def list(self, namespace: str = "") -> list[ServiceView]:
        return [v for k, v in sorted(self.views.items()) if not namespace or k[0] == namespace]

    def proxy(self, proxy_uuid: str) -> Object | None:
        """The pod whose uid is ``proxy_uuid``: a pod's agent enrolls its proxy under the
        uid its token is bound to (never a label, which the pod's owner may write)."""
        for pod in self.informers["pods"].objects.values():
            if (pod.get("metadata") or {}).get("uid") == proxy_uuid:
                return pod
        return None

"""The namespaces a mesh monitors: those labelled ``trellis.dev/monitored-by=<mesh name>``.

One informer on namespaces with that label selector. A namespace that gains the label
arrives as ADDED and one that loses it as DELETED (the API server's watch cache translates a
label change that way), so membership is live. Consumers watch their kinds across all
namespaces and keep only what :meth:`MonitoredNamespaces.monitors` says; when membership
changes, the handlers given to :meth:`MonitoredNamespaces.on_change` re-evaluate what they
hold (a namespace that joins brings its objects in at once: they are already cached).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from trellis_kube.client import monitored_selector
from trellis_kube.informer import Informer, Object


class MonitoredNamespaces:
    def __init__(self, core_api: Any, mesh_name: str, *, watch_timeout: int = 60) -> None:
        self.mesh_name = mesh_name
        self.informer = Informer(
            "namespaces",
            core_api.list_namespace,
            label_selector=monitored_selector(mesh_name),
            watch_timeout=watch_timeout,
        )
        self._handlers: list[Callable[[str, bool], None]] = []
        self.informer.subscribe(self._changed)

    @property
    def synced(self) -> asyncio.Event:
        return self.informer.synced

    def names(self) -> set[str]:
        return {name for _, name in self.informer.objects}

    def monitors(self, namespace: str) -> bool:
        return ("", namespace) in self.informer.objects

    def on_change(self, handler: Callable[[str, bool], None]) -> None:
        """``handler(namespace, monitored)`` runs when a namespace joins or leaves."""
        self._handlers.append(handler)

    def _changed(self, kind: str, old: Object | None, new: Object | None) -> None:
        if kind == "MODIFIED":
            return  # still labelled: membership is unchanged
        obj = new if new is not None else old
        assert obj is not None
        name = (obj.get("metadata") or {}).get("name") or ""
        for handler in self._handlers:
            handler(name, kind == "ADDED")

    async def run(self, stop: asyncio.Event) -> None:
        await self.informer.run(stop)

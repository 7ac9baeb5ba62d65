"""proxy-cp's state: which proxy groups exist, their inputs, and their snapshots.

A group is the proxies of one identity that share per-proxy settings; they share one
snapshot (built once, serialized once). A group's inputs are its identity's view (from
the catalog) and its secret material (from certmanager), fetched when its first proxy
connects and followed while any proxy of the identity is connected. A new view or new
material rebuilds the snapshots of that identity's groups only; the transports then push
each proxy the types whose version changed. A snapshot that fails the consistency check
is refused and the last good one stays in force.

A proxy may have more than one stream at once (a reconnecting Envoy's new stream opens
before proxy-cp notices the old one is gone): attaching is counted per proxy and group, and
a proxy leaves its group only when its last stream detaches.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from trellis_api import catalog_pb2
from trellis_proxy_cp import types
from trellis_proxy_cp.cache.snapshot import Snapshot, make_resource
from trellis_proxy_cp.cache.store import InconsistentSnapshot, SnapshotCache
from trellis_proxy_cp.translate.endpoints import LoadAssignments
from trellis_proxy_cp.translate.proxy import translate
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.translate.settings import ProxySettings

log = logging.getLogger(__name__)


@dataclass
class Group:
    key: str
    identity: str
    service_account: str
    settings: ProxySettings
    proxies: set[str] = field(default_factory=set)
    built_at: float = 0.0
    last_error: str = ""


class ProxyControlPlane:
    def __init__(
        self,
        cache: SnapshotCache,
        fetch_view: Callable[[str, str], Awaitable[catalog_pb2.View]],
        fetch_material: Callable[[str, str], Awaitable[SecretMaterial]],
        forget: Callable[[str], None] = lambda identity: None,
        on_refused: Callable[[str, list[str]], None] = lambda key, problems: None,
    ) -> None:
        self.cache = cache
        self._fetch_view = fetch_view
        self._fetch_material = fetch_material
        self._forget = forget
        self._on_refused = on_refused
        self.groups: dict[str, Group] = {}
        self.views: dict[str, catalog_pb2.View] = {}
        self.materials: dict[str, SecretMaterial] = {}
        self.set_at: dict[str, float] = {}  # key -> when its latest snapshot was set
        self._locks: dict[str, asyncio.Lock] = {}
        self._attached: Counter[tuple[str, str]] = Counter()  # (proxy, key) -> streams
        self._streams: Counter[str] = Counter()  # proxy -> streams, any group
        # every group's load assignments, kept for reuse: a cluster in many views (or a
        # view rebuilt for another cluster's change) is built once
        self.load_assignments = LoadAssignments()

    @staticmethod
    def key_of(identity: str, settings: ProxySettings) -> str:
        return f"{identity}|{settings.key()}"

    async def attach(
        self, proxy: str, identity: str, service_account: str, settings: ProxySettings
    ) -> str:
        """Make sure the proxy's group has a snapshot; returns its snapshot key."""
        key = self.key_of(identity, settings)
        lock = self._locks.setdefault(identity, asyncio.Lock())
        async with lock:
            group = self.groups.get(key)
            if group is None:
                group = self.groups[key] = Group(key, identity, service_account, settings)
            group.proxies.add(proxy)
            self._attached[proxy, key] += 1
            self._streams[proxy] += 1
            try:
                if identity not in self.views:
                    self.views[identity] = await self._fetch_view(identity, service_account)
                if identity not in self.materials:
                    self.materials[identity] = await self._fetch_material(identity, service_account)
            except BaseException:
                # The stream is refused and will never detach: leave no group behind.
                self.detach(proxy, key)
                raise
            if self.cache.get(key) is None:
                self._build(group)
        return key

    def detach(self, proxy: str, key: str) -> None:
        """One stream of ``proxy`` closed; the proxy leaves the group with its last one."""
        attached = self._attached.pop((proxy, key), 0)
        if attached:
            self._streams[proxy] -= 1
            if not self._streams[proxy]:
                del self._streams[proxy]
        if attached > 1:
            self._attached[proxy, key] = attached - 1
            return
        group = self.groups.get(key)
        if group is None:
            return
        group.proxies.discard(proxy)
        if group.proxies:
            return
        del self.groups[key]
        self.cache.clear(key)
        if not any(g.identity == group.identity for g in self.groups.values()):
            self.views.pop(group.identity, None)
            self.materials.pop(group.identity, None)
            self._forget(group.identity)

    def streams_of(self, proxy: str) -> int:
        """How many streams of ``proxy`` are attached (any group)."""
        return self._streams[proxy]

    async def set_view(self, identity: str, view: catalog_pb2.View) -> None:
        self.views[identity] = view
        self._rebuild(identity)

    async def set_material(self, identity: str, material: SecretMaterial) -> None:
        self.materials[identity] = material
        self._rebuild(identity)

    def _rebuild(self, identity: str) -> None:
        for group in list(self.groups.values()):
            if group.identity == identity:
                self._build(group)

    def _build(self, group: Group) -> None:
        view = self.views.get(group.identity)
        material = self.materials.get(group.identity)
        if view is None or material is None:
            return
        version = f"{view.version}/{material.serial}"
        try:
            resources = translate(view, group.settings, material, self.load_assignments)
            built = [
                *(make_resource(types.LISTENER, m) for m in resources.listeners),
                *(make_resource(types.ROUTE, m) for m in resources.routes),
                *(make_resource(types.CLUSTER, m) for m in resources.clusters),
                *(make_resource(types.ENDPOINT, m) for m in resources.endpoints),
                *(make_resource(types.SECRET, m) for m in resources.secrets),
            ]
            self.cache.set_snapshot(group.key, Snapshot.of(version, built))
        except ValueError as exc:  # inconsistent, or resources no snapshot can hold
            problems = exc.problems if isinstance(exc, InconsistentSnapshot) else [str(exc)]
            group.last_error = "; ".join(problems)
            log.error(
                "snapshot.refused key=%s version=%s problems=%r action='the last good "
                "snapshot stays in force'",
                group.key,
                version,
                group.last_error,
            )
            self._on_refused(group.key, list(problems))
            return
        group.built_at = self.set_at[group.key] = time.monotonic()
        group.last_error = ""
        log.info(
            "snapshot.set key=%s version=%s proxies=%d", group.key, version, len(group.proxies)
        )

"""proxy-cp's state: which proxy groups exist, their inputs, and their snapshots.

A group is the proxies of one identity that share per-proxy settings; they share one
snapshot (built once, serialized once). A group's inputs are its identity's policy and the
slices the policy names (from the catalog: :mod:`.cache.inputs`) and its secret material
(from certmanager), fetched when its first proxy connects and followed while any proxy of
the identity is connected. What is rebuilt depends on what moved, as in Istio's pilot:

* a new policy rebuilds, in that identity's groups' snapshots, the kinds of resource
  whose translators read what changed in it (:func:`~.translate.scope.kinds_concerned`),
  and new certificate material their secrets; the other kinds stay the very resources
  they were;
* a slice whose endpoints moved (and nothing else: not its SPIFFE ids) rebuilds only the
  ClusterLoadAssignments of the groups that hold it, where the translators say nothing
  else reads those endpoints (:func:`~.translate.scope.endpoints_only`): the assignment is
  translated and serialized once (:class:`~.assignments.EndpointResources`) and every
  such group's snapshot takes it in place of the old one, its other types shared as they
  were (:meth:`~.cache.snapshot.Snapshot.with_type`);
* anything else a slice change touches rebuilds the group's snapshot whole.

The transports then push each proxy the types whose version changed. A snapshot that fails
the consistency check is refused and the last good one stays in force.

A proxy may have more than one stream at once (a reconnecting Envoy's new stream opens
before proxy-cp notices the old one is gone): attaching is counted per proxy and group, and
a proxy leaves its group only when its last stream detaches.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Set
from dataclasses import dataclass, field

from trellis_api import catalog_pb2
from trellis_proxy_cp import rebuilds, types
from trellis_proxy_cp.assignments import EndpointResources
from trellis_proxy_cp.cache import inputs
from trellis_proxy_cp.cache.snapshot import Resource, Snapshot, make_resource
from trellis_proxy_cp.cache.store import InconsistentSnapshot, SnapshotCache
from trellis_proxy_cp.translate import scope
from trellis_proxy_cp.translate.endpoints import is_eds
from trellis_proxy_cp.translate.proxy import KINDS, translate
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
    built_from: rebuilds.Built | None = None


class ProxyControlPlane:
    def __init__(
        self,
        cache: SnapshotCache,
        fetch_inputs: Callable[[str, str], Awaitable[inputs.Inputs]],
        fetch_material: Callable[[str, str], Awaitable[SecretMaterial]],
        forget: Callable[[str], None] = lambda identity: None,
        on_refused: Callable[[str, list[str]], None] = lambda key, problems: None,
        on_built: Callable[[frozenset[str]], None] = lambda kinds: None,
    ) -> None:
        self.cache = cache
        self._fetch_inputs = fetch_inputs
        self._fetch_material = fetch_material
        self._forget = forget
        self._on_refused = on_refused
        self._on_built = on_built
        self.groups: dict[str, Group] = {}
        self._keys_of: dict[str, set[str]] = {}  # identity -> its groups' keys
        self.policies: dict[str, catalog_pb2.View] = {}
        self.slices: dict[str, catalog_pb2.ClusterSlice] = {}
        self._holders: dict[str, set[str]] = {}  # slice name -> identities whose policy names it
        self.materials: dict[str, SecretMaterial] = {}
        self.set_at: dict[str, float] = {}  # key -> when its latest snapshot was set
        self._locks: dict[str, asyncio.Lock] = {}
        self._attached: Counter[tuple[str, str]] = Counter()  # (proxy, key) -> streams
        self._streams: Counter[str] = Counter()  # proxy -> streams, any group
        # every group's load assignments, by slice and version: each is built once
        self.endpoint_resources = EndpointResources()
        self._views: dict[str, tuple[tuple[object, ...], catalog_pb2.View]] = {}
        self.kinds_built: Counter[str] = Counter()  # kinds of resource translated, by group

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
                self._keys_of.setdefault(identity, set()).add(key)
            key = group.key  # the group's one string, not this call's copy, is kept below
            group.proxies.add(proxy)
            self._attached[proxy, key] += 1
            self._streams[proxy] += 1
            try:
                if identity not in self.policies:
                    fetched = await self._fetch_inputs(identity, service_account)
                    # a slice other groups hold may come newer than theirs: rebuild them
                    changed, endpoints_moved = self._store(fetched.slices)
                    self._set_policy(identity, fetched.policy)
                    self._rebuild_holders(changed, endpoints_moved, {identity})
                if identity not in self.materials:
                    self.materials[identity] = await self._fetch_material(identity, service_account)
            except BaseException:
                # The stream is refused and will never detach: leave no group behind.
                self.detach(proxy, key)
                raise
            if self.cache.get(key) is None:
                self._build(group)
        return group.key  # one string for every stream of the group

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
        keys = self._keys_of.get(group.identity)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._keys_of[group.identity]
        self.cache.clear(key)
        if group.identity not in self._keys_of:
            self._drop_policy(group.identity)
            self.materials.pop(group.identity, None)
            self._forget(group.identity)

    def follows(self, identity: str) -> bool:
        """Whether some group of ``identity`` is attached here."""
        return identity in self._keys_of

    def streams_of(self, proxy: str) -> int:
        """How many streams of ``proxy`` are attached (any group)."""
        return self._streams[proxy]

    async def set_view(self, identity: str, view: catalog_pb2.View) -> None:
        """A whole view (endpoints in its clusters): its policy and slices, applied."""
        found = inputs.split(view)
        await self.apply({identity: found.policy}, found.slices)

    async def apply(
        self,
        policies: Mapping[str, catalog_pb2.View],
        slices: Mapping[str, catalog_pb2.ClusterSlice | None],
    ) -> None:
        """New policies and slices (None: gone) from the catalog: rebuild what they touch."""
        changed, endpoints_moved = self._store(slices)
        rebuilt = {identity for identity, p in policies.items() if self._set_policy(identity, p)}
        for identity in sorted(rebuilt):
            self._rebuild(identity)
        self._rebuild_holders(changed, endpoints_moved, rebuilt)
        for name in slices:
            if name not in self._holders:  # a slice no policy held here names
                self.slices.pop(name, None)
        self.endpoint_resources.retain(lambda name: name in self._holders)

    def _store(
        self, slices: Mapping[str, catalog_pb2.ClusterSlice | None]
    ) -> tuple[set[str], set[str]]:
        """Keep new slices; (the names that changed, those of them whose endpoints alone
        moved). A slice of the version held changes nothing."""
        changed: set[str] = set()
        endpoints_moved: set[str] = set()
        for name, found in slices.items():
            before = self.slices.get(name)
            if found is None:
                if self.slices.pop(name, None) is not None:
                    changed.add(name)
                continue
            if before is not None and before.version == found.version and found.version:
                continue
            self.slices[name] = found
            changed.add(name)
            if before is not None and list(before.spiffe_ids) == list(found.spiffe_ids):
                endpoints_moved.add(name)
        return changed, endpoints_moved

    def _rebuild_holders(
        self, changed: set[str], endpoints_moved: set[str], skip: Set[str] = frozenset()
    ) -> None:
        """Rebuild the groups whose policies name a changed slice (but ``skip``): only
        their load assignments where only endpoints moved."""
        concerned: dict[str, set[str]] = {}
        for name in changed:
            for identity in self._holders.get(name, ()):
                concerned.setdefault(identity, set()).add(name)
        groups = 0
        for identity, names in sorted(concerned.items()):
            if identity not in skip:
                groups += self._rebuild(identity, names if names <= endpoints_moved else None)
        if concerned:
            log.debug(  # per change, as the catalog's resources_changed
                "snapshot.slices_moved slices=%d endpoints_only=%d identities=%d groups=%d",
                len(changed),
                len(changed & endpoints_moved),
                len(concerned),
                groups,
            )

    def _set_policy(self, identity: str, policy: catalog_pb2.View) -> bool:
        """Hold ``policy`` (a policy of one version is kept as it is); whether it moved."""
        before = self.policies.get(identity)
        if before is not None and before.version == policy.version and policy.version:
            return False
        self._drop_policy(identity, keep_slices=set(inputs.slice_names(policy)))
        self.policies[identity] = policy
        for name in inputs.slice_names(policy):
            self._holders.setdefault(name, set()).add(identity)
        return True

    def _drop_policy(self, identity: str, keep_slices: set[str] | None = None) -> None:
        before = self.policies.pop(identity, None)
        self._views.pop(identity, None)
        for name in inputs.slice_names(before) if before is not None else ():
            holders = self._holders.get(name)
            if holders is None:
                continue
            holders.discard(identity)
            if not holders:
                del self._holders[name]
                if keep_slices is None or name not in keep_slices:
                    self.slices.pop(name, None)
        if before is not None and keep_slices is None:  # the identity left: its EDS too
            self.endpoint_resources.retain(lambda name: name in self._holders)

    def view(self, identity: str) -> catalog_pb2.View | None:
        """The identity's whole view (its policy with its slices' endpoints), as translated."""
        policy = self.policies.get(identity)
        if policy is None:
            return None
        names = inputs.slice_names(policy)
        made_of = (policy, *(self.slices.get(n) for n in names))
        kept = self._views.get(identity)
        if (
            kept is not None
            and len(kept[0]) == len(made_of)
            and all(a is b for a, b in zip(kept[0], made_of, strict=True))
        ):
            return kept[1]
        view = inputs.assemble(policy, self.slices)
        self._views[identity] = (made_of, view)
        return view

    async def set_material(self, identity: str, material: SecretMaterial) -> None:
        self.materials[identity] = material
        self._rebuild(identity)

    def _rebuild(self, identity: str, slices: set[str] | None = None) -> int:
        """Rebuild the identity's groups; ``slices``: only these slices' endpoints moved.
        Returns how many groups there were."""
        keys = sorted(self._keys_of.get(identity, ()))
        for key in keys:
            self._build(self.groups[key], slices)
        return len(keys)

    def _build(self, group: Group, slices: set[str] | None = None) -> None:
        policy = self.policies.get(group.identity)
        material = self.materials.get(group.identity)
        if policy is None or material is None:
            return
        current = self.cache.get(group.key)
        built_from = group.built_from
        if (
            slices is not None
            and current is not None
            and built_from is not None
            and built_from.policy is policy
            and built_from.serial == material.serial
            and scope.endpoints_only(policy, group.settings, slices)
        ):
            self._build_endpoints(group, policy, material.serial, slices, current)
            return
        version = self._version(policy, material.serial)
        held = group.built_from
        kinds = rebuilds.kinds_to_build(
            held if current is not None else None,
            policy,
            material.serial,
            group.settings,
            self._slices_of(held.policy) if held is not None else (),
        )
        try:
            view = self.view(group.identity)
            assert view is not None
            settings = group.settings
            resources = translate(
                view,
                settings,
                material,
                self.endpoint_resources.assignments,
                with_endpoints=settings.proxyless,
                only=kinds,
            )
            built: list[Resource] = [
                *(make_resource(types.LISTENER, m) for m in resources.listeners),
                *(make_resource(types.ROUTE, m) for m in resources.routes),
                *(make_resource(types.CLUSTER, m) for m in resources.clusters),
                *(make_resource(types.SECRET, m) for m in resources.secrets),
                *(
                    (make_resource(types.ENDPOINT, m) for m in resources.endpoints)
                    if settings.proxyless
                    else self._endpoints(policy, settings.locality)
                    if "endpoints" in kinds
                    else ()
                ),
            ]
            if current is not None:  # the kinds not rebuilt: the very resources they were
                for kind, type_url in rebuilds.TYPE_OF_KIND.items():
                    if kind not in kinds:
                        built += current.of_type(type_url).values()
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
        group.built_from = rebuilds.Built(policy, material.serial, self._slices_of(policy))
        self._built(group, version, kinds=kinds)

    def _slices_of(self, policy: catalog_pb2.View) -> tuple[catalog_pb2.ClusterSlice | None, ...]:
        return tuple(self.slices.get(n) for n in inputs.slice_names(policy))

    def _endpoints(self, policy: catalog_pb2.View, locality: str) -> list[Resource]:
        if not policy.mesh.locality_failover:
            locality = ""  # off mesh-wide (MeshConfig): every proxy gets the same
        return [
            self.endpoint_resources(c, self.slices.get(c.slice), locality)
            for c in policy.clusters
            if is_eds(c)
        ]

    def _build_endpoints(
        self,
        group: Group,
        policy: catalog_pb2.View,
        serial: str,
        slices: set[str],
        current: Snapshot,
    ) -> None:
        """Only these slices' endpoints moved: swap their assignments, share the rest."""
        locality = group.settings.locality if policy.mesh.locality_failover else ""
        assignments = dict(current.of_type(types.ENDPOINT))
        for cluster in policy.clusters:
            if cluster.slice in slices and is_eds(cluster):
                found = self.slices.get(cluster.slice)
                assignments[cluster.name] = self.endpoint_resources(cluster, found, locality)
        version = self._version(policy, serial)
        self.cache.set_snapshot(
            group.key, current.with_type(types.ENDPOINT, assignments, version), checked=True
        )
        # no other kind reads these endpoints (scope.endpoints_only): the snapshot is as if
        # built from the slices as they are now
        group.built_from = rebuilds.Built(policy, serial, self._slices_of(policy))
        self._built(group, version, kinds=frozenset(("endpoints",)))

    def _version(self, policy: catalog_pb2.View, serial: str) -> str:
        """The snapshot's label: the policy's version, its slices' and the material's."""
        versions = "".join(
            (self.slices[n].version if n in self.slices else "-") + ","
            for n in inputs.slice_names(policy)
        )
        digest = hashlib.blake2b(versions.encode(), digest_size=6).hexdigest()
        return f"{policy.version}/{digest}/{serial}"

    def _built(self, group: Group, version: str, *, kinds: frozenset[str]) -> None:
        group.built_at = self.set_at[group.key] = time.monotonic()
        group.last_error = ""
        self.kinds_built.update(kinds)
        self._on_built(kinds)
        # an endpoints-only rebuild is the churn's: one line per group at debug, a summary
        # per change at info (_rebuild_holders)
        log.log(
            logging.DEBUG if kinds == {"endpoints"} else logging.INFO,
            "snapshot.set key=%s version=%s proxies=%d kinds=%s",
            group.key,
            version,
            len(group.proxies),
            ",".join(sorted(kinds)) if kinds != KINDS else "all",
        )

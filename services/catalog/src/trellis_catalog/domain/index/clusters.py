"""The clusters of the mesh: one per service port, versioned, shared by every view.

A cluster is one port of one known service with its endpoints and the SPIFFE ids its
workloads present. Every view that references it shares it, so a provider's report moves
one cluster's version and re-versions only the views that reference that cluster, without
recomputing any policy. A cluster's version is a digest of its content
(:func:`~trellis_catalog.domain.model.contentversion.cluster_version`): every catalog
replica gives it the same one, and a cluster that moves back to what it was gets its old
version back.
:meth:`Clusters.rebuild` refreshes the clusters of some services and says which names
changed; :attr:`Clusters.states` is the read-only mapping of cluster name
to :class:`ClusterState` (a live ``MappingProxyType``: every view's version reads it, on the
hot path of an endpoint change).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from trellis_catalog.domain.index import services as svc
from trellis_catalog.domain.model.contentversion import cluster_version, of
from trellis_catalog.domain.model.views import ClusterEndpoint, ClusterState
from trellis_common.memo import Members
from trellis_common.model import MeshService
from trellis_spec.steps import Steps, drain


class Clusters:
    def __init__(self) -> None:
        self._clusters: dict[str, ClusterState] = {}
        self.states: Mapping[str, ClusterState] = MappingProxyType(self._clusters)
        self._of: dict[MeshService, set[str]] = {}  # each service's cluster names
        self._trust_domain = ""  # the one the SPIFFE ids were built with
        self._endpoints: svc.ClusterEndpoints = Members(svc.cluster_endpoint)
        #: each cluster's endpoint digests (its version's parts), kept per endpoint object
        self._digests: Members[str, ClusterEndpoint, str] = Members(lambda e, _: of(e))

    def rebuild(
        self,
        scope: Iterable[MeshService],
        services: Mapping[MeshService, svc.KnownService],
        trust_domain: str,
    ) -> set[str]:
        """Rebuild the clusters of the services in ``scope`` from ``services`` (the index);
        returns the names that changed (new, moved or gone). A new trust domain changes
        every SPIFFE id, so it rebuilds every cluster."""
        return drain(self.rebuild_steps(scope, services, trust_domain))

    def rebuild_steps(
        self,
        scope: Iterable[MeshService],
        services: Mapping[MeshService, svc.KnownService],
        trust_domain: str,
    ) -> Steps[set[str]]:
        """:meth:`rebuild` in steps: the clusters are computed first, a step per service,
        and committed at the end in one go, so a reader never sees half of a rebuild."""
        if trust_domain != self._trust_domain:
            scope = set(services) | set(self._of)
        computed: list[tuple[MeshService, set[str], list[ClusterState]]] = []
        for service in scope:
            yield
            wanted: dict[str, ClusterState] = {}
            known = services.get(service)
            if known is not None:
                for port in known.ports:
                    state = svc.cluster(known, port, trust_domain, memo=self._endpoints)
                    wanted[state.ref.name] = state
            # compared and versioned here, in steps; the commit only writes what moved
            moved = [
                self._next(state) for name, state in wanted.items() if self._moved(name, state)
            ]
            computed.append((service, set(wanted), moved))
        self._trust_domain = trust_domain
        return self._commit(computed)

    def _moved(self, name: str, state: ClusterState) -> bool:
        old = self._clusters.get(name)
        return old is None or (old.ref, old.endpoints, old.spiffe_ids) != (
            state.ref,
            state.endpoints,
            state.spiffe_ids,
        )

    def _next(self, state: ClusterState) -> ClusterState:
        """``state`` with its content version."""
        digests = self._digests.convert(state.ref.name, state.endpoints)
        return ClusterState(
            state.ref, state.endpoints, state.spiffe_ids, cluster_version(state, digests)
        )

    def _commit(self, computed: list[tuple[MeshService, set[str], list[ClusterState]]]) -> set[str]:
        changed: set[str] = set()
        for service, wanted, moved in computed:
            for name in self._of.get(service, set()) - wanted:
                del self._clusters[name]
                self._endpoints.forget(name)
                self._digests.forget(name)
                changed.add(name)
            for state in moved:
                self._clusters[state.ref.name] = state
                changed.add(state.ref.name)
            if wanted:
                self._of[service] = wanted
            else:
                self._of.pop(service, None)
        return changed

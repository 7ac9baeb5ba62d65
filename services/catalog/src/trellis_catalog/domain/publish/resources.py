"""The resources the catalog publishes, versioned, in one change log with one cursor.

proxy-cp needs three kinds of resource, each with a name and a content version:

* ``policy/<namespace>/<service>``: an identity's
  :class:`~trellis_catalog.domain.model.views.IdentityPolicy` (what it may reach and how,
  who may reach it), whose clusters name their slice;
* ``slice/<cluster>[@<accounts>]``: a cluster's endpoints as the identities whose policy
  references it see them (:func:`slice_of`: only the endpoints of the service accounts the
  policy lets them reach, when it limits them, as OSM sends a client no other endpoint);
* ``destination/<namespace>/<name>``: a service as service discovery answers it
  (:mod:`.destinations`).

Which identities a change concerns is decided here, beside the policies: a policy concerns
its identity, a slice the identities whose policies reference it (it exists while one does,
and is gone with the last), a destination every discovery client. A change to one
cluster's endpoints re-versions its slices and nothing else: no policy moves.

Versions are digests of the content (:mod:`~trellis_catalog.domain.model.contentversion`),
the same on every catalog replica and across restarts. The cursor, ``"<epoch>-<revision>"``,
is the store's own: the revision counts the flushes that moved something, and the epoch
(creation time in hex milliseconds, then random hex) tells this store's cursors from
another's. A cursor from another replica or from before a restart gets a full listing
(every resource and its version), which the consumer compares with what it holds, so it
refetches only what differs. Versions carry no order; the catalog's module docstring states
the rule for a replica that lags.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from trellis_catalog.domain.model import contentversion
from trellis_catalog.domain.model.views import (
    ClusterEndpoint,
    ClusterRef,
    ClusterState,
    Identity,
    IdentityPolicy,
)
from trellis_common.model import MeshService
from trellis_spec.steps import Steps

__all__ = [
    "DESTINATION",
    "POLICY",
    "SLICE",
    "Published",
    "ResourceStore",
    "Slice",
    "destination_name",
    "new_epoch",
    "policy_name",
    "slice_name",
    "slice_of",
]

POLICY, SLICE, DESTINATION = "policy", "slice", "destination"
STEP = 50  # identities or slices between two steps (a policy digest: about 0.05 ms)


def policy_name(identity: Identity | str) -> str:
    return f"{POLICY}/{identity}"


def slice_name(ref: ClusterRef) -> str:
    """The slice a policy's cluster reference names: the cluster, and the accounts the
    reference limits it to (sorted, as the policy builder gives them)."""
    limited = f"@{','.join(ref.accounts)}" if ref.accounts else ""
    return f"{SLICE}/{ref.name}{limited}"


def destination_name(service: MeshService | str) -> str:
    return f"{DESTINATION}/{service}"


@dataclass(frozen=True, slots=True)
class Slice:
    cluster: str
    accounts: tuple[str, ...]
    endpoints: tuple[ClusterEndpoint, ...]
    spiffe_ids: tuple[str, ...]


def slice_of(state: ClusterState | None, cluster: str, accounts: tuple[str, ...]) -> Slice:
    """The cluster as the identities limited to ``accounts`` (empty: none) see it: only the
    endpoints of those accounts, and only their SPIFFE ids to verify. A cluster no provider
    reports yet has no endpoints."""
    if state is None:
        return Slice(cluster, accounts, (), ())
    if not accounts:
        return Slice(cluster, accounts, state.endpoints, state.spiffe_ids)
    allowed = set(accounts)
    return Slice(
        cluster,
        accounts,
        tuple(e for e in state.endpoints if e.service_account in allowed),
        tuple(i for i in state.spiffe_ids if i.rpartition("/sa/")[2] in allowed),
    )


@dataclass(frozen=True, slots=True)
class Published:
    """One flush's changes: (name, version) with version "" for a resource that is gone."""

    revision: int
    changes: tuple[tuple[str, str], ...]

    def of_kind(self, kind: str) -> list[tuple[str, str]]:
        prefix = kind + "/"
        return [(n, v) for n, v in self.changes if n.startswith(prefix)]


@dataclass
class _SliceRefs:
    """Which slices exist, and which identities' policies reference each."""

    concerns: dict[str, set[Identity]] = field(default_factory=dict)
    of_identity: dict[Identity, tuple[str, ...]] = field(default_factory=dict)
    by_cluster: dict[str, set[str]] = field(default_factory=dict)
    accounts: dict[str, tuple[str, str, tuple[str, ...]]] = field(default_factory=dict)


class ResourceStore:
    def __init__(self, epoch: str | None = None) -> None:
        self.epoch = epoch if epoch is not None else new_epoch()
        self.revision = 0
        self.versions: dict[str, str] = {}
        # name -> the revision that last moved it, in that order (a moved name is put last),
        # so what changed after a revision is read from the end, never by a scan of all
        self._changed_at: dict[str, int] = {}
        # each policy's object and its digest, kept while the object is the same
        self._policy_digests: dict[Identity, tuple[IdentityPolicy, str]] = {}
        self._slices = _SliceRefs()

    @property
    def cursor(self) -> str:
        """Where a consumer is once it has seen every change so far."""
        return f"{self.epoch}-{self.revision}"

    def since(self, cursor: str) -> tuple[str, bool, list[tuple[str, str]]]:
        """(next cursor, full?, [(name, version)]): what changed after ``cursor``.

        Version "" means gone. A cursor that is empty, malformed, from another epoch (a
        restarted catalog, another replica) or ahead of this store gets every resource
        (``full``): one missing from a full listing is gone.
        """
        epoch, _, revision = cursor.rpartition("-")
        since = int(revision) if revision.isascii() and revision.isdigit() else -1
        if epoch != self.epoch or not 0 <= since <= self.revision:
            return self.cursor, True, sorted(self.versions.items())
        changed = sorted(
            itertools.takewhile(
                lambda name: self._changed_at[name] > since, reversed(self._changed_at)
            )
        )
        return self.cursor, False, [(n, self.versions.get(n, "")) for n in changed]

    # -- what a change concerns ---------------------------------------------------------

    def concerned(self, name: str) -> set[Identity]:
        """The identities a slice concerns: those whose policies reference it."""
        return set(self._slices.concerns.get(name, ()))

    def slice_source(self, name: str) -> tuple[str, tuple[str, ...]] | None:
        """(cluster, accounts) of a slice some policy references, else None."""
        found = self._slices.accounts.get(name)
        return None if found is None else (found[1], found[2])

    def slices_of(self, identity: Identity) -> tuple[str, ...]:
        return self._slices.of_identity.get(identity, ())

    # -- publishing ---------------------------------------------------------------------

    def publish_steps(
        self,
        identities: Iterable[Identity],
        clusters_changed: Iterable[str],
        policies: Mapping[Identity, IdentityPolicy],
        clusters: Mapping[str, ClusterState],
        destinations: Iterable[tuple[MeshService, str]] = (),
    ) -> Steps[Published | None]:
        """Version what moved: the policies of ``identities`` (changed or gone), the slices
        of ``clusters_changed`` and those the new policies reference or no longer do, and
        ``destinations`` ((service, version), "" for gone). Committed in one go at the end,
        as one revision; None when nothing moved."""
        changes: dict[str, str] = {}
        digests = contentversion.Digests()  # this pass's: the policies' parts, once each
        touched_slices: set[str] = set()
        for position, identity in enumerate(sorted(set(identities))):
            if position % STEP == 0:
                yield
            name = policy_name(identity)
            policy = policies.get(identity)
            before = set(self._slices.of_identity.get(identity, ()))
            if policy is None:
                self._policy_digests.pop(identity, None)
                if name in self.versions:
                    changes[name] = ""
                now: dict[str, ClusterRef] = {}
            else:
                held = self._policy_digests.get(identity)
                if held is None or held[0] is not policy:
                    held = self._policy_digests[identity] = (policy, digests.policy(policy))
                if self.versions.get(name) != held[1]:
                    changes[name] = held[1]
                now = {slice_name(ref): ref for ref in policy.clusters}
            self._reference(identity, before, now)
            touched_slices |= before.symmetric_difference(now)
        for cluster in clusters_changed:
            touched_slices |= self._slices.by_cluster.get(cluster, set())
        for position, name in enumerate(sorted(touched_slices)):
            if position % STEP == 0:
                yield
            source = self._slices.accounts.get(name)
            if source is None:
                if name in self.versions:
                    changes[name] = ""
                continue
            state = clusters.get(source[1])
            version = contentversion.of(
                (state.version if state is not None else contentversion.ABSENT, source[2])
            )
            if self.versions.get(name) != version:
                changes[name] = version
        for service, version in destinations:
            changes[destination_name(service)] = version
        return self._commit(changes)

    def _reference(
        self, identity: Identity, before: set[str], now: Mapping[str, ClusterRef]
    ) -> None:
        refs = self._slices
        for name in before - set(now):
            viewers = refs.concerns.get(name)
            if viewers is None:
                continue
            viewers.discard(identity)
            if not viewers:
                del refs.concerns[name]
                cluster = refs.accounts.pop(name)[1]
                names = refs.by_cluster[cluster]
                names.discard(name)
                if not names:
                    del refs.by_cluster[cluster]
        for name, ref in now.items():
            refs.concerns.setdefault(name, set()).add(identity)
            if name not in refs.accounts:
                refs.accounts[name] = (name, ref.name, ref.accounts)
                refs.by_cluster.setdefault(ref.name, set()).add(name)
        if now:
            refs.of_identity[identity] = tuple(now)
        else:
            refs.of_identity.pop(identity, None)

    def _commit(self, changes: Mapping[str, str]) -> Published | None:
        moved = sorted((n, v) for n, v in changes.items() if self.versions.get(n, "") != v)
        if not moved:
            return None
        self.revision += 1
        for name, version in moved:
            self._changed_at.pop(name, None)  # to the end: the dict stays in revision order
            self._changed_at[name] = self.revision
            if version:
                self.versions[name] = version
            else:
                self.versions.pop(name, None)
        return Published(self.revision, tuple(moved))


def new_epoch() -> str:
    """A store's epoch: its creation time in hex milliseconds, then 32 random bits in hex."""
    return format(int(time.time() * 1000), "x") + secrets.token_hex(4)

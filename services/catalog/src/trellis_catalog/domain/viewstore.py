"""The versions of the views: which identity's view changed, and under which version.

A view is an identity's policy plus the clusters the policy references. Its version moves
when the policy object is replaced (the recompute keeps the old object when the new one is
equal) or when one of its clusters gets a new version; it does not move for anything else.

Versions are ``"<epoch>-<revision>"``: the revision counts the batches of changed views,
and the epoch (the store's creation time, in hex milliseconds) makes sure a restarted
catalog never hands out a version it used before. One batch, one revision: every view a
flush changed gets the same version, announced together as a :class:`ViewBatch`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from trellis_catalog.domain.steps import Steps, drain
from trellis_catalog.domain.views import ClusterState, Identity, IdentityPolicy

STEP = 500  # identities between two steps


@dataclass(frozen=True, slots=True)
class ViewBatch:
    revision: int
    identities: tuple[tuple[str, str], ...]  # (identity, version); version "" = removed


class ViewStore:
    def __init__(self, epoch: str | None = None) -> None:
        self.epoch = epoch if epoch is not None else format(int(time.time() * 1000), "x")
        self.revision = 0
        self.versions: dict[Identity, str] = {}
        # what the current version of each view was stamped for: its policy object and
        # the versions of the clusters it references
        self._view_key: dict[Identity, tuple[object, ...]] = {}
        self._referenced_by: dict[str, set[Identity]] = {}
        self._references: dict[Identity, tuple[str, ...]] = {}  # the clusters each view names
        # the revision at which each identity's view last changed (removals too)
        self._changed_at: dict[str, int] = {}

    @property
    def cursor(self) -> str:
        """Where a consumer is once it has seen every change so far."""
        return f"{self.epoch}-{self.revision}"

    def since(self, cursor: str) -> tuple[str, bool, list[tuple[str, str]]]:
        """(next cursor, full?, [(identity, version)]): what changed after ``cursor``.

        Version "" means removed. A cursor that is empty, malformed, from another epoch
        (a restarted catalog) or ahead of this store gets every identity (``full``): an
        identity missing from a full listing has no view.
        """
        epoch, _, revision = cursor.rpartition("-")
        since = int(revision) if revision.isascii() and revision.isdigit() else -1
        if epoch != self.epoch or not 0 <= since <= self.revision:
            return self.cursor, True, sorted((str(i), v) for i, v in self.versions.items())
        changed = sorted(i for i, at in self._changed_at.items() if at > since)
        return (
            self.cursor,
            False,
            [(i, self.versions.get(Identity.parse(i), "")) for i in changed],
        )

    def version_of(self, identity: Identity) -> str:
        return self.versions.get(identity, "0")

    def index_references_steps(
        self, policies: Mapping[Identity, IdentityPolicy], identities: Iterable[Identity]
    ) -> Steps[None]:
        """Learn which clusters the views of ``identities`` (whose policies changed or went
        away) reference now, in steps; the others' references stay as they were."""
        for position, identity in enumerate(identities):
            if position % STEP == 0:
                yield
            for name in self._references.pop(identity, ()):
                viewers = self._referenced_by[name]
                viewers.discard(identity)
                if not viewers:
                    del self._referenced_by[name]
            policy = policies.get(identity)
            if policy is not None:
                self._references[identity] = policy.cluster_names
                for name in policy.cluster_names:
                    self._referenced_by.setdefault(name, set()).add(identity)

    def referencing(self, clusters: Iterable[str]) -> set[Identity]:
        """The identities whose views reference any of ``clusters``."""
        found: set[Identity] = set()
        for name in clusters:
            found |= self._referenced_by.get(name, set())
        return found

    def stamp(
        self,
        touched: Iterable[Identity],
        policies: Mapping[Identity, IdentityPolicy],
        clusters: Mapping[str, ClusterState],
    ) -> ViewBatch | None:
        """Give a new version to each ``touched`` identity whose view really changed (and
        drop the version of one with no policy any more); None when none did."""
        return drain(self.stamp_steps(touched, policies, clusters))

    def stamp_steps(
        self,
        touched: Iterable[Identity],
        policies: Mapping[Identity, IdentityPolicy],
        clusters: Mapping[str, ClusterState],
    ) -> Steps[ViewBatch | None]:
        """:meth:`stamp` in steps (of :data:`STEP` identities)."""
        changed: list[Identity] = []
        for position, identity in enumerate(sorted(touched)):
            if position % STEP == 0:
                yield
            policy = policies.get(identity)
            if policy is None:
                if self.versions.pop(identity, None) is not None:
                    self._view_key.pop(identity, None)
                    changed.append(identity)
                continue
            key = (
                id(policy),
                tuple(clusters[n].version if n in clusters else 0 for n in policy.cluster_names),
            )
            if self._view_key.get(identity) != key:
                self._view_key[identity] = key
                changed.append(identity)
        if not changed:
            return None
        self.revision += 1
        version = f"{self.epoch}-{self.revision}"
        stamped = []
        for identity in changed:
            text = str(identity)
            self._changed_at[text] = self.revision
            if identity in policies:
                self.versions[identity] = version
                stamped.append((text, version))
            else:
                stamped.append((text, ""))
        return ViewBatch(self.revision, tuple(stamped))

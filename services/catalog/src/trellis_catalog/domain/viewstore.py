"""The versions of the views: which identity's view changed, and under which version.

A view is an identity's policy plus the clusters the policy references. Its version is a
digest of that content (:mod:`.contentversion`): of the policy, and of the content versions
of the clusters it names. So it moves when, and only when, the view's content does, and
every catalog replica, fed the same inputs, gives every view the same version, before and
after a restart: a consumer (proxy-cp) that switches replica, or follows one that
restarted, refetches only the views that really differ.

What is per replica is the cursor, ``"<epoch>-<revision>"``: the revision counts the
batches of changed views, and the epoch (the store's creation time in hex milliseconds,
then random hex, so two replicas started in the same millisecond still differ) tells a
cursor of this store from another's. A cursor from another replica, or from before a
restart, gets a full listing (every identity with its version), which the consumer
compares with the versions it holds. One flush, one batch, one revision: every view a flush
changed is announced together as a :class:`ViewBatch`.

Versions carry no order. A replica that has not yet applied an input the other has (it
heard the same signal a moment later) serves the older view, under the older content's
version, until its next flush, which signals ``views`` again; a consumer that switched to
it in that moment takes the older view and then the newer one. That flap is accepted:
it lasts one flush of the lagging replica (see the catalog's module docstring).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from trellis_catalog.domain import contentversion
from trellis_catalog.domain.steps import Steps, drain
from trellis_catalog.domain.views import ClusterState, Identity, IdentityPolicy

STEP = 500  # identities between two steps


@dataclass(frozen=True, slots=True)
class ViewBatch:
    revision: int
    identities: tuple[tuple[str, str], ...]  # (identity, version); version "" = removed


class ViewStore:
    def __init__(self, epoch: str | None = None) -> None:
        self.epoch = epoch if epoch is not None else new_epoch()
        self.revision = 0
        self.versions: dict[Identity, str] = {}
        # each view's policy object and its digest, kept while the object is the same
        self._policy_digests: dict[Identity, tuple[IdentityPolicy, str]] = {}
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
        """:meth:`stamp` in steps (of :data:`STEP` identities); the new versions are
        committed at the end, in one go."""
        changed: list[tuple[Identity, str]] = []  # version "": removed
        digests = contentversion.Digests()  # this pass's: the policies' parts, once each
        for position, identity in enumerate(sorted(touched)):
            if position % STEP == 0:
                yield
            policy = policies.get(identity)
            if policy is None:
                if identity in self.versions:
                    changed.append((identity, ""))
                continue
            held = self._policy_digests.get(identity)
            if held is None or held[0] is not policy:
                held = (policy, digests.policy(policy))
                self._policy_digests[identity] = held
            version = contentversion.of(
                (
                    held[1],
                    tuple(
                        clusters[n].version if n in clusters else contentversion.ABSENT
                        for n in policy.cluster_names
                    ),
                )
            )
            if self.versions.get(identity) != version:
                changed.append((identity, version))
        if not changed:
            return None
        self.revision += 1
        for identity, version in changed:
            self._changed_at[str(identity)] = self.revision
            if version:
                self.versions[identity] = version
            else:
                del self.versions[identity]
                self._policy_digests.pop(identity, None)
        return ViewBatch(self.revision, tuple((str(i), v) for i, v in changed))


def new_epoch() -> str:
    """A store's epoch: its creation time in hex milliseconds, then 32 random bits in hex."""
    return format(int(time.time() * 1000), "x") + secrets.token_hex(4)

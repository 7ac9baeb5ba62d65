"""Content versions: a short digest of what a consumer is given, the same on every replica.

The catalog runs active-active: each replica computes the views, clusters and destinations
from the same inputs (the spec, the providers' reports, certmanager's proxy records), and a
consumer (proxy-cp) may ask either one. So every version a consumer compares is a function of
the content alone: two replicas, or one replica before and after a restart, give the same
version to the same content, and a consumer that switches replica refetches only what really
differs. Versions carry no order: equal or not is all a consumer may ask of them.

A version is the first 64 bits of BLAKE2b over the ``repr`` of the content, in hex. The
domain's values are frozen dataclasses, tuples, strings, numbers and ``None``, whose
``repr`` depends on nothing but their content (no set, dict or object address in them:
anything iterated from a set is sorted before it becomes a tuple), so it is canonical
within one release of the code. A release that changes a value's fields changes its
versions once, which costs a consumer one refetch; replicas of two releases side by side
(a rolling upgrade) may disagree for as long as the upgrade lasts.

A policy is large and shares its parts (one :class:`~.views.OutboundService` serves every
client that may reach the service), so :class:`Digests` digests each part of a policy's
tuples once per pass and the policy from its parts' digests.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

from trellis_catalog.domain.model.views import ClusterState, IdentityPolicy

__all__ = ["ABSENT", "Digests", "cluster_version", "of"]

#: The version of what does not exist (a cluster a policy names before any provider
#: reports it); no digest is empty.
ABSENT = ""


def of(content: object) -> str:
    """The version of ``content`` (see the module's docstring)."""
    return hashlib.blake2b(repr(content).encode(), digest_size=8).hexdigest()


def cluster_version(state: ClusterState, endpoints: Sequence[str] | None = None) -> str:
    """A cluster's version: its reference, endpoints and SPIFFE ids (not its old version).

    The endpoints count by their own digests, in order: ``endpoints`` are those digests
    when the caller kept them (:class:`~trellis_common.memo.Members`: a cluster of 200
    endpoints whose one moved digests one, where a ``repr`` of all 200 cost a millisecond),
    else they are computed here. Either way the version is the same.
    """
    digests = tuple(endpoints) if endpoints is not None else tuple(map(of, state.endpoints))
    return of((state.ref, digests, state.spiffe_ids))


class Digests:
    """Digests of policies, each part digested once while this object lives.

    Parts are remembered by identity and held, so an id is never reused for another part
    while it is remembered: make one per pass (a flush), and drop it after.
    """

    def __init__(self) -> None:
        self._parts: dict[int, tuple[object, str]] = {}

    def part(self, value: object) -> str:
        found = self._parts.get(id(value))
        if found is not None and found[0] is value:
            return found[1]
        digest = of(value)
        self._parts[id(value)] = (value, digest)
        return digest

    def policy(self, policy: IdentityPolicy) -> str:
        """The policy's digest: its scalar fields as they are, its tuples by their parts'."""
        fields: list[tuple[str, str | tuple[str, ...]]] = []
        for field in dataclasses.fields(policy):
            value = getattr(policy, field.name)
            if isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
                fields.append((field.name, tuple(self.part(v) for v in value)))
            else:
                fields.append((field.name, repr(value)))
        return of(tuple(fields))

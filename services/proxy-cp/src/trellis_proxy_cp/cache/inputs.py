"""What a group's snapshot is made of: its identity's policy and the slices it names.

The catalog publishes an identity's policy (a ``View`` whose clusters carry no endpoints,
each naming its ``ClusterSlice``) apart from the slices, so a change to one cluster's
endpoints moves one slice and no policy. :func:`assemble` puts the two back together into
the whole view the translators read; :func:`split` does the reverse, for a whole view from
elsewhere (tests, the benchmark, ``set_view``).

A policy's version is a digest of its content (the catalog's, or :func:`split`'s), so two
policies with one version are the same policy: the control plane keeps the one it has.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from trellis_api import catalog_pb2 as pb

SLICE_PREFIX = "slice/"


@dataclass(frozen=True, slots=True)
class Inputs:
    """An identity's policy and the slices its clusters name (a slice missing from
    ``slices``: its cluster has no endpoints)."""

    policy: pb.View
    slices: Mapping[str, pb.ClusterSlice]


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def split(view: pb.View) -> Inputs:
    """A whole view as a policy and its slices. A cluster that names no slice gets
    ``slice/<cluster>``; a slice's version is its cluster's, else a digest of its content;
    the policy's version is a digest of the policy (endpoints left out), so a view that
    differs only in endpoints keeps its policy's version."""
    policy = pb.View()
    policy.CopyFrom(view)
    slices: dict[str, pb.ClusterSlice] = {}
    for cluster in policy.clusters:
        name = cluster.slice or f"{SLICE_PREFIX}{cluster.name}"
        found = pb.ClusterSlice(
            cluster=cluster.name, endpoints=cluster.endpoints, spiffe_ids=cluster.spiffe_ids
        )
        found.version = cluster.version or _digest(found.SerializeToString(deterministic=True))
        slices[name] = found
        del cluster.endpoints[:]
        del cluster.spiffe_ids[:]
        cluster.ClearField("version")
        cluster.slice = name
    policy.ClearField("version")
    policy.version = _digest(policy.SerializeToString(deterministic=True))
    return Inputs(policy, slices)


def assemble(policy: pb.View, slices: Mapping[str, pb.ClusterSlice]) -> pb.View:
    """The whole view: ``policy`` with each cluster's endpoints and SPIFFE ids from its
    slice (none for a slice not in ``slices``)."""
    view = pb.View()
    view.CopyFrom(policy)
    for cluster in view.clusters:
        found = slices.get(cluster.slice)
        if found is not None:
            cluster.endpoints.extend(found.endpoints)
            cluster.spiffe_ids.extend(found.spiffe_ids)
            cluster.version = found.version
    return view


def slice_names(policy: pb.View) -> tuple[str, ...]:
    return tuple(dict.fromkeys(c.slice for c in policy.clusters if c.slice))

"""The resource store alone: policies, slices and destinations in one change log.

A policy's version is a digest of its content; a slice's, of its cluster's content version
and the accounts it is limited to; a destination's is given. One publish that moves
something is one revision, and the cursor is the store's own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from trellis_catalog.domain.model import contentversion
from trellis_catalog.domain.model.views import (
    ClusterEndpoint,
    ClusterRef,
    ClusterState,
    Identity,
    IdentityPolicy,
    MeshSettings,
)
from trellis_catalog.domain.publish.resources import (
    Published,
    ResourceStore,
    destination_name,
    new_epoch,
    policy_name,
    slice_name,
    slice_of,
)
from trellis_common.model import MeshService
from trellis_spec.steps import drain

BUYER = Identity("shop", "buyer")
THIEF = Identity("shop", "thief")
STORE = ClusterRef("shop/store|80", "shop", "store", 80, "http", "STATIC", True)
OTHER = ClusterRef("shop/other|80", "shop", "other", 80, "http", "STATIC", True)
LIMITED = replace(STORE, accounts=("", "store"))  # endpoints of no account run as the service's
STORE_SLICE, LIMITED_SLICE = "slice/shop/store|80", "slice/shop/store|80@,store"
SHOP = MeshService("shop", "store")


def policy(identity: Identity, *clusters: ClusterRef) -> IdentityPolicy:
    return IdentityPolicy(
        identity=identity,
        service_account=identity.service,
        spiffe_id=f"spiffe://cluster.local/ns/{identity.namespace}/sa/{identity.service}",
        mesh=MeshSettings(),
        outbound=(),
        external=(),
        inbound=(),
        clusters=clusters,
    )


def cluster(ref: ClusterRef, version: str) -> ClusterState:
    """The cluster with two endpoints, one of the account ``store`` and one of ``canary``."""
    endpoints = (
        ClusterEndpoint("10.0.0.1", 8080, service_account="store"),
        ClusterEndpoint("10.0.0.2", 8080, service_account="canary"),
    )
    ids = tuple(f"spiffe://cluster.local/ns/shop/sa/{a}" for a in ("canary", "store"))
    return ClusterState(ref, endpoints, ids, version)


def publish(
    store: ResourceStore,
    identities: Iterable[Identity],
    policies: Mapping[Identity, IdentityPolicy],
    clusters: Mapping[str, ClusterState] | None = None,
    changed: Iterable[str] = (),
    destinations: Iterable[tuple[MeshService, str]] = (),
) -> Published | None:
    return drain(store.publish_steps(identities, changed, policies, clusters or {}, destinations))


def test_one_publish_one_revision_and_each_policy_versioned_by_its_content() -> None:
    store = ResourceStore(epoch="e")
    policies = {BUYER: policy(BUYER, STORE), THIEF: policy(THIEF)}
    clusters = {STORE.name: cluster(STORE, "c1")}
    published = publish(store, [THIEF, BUYER], policies, clusters)
    assert published is not None
    assert published.revision == store.revision == 1
    versions = store.versions
    assert published.changes == (
        ("policy/shop/buyer", versions["policy/shop/buyer"]),
        ("policy/shop/thief", versions["policy/shop/thief"]),
        (STORE_SLICE, versions[STORE_SLICE]),
    )
    assert published.of_kind("slice") == [(STORE_SLICE, versions[STORE_SLICE])]
    # a policy's version is its content's digest: two contents, two versions
    assert versions[policy_name(BUYER)] == contentversion.Digests().policy(policies[BUYER])
    assert versions[policy_name(BUYER)] != versions[policy_name(THIEF)]
    assert store.cursor == "e-1"
    # published again with nothing new: nothing, and no revision
    assert publish(store, [BUYER, THIEF], policies, clusters, [STORE.name]) is None
    assert store.revision == 1


def test_the_same_content_has_the_same_version_in_every_store() -> None:
    """Two replicas (two stores, other epochs, other orders and batches of the same
    identities) give every resource the same version: a function of the content alone."""
    first, second = ResourceStore(), ResourceStore()
    assert first.epoch != second.epoch
    clusters = {STORE.name: cluster(STORE, "c1")}
    policies = {BUYER: policy(BUYER, STORE), THIEF: policy(THIEF, LIMITED)}
    publish(first, [BUYER, THIEF], policies, clusters, destinations=[(SHOP, "d1")])
    publish(second, [THIEF], {THIEF: policy(THIEF, LIMITED)}, clusters)
    publish(second, [BUYER], policies, clusters, destinations=[(SHOP, "d1")])
    assert first.versions == second.versions
    assert (first.revision, second.revision) == (1, 2)  # the cursors are each store's own


def test_an_equal_new_policy_object_keeps_the_version() -> None:
    """The recompute keeps the old object when the new policy is equal; a new object that
    is equal (another replica's, or after a restart) has the same content, so the same
    version: nothing is published."""
    store = ResourceStore(epoch="e")
    first = policy(BUYER)
    publish(store, [BUYER], {BUYER: first})
    version = store.versions[policy_name(BUYER)]
    second = policy(BUYER)
    assert second == first
    assert second is not first
    assert publish(store, [BUYER], {BUYER: second}) is None
    assert store.versions[policy_name(BUYER)] == version
    other = replace(second, service_account="other")
    published = publish(store, [BUYER], {BUYER: other})
    assert published == Published(2, (("policy/shop/buyer", store.versions["policy/shop/buyer"]),))
    assert store.versions[policy_name(BUYER)] != version


def test_a_cluster_change_moves_only_its_slices_not_any_policy() -> None:
    store = ResourceStore(epoch="e")
    policies = {BUYER: policy(BUYER, STORE, OTHER), THIEF: policy(THIEF, LIMITED)}
    clusters = {STORE.name: cluster(STORE, "c1"), OTHER.name: cluster(OTHER, "o1")}
    publish(store, policies, policies, clusters)
    before = dict(store.versions)
    moved = {**clusters, STORE.name: cluster(STORE, "c2")}
    published = publish(store, [], policies, moved, [STORE.name, "shop/nobody|80"])
    assert published is not None
    # both slices of the cluster, the whole one and the limited one; no policy, no OTHER
    assert published.changes == (
        (STORE_SLICE, store.versions[STORE_SLICE]),
        (LIMITED_SLICE, store.versions[LIMITED_SLICE]),
    )
    assert store.versions[STORE_SLICE] != before[STORE_SLICE]
    assert {n: v for n, v in store.versions.items() if n.startswith("policy/")} == {
        n: v for n, v in before.items() if n.startswith("policy/")
    }
    # a cluster no slice comes from moves nothing
    assert publish(store, [], policies, moved, ["shop/nobody|80"]) is None
    # the cluster back as it was: the slices' versions are the ones they had
    publish(store, [], policies, clusters, [STORE.name])
    assert store.versions == before


def test_a_slice_limited_to_accounts_has_its_own_name_and_version() -> None:
    assert slice_name(STORE) == STORE_SLICE
    assert slice_name(LIMITED) == LIMITED_SLICE
    store = ResourceStore(epoch="e")
    policies = {BUYER: policy(BUYER, STORE), THIEF: policy(THIEF, LIMITED)}
    publish(store, policies, policies, {STORE.name: cluster(STORE, "c1")})
    assert store.versions[LIMITED_SLICE] != store.versions[STORE_SLICE]
    assert store.versions[LIMITED_SLICE] == contentversion.of(("c1", ("", "store")))
    assert store.slice_source(LIMITED_SLICE) == (STORE.name, ("", "store"))
    assert store.slice_source("slice/shop/store|80@canary") is None  # nobody references it
    assert (store.concerned(STORE_SLICE), store.concerned(LIMITED_SLICE)) == ({BUYER}, {THIEF})
    assert store.slices_of(THIEF) == (LIMITED_SLICE,)
    # what the limited slice holds: its accounts' endpoints and SPIFFE ids only
    limited = slice_of(cluster(STORE, "c1"), STORE.name, LIMITED.accounts)
    assert [e.address for e in limited.endpoints] == ["10.0.0.1"]
    assert limited.spiffe_ids == ("spiffe://cluster.local/ns/shop/sa/store",)
    whole = slice_of(cluster(STORE, "c1"), STORE.name, ())
    assert [e.address for e in whole.endpoints] == ["10.0.0.1", "10.0.0.2"]
    # a cluster no provider reports yet: a slice without endpoints, still versioned
    assert slice_of(None, STORE.name, ()).endpoints == ()
    fresh = ResourceStore(epoch="e")
    publish(fresh, [BUYER], policies)
    assert fresh.versions[STORE_SLICE] == contentversion.of((contentversion.ABSENT, ()))


def test_a_slice_goes_with_the_last_policy_that_references_it() -> None:
    store = ResourceStore(epoch="e")
    clusters = {STORE.name: cluster(STORE, "c1")}
    policies = {BUYER: policy(BUYER, STORE), THIEF: policy(THIEF, STORE)}
    publish(store, policies, policies, clusters)
    assert store.concerned(STORE_SLICE) == {BUYER, THIEF}
    # thief stops referencing it: buyer still does, so the slice stays as it was
    policies[THIEF] = policy(THIEF)
    published = publish(store, [THIEF], policies, clusters)
    assert published is not None
    assert published.of_kind("slice") == []
    assert store.concerned(STORE_SLICE) == {BUYER}
    assert store.slices_of(THIEF) == ()
    # buyer stops too: the slice is gone ("")
    policies[BUYER] = policy(BUYER, OTHER)
    published = publish(store, [BUYER], policies, clusters)
    assert published is not None
    assert (STORE_SLICE, "") in published.changes
    assert STORE_SLICE not in store.versions
    assert store.concerned(STORE_SLICE) == set()
    # referenced again, it is back with the version it had; then its policy goes
    policies[THIEF] = policy(THIEF, STORE)
    publish(store, [THIEF], policies, clusters)
    assert store.versions[STORE_SLICE] == contentversion.of(("c1", ()))
    del policies[THIEF]
    published = publish(store, [THIEF], policies, clusters)
    assert published == Published(5, (("policy/shop/thief", ""), (STORE_SLICE, "")))
    assert store.concerned(STORE_SLICE) == set()
    assert store.slices_of(THIEF) == ()
    # gone already: removing it again publishes nothing
    assert publish(store, [THIEF], policies, clusters) is None


def test_destinations_are_published_in_the_same_log() -> None:
    store = ResourceStore(epoch="e")
    policies = {BUYER: policy(BUYER)}
    published = publish(store, [BUYER], policies, destinations=[(SHOP, "d1")])
    assert published is not None
    assert published.revision == 1  # with the policy, in one revision
    assert published.of_kind("destination") == [("destination/shop/store", "d1")]
    assert destination_name(SHOP) == "destination/shop/store"
    assert publish(store, [], policies, destinations=[(SHOP, "d1")]) is None  # the same
    assert publish(store, [], policies, destinations=[(SHOP, "d2")]) == Published(
        2, (("destination/shop/store", "d2"),)
    )
    assert publish(store, [], policies, destinations=[(SHOP, "")]) == Published(
        3, (("destination/shop/store", ""),)
    )
    assert "destination/shop/store" not in store.versions
    # a destination gone that was never published moves nothing
    assert publish(store, [], policies, destinations=[(MeshService("shop", "x"), "")]) is None


def test_since_a_cursor_lists_what_changed_after_it() -> None:
    store = ResourceStore(epoch="e")
    clusters = {STORE.name: cluster(STORE, "c1")}
    policies = {BUYER: policy(BUYER, STORE), THIEF: policy(THIEF)}
    publish(store, policies, policies, clusters, destinations=[(SHOP, "d1")])
    cursor, full, listed = store.since("")
    assert (cursor, full) == ("e-1", True)
    assert listed == sorted(store.versions.items())
    # empty, malformed, another epoch's or ahead of the store: everything again
    for other in ("garbage", "f-1", "e-2", "e-x", "e--1", "-1", "e-", "e-\u0661"):
        assert store.since(other) == (cursor, True, listed), other
    assert store.since(cursor) == (cursor, False, [])

    publish(store, [], policies, {STORE.name: cluster(STORE, "c2")}, [STORE.name])
    after, full, changed = store.since(cursor)
    assert (after, full) == ("e-2", False)
    assert changed == [(STORE_SLICE, store.versions[STORE_SLICE])]

    # thief's policy goes: "" in every incremental listing from before, absent in a full one
    publish(store, [THIEF], {BUYER: policies[BUYER]}, destinations=[(SHOP, "")])
    last, full, changed = store.since(after)
    assert (last, full) == ("e-3", False)
    assert changed == [("destination/shop/store", ""), ("policy/shop/thief", "")]
    assert ("policy/shop/thief", "") in store.since(cursor)[2]
    assert store.since("e-0")[2] == [
        ("destination/shop/store", ""),
        ("policy/shop/buyer", store.versions["policy/shop/buyer"]),
        ("policy/shop/thief", ""),
        (STORE_SLICE, store.versions[STORE_SLICE]),
    ]
    _, full, everything = store.since("")
    assert full
    assert dict(everything) == store.versions
    assert "policy/shop/thief" not in dict(everything)
    assert store.since(last) == (last, False, [])

    # a resource that moves again is listed once, after any cursor before its last move
    publish(store, [], {BUYER: policies[BUYER]}, {STORE.name: cluster(STORE, "c3")}, [STORE.name])
    assert store.since(last)[2] == [(STORE_SLICE, store.versions[STORE_SLICE])]
    moved = ["destination/shop/store", "policy/shop/thief", STORE_SLICE]
    assert [name for name, _ in store.since(after)[2]] == moved
    assert [name for name, _ in store.since(cursor)[2]] == moved
    assert len(store.since("e-0")[2]) == 4


def test_each_store_has_its_own_epoch_unless_told() -> None:
    assert ResourceStore(epoch="abc").epoch == "abc"
    assert ResourceStore(epoch="abc").cursor == "abc-0"
    epoch = new_epoch()
    assert int(epoch[:-8], 16) > 0  # milliseconds since 1970, in hex, then random hex
    assert len({new_epoch() for _ in range(10)}) == 10  # the same millisecond, or not

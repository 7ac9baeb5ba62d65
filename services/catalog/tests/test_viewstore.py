"""The view store alone: versions are digests of the view's content (its policy and the
content versions of the clusters it references), the cursor is the store's own."""

from __future__ import annotations

from dataclasses import replace

from trellis_catalog.domain.steps import drain
from trellis_catalog.domain.views import (
    ClusterRef,
    ClusterState,
    Identity,
    IdentityPolicy,
    MeshSettings,
)
from trellis_catalog.domain.viewstore import ViewBatch, ViewStore, new_epoch

BUYER = Identity("shop", "buyer")
THIEF = Identity("shop", "thief")
STORE = ClusterRef("shop/store|80", "shop", "store", 80, "http", "STATIC", True)


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
    return ClusterState(ref, (), (), version)


def test_one_batch_one_revision_and_each_view_versioned_by_its_content() -> None:
    views = ViewStore(epoch="e")
    policies = {BUYER: policy(BUYER, STORE), THIEF: policy(THIEF)}
    batch = views.stamp([THIEF, BUYER], policies, {STORE.name: cluster(STORE, "c1")})
    assert batch is not None
    assert batch.revision == views.revision == 1
    assert batch.identities == (
        ("shop/buyer", views.version_of(BUYER)),
        ("shop/thief", views.version_of(THIEF)),
    )
    assert views.version_of(BUYER) != views.version_of(THIEF)  # two contents, two versions
    assert views.cursor == "e-1"
    # stamped again with nothing new: no batch, no revision
    assert views.stamp([BUYER, THIEF], policies, {STORE.name: cluster(STORE, "c1")}) is None
    assert views.revision == 1


def test_the_same_content_has_the_same_version_in_every_store() -> None:
    """Two replicas (two stores, other epochs, other orders of the same identities) give
    every view the same version: it is a function of the content alone."""
    first, second = ViewStore(), ViewStore()
    assert first.epoch != second.epoch
    clusters = {STORE.name: cluster(STORE, "c1")}
    first.stamp([BUYER, THIEF], {BUYER: policy(BUYER, STORE), THIEF: policy(THIEF)}, clusters)
    second.stamp([THIEF], {THIEF: policy(THIEF)}, clusters)
    second.stamp([BUYER], {BUYER: policy(BUYER, STORE), THIEF: policy(THIEF)}, clusters)
    assert first.versions == second.versions
    assert (first.revision, second.revision) == (1, 2)  # the cursors are each store's own


def test_an_equal_new_policy_object_keeps_the_version() -> None:
    """The recompute keeps the old object when the new policy is equal; a new object that
    is equal (another replica's, or after a restart) has the same content, so the same
    version: nothing is announced."""
    views = ViewStore(epoch="e")
    first = policy(BUYER)
    views.stamp([BUYER], {BUYER: first}, {})
    version = views.version_of(BUYER)
    second = policy(BUYER)
    assert second == first
    assert second is not first
    assert views.stamp([BUYER], {BUYER: second}, {}) is None
    assert views.version_of(BUYER) == version
    other = replace(second, service_account="other")
    batch = views.stamp([BUYER], {BUYER: other}, {})
    assert batch == ViewBatch(2, (("shop/buyer", views.version_of(BUYER)),))
    assert views.version_of(BUYER) != version


def test_a_cluster_version_re_versions_the_views_that_reference_it() -> None:
    views = ViewStore(epoch="e")
    policies = {BUYER: policy(BUYER, STORE), THIEF: policy(THIEF)}
    views.stamp(policies, policies, {STORE.name: cluster(STORE, "c1")})
    before = dict(views.versions)
    drain(views.index_references_steps(policies, policies))
    touched = views.referencing([STORE.name, "shop/other|80"])
    assert touched == {BUYER}
    batch = views.stamp(touched, policies, {STORE.name: cluster(STORE, "c2")})
    assert batch == ViewBatch(2, (("shop/buyer", views.version_of(BUYER)),))
    assert views.versions[BUYER] != before[BUYER]
    assert views.versions[THIEF] == before[THIEF]
    # the cluster back as it was: the view's version is the one it had
    views.stamp(touched, policies, {STORE.name: cluster(STORE, "c1")})
    assert views.versions == before


def test_references_move_only_for_the_identities_named() -> None:
    views = ViewStore(epoch="e")
    policies = {BUYER: policy(BUYER, STORE), THIEF: policy(THIEF)}
    drain(views.index_references_steps(policies, policies))
    moved = {BUYER: policy(BUYER), THIEF: policy(THIEF, STORE)}
    drain(
        views.index_references_steps(moved, [THIEF])
    )  # buyer's change not told yet: still indexed
    assert views.referencing([STORE.name]) == {BUYER, THIEF}
    drain(views.index_references_steps(moved, [BUYER]))
    assert views.referencing([STORE.name]) == {THIEF}
    drain(views.index_references_steps({}, [THIEF]))  # gone
    assert views.referencing([STORE.name]) == set()


def test_a_view_without_a_policy_is_removed_once() -> None:
    views = ViewStore(epoch="e")
    views.stamp([BUYER, THIEF], {BUYER: policy(BUYER), THIEF: policy(THIEF)}, {})
    remaining = {BUYER: policy(BUYER)}
    assert views.stamp([THIEF], remaining, {}) == ViewBatch(2, (("shop/thief", ""),))
    assert views.version_of(THIEF) == "0"
    assert views.stamp([THIEF], remaining, {}) is None


def test_each_store_has_its_own_epoch_unless_told() -> None:
    assert ViewStore(epoch="abc").epoch == "abc"
    epoch = new_epoch()
    assert int(epoch[:-8], 16) > 0  # milliseconds since 1970, in hex, then random hex
    assert len({new_epoch() for _ in range(10)}) == 10  # the same millisecond, or not

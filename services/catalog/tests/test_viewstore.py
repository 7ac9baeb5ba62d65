"""The view store alone: versions move with the policy object or a referenced cluster."""

from __future__ import annotations

from trellis_catalog.domain.steps import drain
from trellis_catalog.domain.views import (
    ClusterRef,
    ClusterState,
    Identity,
    IdentityPolicy,
    MeshSettings,
)
from trellis_catalog.domain.viewstore import ViewBatch, ViewStore

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


def cluster(ref: ClusterRef, version: int) -> ClusterState:
    return ClusterState(ref, (), (), version)


def test_one_batch_one_revision_one_version() -> None:
    views = ViewStore(epoch="e")
    policies = {BUYER: policy(BUYER, STORE), THIEF: policy(THIEF)}
    batch = views.stamp([THIEF, BUYER], policies, {STORE.name: cluster(STORE, 1)})
    assert batch == ViewBatch(1, (("shop/buyer", "e-1"), ("shop/thief", "e-1")))
    assert (views.revision, views.version_of(BUYER), views.version_of(THIEF)) == (1, "e-1", "e-1")
    # stamped again with nothing new: no batch, no revision
    assert views.stamp([BUYER, THIEF], policies, {STORE.name: cluster(STORE, 1)}) is None
    assert views.revision == 1


def test_a_new_policy_object_re_versions_even_when_equal() -> None:
    """The recompute keeps the old object when the new policy is equal; a new object is a
    new policy, and the store does not compare policies again."""
    views = ViewStore(epoch="e")
    first = policy(BUYER)  # alive while stamped, as the recompute keeps it: its id is its own
    views.stamp([BUYER], {BUYER: first}, {})
    second = policy(BUYER)
    assert second == first
    assert views.stamp([BUYER], {BUYER: second}, {}) == ViewBatch(2, (("shop/buyer", "e-2"),))


def test_a_cluster_version_re_versions_the_views_that_reference_it() -> None:
    views = ViewStore(epoch="e")
    policies = {BUYER: policy(BUYER, STORE), THIEF: policy(THIEF)}
    views.stamp(policies, policies, {STORE.name: cluster(STORE, 1)})
    drain(views.index_references_steps(policies, policies))
    touched = views.referencing([STORE.name, "shop/other|80"])
    assert touched == {BUYER}
    batch = views.stamp(touched, policies, {STORE.name: cluster(STORE, 2)})
    assert batch == ViewBatch(2, (("shop/buyer", "e-2"),))
    assert views.versions == {BUYER: "e-2", THIEF: "e-1"}


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
    assert int(ViewStore().epoch, 16) > 0  # milliseconds since 1970, in hex

"""A group's inputs: a whole view split into its policy and slices, and put back together."""

from __future__ import annotations

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp import testing as t
from trellis_proxy_cp.cache import inputs

STORE = "bookstore/bookstore"
REVIEWS = "bookstore/reviews|9080"
RATINGS = "bookstore/ratings|9090"


def two_clusters(endpoints: tuple[str, ...] = ("10.0.0.1", "10.0.0.2")) -> pb.View:
    """The bookstore calling reviews (``endpoints``) and ratings (one endpoint)."""
    view = t.view(STORE, endpoints=endpoints)
    ratings = t.view(STORE, upstream="bookstore/ratings", upstream_port=9090,
                     endpoints=("10.0.1.1",))  # fmt: skip
    view.outbound.extend(ratings.outbound)
    view.clusters.extend(ratings.clusters)
    return view


def test_split_leaves_the_policy_without_endpoints_and_each_cluster_naming_its_slice() -> None:
    found = inputs.split(two_clusters())

    assert [c.slice for c in found.policy.clusters] == [f"slice/{REVIEWS}", f"slice/{RATINGS}"]
    for cluster in found.policy.clusters:
        assert list(cluster.endpoints) == list(cluster.spiffe_ids) == []
        assert cluster.version == ""
    assert inputs.slice_names(found.policy) == (f"slice/{REVIEWS}", f"slice/{RATINGS}")
    reviews = found.slices[f"slice/{REVIEWS}"]
    assert reviews.cluster == REVIEWS
    assert [e.address for e in reviews.endpoints] == ["10.0.0.1", "10.0.0.2"]
    assert list(reviews.spiffe_ids) == [f"{t.SPIFFE_PREFIX}bookstore/sa/reviews"]
    assert reviews.version


def test_assemble_gives_back_every_clusters_endpoints_and_spiffe_ids() -> None:
    whole = two_clusters()
    found = inputs.split(whole)

    assembled = inputs.assemble(found.policy, found.slices)

    assert [c.name for c in assembled.clusters] == [c.name for c in whole.clusters]
    for before, after in zip(whole.clusters, assembled.clusters, strict=True):
        assert list(after.endpoints) == list(before.endpoints)
        assert list(after.spiffe_ids) == list(before.spiffe_ids)
        assert after.version == found.slices[after.slice].version
    assert list(assembled.outbound) == list(whole.outbound)
    assert list(assembled.inbound) == list(whole.inbound)
    assert found.policy.clusters[0].endpoints == []  # assembling changes no input


def test_assemble_without_a_slice_leaves_its_cluster_without_endpoints() -> None:
    found = inputs.split(two_clusters())
    slices = {n: s for n, s in found.slices.items() if n != f"slice/{RATINGS}"}

    assembled = inputs.assemble(found.policy, slices)

    by_name = {c.name: c for c in assembled.clusters}
    assert len(by_name[REVIEWS].endpoints) == 2
    assert list(by_name[RATINGS].endpoints) == list(by_name[RATINGS].spiffe_ids) == []


def test_a_view_that_differs_only_in_endpoints_keeps_its_policy_version() -> None:
    first = inputs.split(two_clusters(("10.0.0.1", "10.0.0.2")))
    moved = inputs.split(two_clusters(("10.0.0.1", "10.0.0.3")))

    assert first.policy.version == moved.policy.version
    assert first.policy == moved.policy
    reviews, ratings = f"slice/{REVIEWS}", f"slice/{RATINGS}"
    assert moved.slices[reviews].version != first.slices[reviews].version
    assert moved.slices[ratings].version == first.slices[ratings].version


def test_the_views_own_version_is_not_the_policys() -> None:
    """The policy's version is a digest of its content: the same content, the same
    version, whatever the view's label."""
    assert inputs.split(t.view(STORE, "1")).policy.version == (
        inputs.split(t.view(STORE, "2")).policy.version
    )


def test_other_routes_move_the_policy_version() -> None:
    first = inputs.split(two_clusters())
    rerouted = two_clusters()
    rerouted.outbound[0].routes[0].match.path_regex = "/books/.*"

    assert inputs.split(rerouted).policy.version != first.policy.version


def test_new_spiffe_ids_move_the_slice_not_the_policy() -> None:
    first = inputs.split(two_clusters())
    renamed = two_clusters()
    renamed.clusters[0].spiffe_ids[:] = [f"{t.SPIFFE_PREFIX}bookstore/sa/reviews-v2"]

    found = inputs.split(renamed)

    assert found.policy.version == first.policy.version
    name = f"slice/{REVIEWS}"
    assert found.slices[name].version != first.slices[name].version


def test_a_cluster_that_names_its_slice_and_version_keeps_them() -> None:
    view = t.view(STORE)
    view.clusters[0].slice = f"slice/{REVIEWS}@bookstore"
    view.clusters[0].version = "catalog-7"

    found = inputs.split(view)

    assert list(found.slices) == [f"slice/{REVIEWS}@bookstore"]
    assert found.slices[f"slice/{REVIEWS}@bookstore"].version == "catalog-7"
    assert found.policy.clusters[0].slice == f"slice/{REVIEWS}@bookstore"


def test_slice_names_are_each_named_once_in_order() -> None:
    policy = pb.View(
        clusters=[
            pb.Cluster(name="a", slice="slice/a"),
            pb.Cluster(name="b"),  # a cluster without a slice (not from split)
            pb.Cluster(name="a2", slice="slice/a"),
            pb.Cluster(name="c", slice="slice/c"),
        ]
    )

    assert inputs.slice_names(policy) == ("slice/a", "slice/c")

"""The clusters alone: one per service port, versioned by a digest of its content."""

from __future__ import annotations

from collections.abc import Callable

from trellis_catalog.domain.index import services
from trellis_catalog.domain.index.clusters import Clusters
from trellis_catalog.domain.index.services import KnownService, ProvidedEndpoint, ProvidedService
from trellis_catalog.domain.model.contentversion import cluster_version
from trellis_common.model import MeshService

API = MeshService("shop", "api")
WEB = MeshService("shop", "web")
TWO_PORTS = (("http", 80), ("grpc", 9090))

Report = Callable[..., ProvidedService]
Endpoint = Callable[..., ProvidedEndpoint]


def index(*reports: ProvidedService) -> dict[MeshService, KnownService]:
    return services.index({}, reports)


def test_each_port_is_a_cluster_versioned_by_its_content(
    report: Report, endpoint: Endpoint
) -> None:
    clusters = Clusters()
    known = index(
        report("shop/api", endpoint("10.0.0.1", {"http": 8080, "grpc": 9090}), ports=TWO_PORTS)
    )
    assert clusters.rebuild([API], known, "cluster.local") == {"shop/api|80", "shop/api|9090"}
    http = clusters.states["shop/api|80"]
    assert [(e.address, e.port) for e in http.endpoints] == [("10.0.0.1", 8080)]
    assert http.version == cluster_version(http)
    assert len(http.version) == 16  # 64 bits, in hex
    assert http.version != clusters.states["shop/api|9090"].version
    assert http.spiffe_ids == ()  # the endpoint names no account
    assert len(clusters.states) == 2
    # the same input again: nothing changed, nothing re-versioned
    version = http.version
    assert clusters.rebuild([API], known, "cluster.local") == set()
    assert clusters.states["shop/api|80"].version == version
    # another replica (another Clusters) fed the same report: the same version
    other = Clusters()
    other.rebuild([API], known, "cluster.local")
    assert other.states["shop/api|80"].version == version


def test_a_moved_endpoint_re_versions_only_its_services_clusters(
    report: Report, endpoint: Endpoint
) -> None:
    clusters = Clusters()
    api = report("shop/api", endpoint("10.0.0.1", {"http": 8080}))
    web = report("shop/web", endpoint("10.0.0.2", {"http": 8080}))
    clusters.rebuild([API, WEB], index(api, web), "cluster.local")
    before = {name: state.version for name, state in clusters.states.items()}
    moved = report("shop/api", endpoint("10.0.0.9", {"http": 8080}))
    # only API is in scope, as when one provider changed one service
    assert clusters.rebuild([API], index(moved, web), "cluster.local") == {"shop/api|80"}
    assert clusters.states["shop/api|80"].version != before["shop/api|80"]
    assert clusters.states["shop/web|80"].version == before["shop/web|80"]
    # moved back: the content it had, the version it had
    assert clusters.rebuild([API], index(api, web), "cluster.local") == {"shop/api|80"}
    assert clusters.states["shop/api|80"].version == before["shop/api|80"]


def test_a_service_that_went_away_takes_its_clusters(report: Report, endpoint: Endpoint) -> None:
    clusters = Clusters()
    clusters.rebuild([API], index(report("shop/api", endpoint())), "cluster.local")
    assert clusters.rebuild([API], index(), "cluster.local") == {"shop/api|80"}
    assert "shop/api|80" not in clusters.states
    assert dict(clusters.states) == {}


def test_a_new_trust_domain_rebuilds_every_cluster(report: Report, endpoint: Endpoint) -> None:
    clusters = Clusters()
    known = index(
        report("shop/api", endpoint("10.0.0.1", {"http": 8080}, service_account="api")),
        report("shop/web", endpoint("10.0.0.2", {"http": 8080}, service_account="web")),
    )
    clusters.rebuild([API, WEB], known, "cluster.local")
    before = clusters.states["shop/web|80"].version
    assert clusters.states["shop/api|80"].spiffe_ids == ("spiffe://cluster.local/ns/shop/sa/api",)
    # nothing is in scope, but every SPIFFE id changed
    assert clusters.rebuild([], known, "example.org") == {"shop/api|80", "shop/web|80"}
    assert clusters.states["shop/web|80"].spiffe_ids == ("spiffe://example.org/ns/shop/sa/web",)
    assert clusters.states["shop/web|80"].version != before


def test_a_rebuild_after_one_endpoint_moved_keeps_the_others(
    report: Report, endpoint: Endpoint
) -> None:
    """The unchanged endpoints are the same objects (converted once), and the cluster is
    what a cluster built from nothing would be."""
    clusters = Clusters()

    def at(address: str, port: int) -> ProvidedEndpoint:  # as a provider's report has it
        return endpoint(address, {"http": port}, service_account="api", provider="vm")

    many = [at(f"10.0.0.{i}", 8080) for i in range(1, 60)]
    clusters.rebuild([API], index(report("shop/api", *many)), "cluster.local")
    before = {e.address: e for e in clusters.states["shop/api|80"].endpoints}
    moved = [*many[:-1], at("10.0.1.1", 8081)]
    known = index(report("shop/api", *moved))
    assert clusters.rebuild([API], known, "cluster.local") == {"shop/api|80"}
    after = clusters.states["shop/api|80"]
    kept = [e for e in after.endpoints if e.address in before]
    assert len(kept) == 58
    assert all(before[e.address] is e for e in kept)
    fresh = services.cluster(known[API], known[API].ports[0], "cluster.local", after.version)
    assert after == fresh
    assert [(e.address, e.port) for e in after.endpoints][-1] == ("10.0.1.1", 8081)
    # its version from the 58 digests kept and one new is the version of its content
    assert after.version == cluster_version(fresh) != cluster_version(fresh, ["x"] * 59)
    other = Clusters()
    other.rebuild([API], known, "cluster.local")
    assert other.states["shop/api|80"].version == after.version


def test_a_port_whose_target_changed_converts_every_endpoint_again(
    report: Report, endpoint: Endpoint
) -> None:
    """The conversion reads the port's spec: a new spec reuses nothing."""
    clusters = Clusters()
    serving = endpoint("10.0.0.1", {"http": 8080, "admin": 9000})
    clusters.rebuild([API], index(report("shop/api", serving)), "cluster.local")
    assert [e.port for e in clusters.states["shop/api|80"].endpoints] == [8080]
    # the same endpoint object, the Service's port now targets the port named admin
    retargeted = index(report("shop/api", serving, ports=[("admin", 80, "HTTP", 0)]))
    clusters.rebuild([API], retargeted, "cluster.local")
    assert [e.port for e in clusters.states["shop/api|80"].endpoints] == [9000]

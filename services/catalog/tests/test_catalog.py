"""The Catalog: incremental recompute, published resources, batches, proxies, certificates,
debounce."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

from trellis_catalog.catalog import Catalog, CertificateRef, UnknownProxy
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.domain.model.contentversion import cluster_version
from trellis_catalog.domain.model.views import Identity
from trellis_catalog.sources import kinds
from trellis_common.specdir import load_paths
from trellis_testing import eventually

ROOT = Path(__file__).resolve().parents[3]
BUYER = Identity("bookbuyer", "bookbuyer")
THIEF = Identity("bookthief", "bookthief")
V1 = Identity("bookstore", "bookstore-v1")
V2 = Identity("bookstore", "bookstore-v2")
PROXY = "00000000-0000-4000-8000-00000000000{}.{}.{}"
V2_SLICE = "slice/bookstore/bookstore-v2|14001"


def provided(name: str, *addresses: str, port: int = 8081) -> ProvidedService:
    return ProvidedService(
        provider="vm",
        namespace="bookstore",
        name=name,
        ports=(("http", 8080, "", 0),),
        endpoints=tuple(
            ProvidedEndpoint(a, (("http", port),), service_account="bookstore") for a in addresses
        ),
    )


def bookstore_catalog(spec: Path = ROOT / "examples" / "bookstore") -> Catalog:
    """The bookstore's documents (from ``spec``), both bookstore versions reported,
    bookbuyer's and bookthief's proxies expected, flushed."""
    documents, errors = load_paths([spec], kinds())
    assert not errors
    catalog = Catalog()
    catalog.set_documents(documents, errors)
    catalog.set_provider_services(
        "vm", [provided("bookstore-v1", "10.0.0.1"), provided("bookstore-v2", "10.0.0.2")]
    )
    catalog.expect_proxy(PROXY.format(1, "bookbuyer", "bookbuyer"), "bookbuyer")
    catalog.expect_proxy(PROXY.format(2, "bookthief", "bookthief"), "bookthief")
    catalog.flush()
    return catalog


@pytest.fixture
def catalog() -> Catalog:
    return bookstore_catalog()


def test_first_flush_versions_every_identity(catalog: Catalog) -> None:
    identities = {BUYER, THIEF, V1, V2, Identity("bookstore", "bookstore")}
    assert set(catalog.view_versions()) == identities
    assert catalog.revision == 1  # one flush, one batch
    assert len(set(catalog.view_versions().values())) == 5  # each view its content's version
    published = catalog.resources.versions
    assert {n for n in published if n.startswith("policy/")} == {f"policy/{i}" for i in identities}
    # bookbuyer's clusters, each a slice of its own (bookstore runs as one account only)
    assert catalog.resources.slices_of(BUYER) == (
        "slice/bookstore/bookstore-v1|14001",
        V2_SLICE,
    )
    slices = {n for n in published if n.startswith("slice/")}
    assert slices == set(catalog.resources.slices_of(BUYER))


def test_an_endpoint_change_reversions_only_who_references_the_cluster(catalog: Catalog) -> None:
    policies = dict(catalog.policies)
    before = catalog.view_versions()
    catalog.update_provider_service(
        "vm", "bookstore", "bookstore-v2", provided("bookstore-v2", "10.0.0.9")
    )
    published = catalog.flush()
    assert published is not None
    # the cluster's slice and the service's destination move; no policy does
    assert published.of_kind("policy") == []
    assert [n for n, _ in published.of_kind("slice")] == [V2_SLICE]
    destinations = published.of_kind("destination")
    assert [n for n, _ in destinations] == ["destination/bookstore/bookstore-v2"]
    assert catalog.resources.concerned(V2_SLICE) == {BUYER}
    assert catalog.view_version(BUYER) != before[BUYER]
    assert catalog.view_version(THIEF) == before[THIEF]
    # the policy was not recomputed: same object, only the cluster moved
    assert catalog.policies[BUYER] is policies[BUYER]
    cluster = catalog.clusters["bookstore/bookstore-v2|14001"]
    assert [e.address for e in cluster.endpoints] == ["10.0.0.9"]
    assert cluster.version == cluster_version(cluster)


def test_an_unchanged_report_changes_nothing(catalog: Catalog) -> None:
    catalog.set_provider_services(
        "vm", [provided("bookstore-v1", "10.0.0.1"), provided("bookstore-v2", "10.0.0.2")]
    )
    assert catalog.flush() is None


def test_a_policy_change_reaches_the_identities_it_concerns(catalog: Catalog) -> None:
    documents, errors = load_paths([ROOT / "examples" / "bookstore"], kinds())
    target = ROOT / "examples" / "bookstore" / "access.yaml"
    kept = [d for d in documents if d.origin.source != str(target)]
    catalog.set_documents(kept, errors)
    published = catalog.flush()
    assert published is not None
    changed = {n for n, _ in published.of_kind("policy")}
    # bookbuyer loses its outbound, bookstore-v1/v2 lose their inbound rule
    assert {
        "policy/bookbuyer/bookbuyer",
        "policy/bookstore/bookstore-v1",
        "policy/bookstore/bookstore-v2",
    } <= changed
    assert "policy/bookthief/bookthief" not in changed
    assert catalog.policies[BUYER].outbound == ()
    # no policy references bookbuyer's slices any more: they are gone
    assert dict(published.of_kind("slice")) == {
        "slice/bookstore/bookstore-v1|14001": "",
        V2_SLICE: "",
    }
    assert catalog.resources.concerned(V2_SLICE) == set()


def test_a_dead_provider_takes_its_endpoints_with_it(catalog: Catalog) -> None:
    catalog.drop_provider("vm")
    catalog.flush()
    assert catalog.clusters["bookstore/bookstore-v1|14001"].endpoints == ()
    assert catalog.providers() == set()


def test_proxies_expected_connected_and_participants(catalog: Catalog) -> None:
    cn = PROXY.format(3, "bookstore-v1", "bookstore")
    record = catalog.expect_proxy(cn, "bookstore")
    assert not catalog.participant(record)
    catalog.register_proxy(cn, "proxy-cp-0", "10.0.0.1")
    catalog.flush()
    assert catalog.participant(record)
    catalog.register_proxy(cn, "proxy-cp-0", "10.9.9.9")  # an address no endpoint has
    assert not catalog.participant(record)
    catalog.unregister_proxy(cn)
    assert not record.connected
    with pytest.raises(UnknownProxy):
        catalog.expect_proxy("not-a-proxy-cn")
    with pytest.raises(UnknownProxy):
        catalog.unregister_proxy(PROXY.format(9, "x", "y"))


def test_a_client_only_identity_gets_its_outbound_view(catalog: Catalog) -> None:
    policy = catalog.policy_for(Identity("elsewhere", "job"), "bookbuyer")
    assert policy.outbound == ()  # bookbuyer's account in another namespace is not allowed
    policy = catalog.policy_for(Identity("bookbuyer", "batch-job"), "bookbuyer")
    assert {o.name for o in policy.outbound} == {"bookstore", "bookstore-v1", "bookstore-v2"}


def test_a_proxy_under_another_account_does_not_take_its_service_with_it(
    catalog: Catalog,
) -> None:
    before = catalog.account_of_identity(THIEF)
    thief = PROXY.format(4, "bookthief", "bookthief")
    catalog.expect_proxy(thief, "bookbuyer")
    catalog.flush()
    assert catalog.account_of_identity(THIEF) == before  # the established account stays
    assert catalog.policies[THIEF].spiffe_id.endswith(f"/sa/{before}")
    [shown] = [r for r in catalog.health.rejections.items() if r.source == "proxy-account"]
    assert shown.key == "bookthief/bookthief"
    assert "bookbuyer (refused by peers)" in shown.reason
    catalog.expect_proxy(PROXY.format(5, "bookbuyer", "bookbuyer"))  # another one onboards
    [again] = [r for r in catalog.health.rejections.items() if r.source == "proxy-account"]
    assert again.count == 1  # reported once, not again at every other proxy's onboarding
    # `trellis spec list` shows it as a warning on the Service
    [listed] = catalog.account_conflicts()
    assert (listed.kind, listed.namespace, listed.name) == ("Service", "bookthief", "bookthief")
    assert (listed.state, listed.field, listed.reason) == (
        "warning",
        "proxies.serviceAccount",
        shown.reason,
    )
    # the proxies agree again: the conflict leaves /v1/status and the listing
    catalog.expect_proxy(thief, before)
    assert [r for r in catalog.health.rejections.items() if r.source == "proxy-account"] == []
    assert catalog.account_conflicts() == []


def test_a_certificate_rotation_does_not_reversion_the_view(catalog: Catalog) -> None:
    """Certificates reach proxy-cp from certmanager: one path, one rebuild per rotation."""
    before, cursor = catalog.view_version(BUYER), catalog.resources.cursor
    ref = CertificateRef("bookbuyer.bookbuyer.svc.cluster.local", "aa")
    catalog.set_certificate(BUYER, ref)
    assert catalog.flush() is None
    assert catalog.view_version(BUYER) == before
    assert catalog.changes_since(cursor) == (cursor, False, [])  # no resource moved
    assert catalog.certificates[BUYER] == ref  # the issuer's state, kept


async def test_a_lone_change_is_flushed_at_once_with_no_quiet_period(catalog: Catalog) -> None:
    cursor = catalog.resources.cursor
    stop = asyncio.Event()
    loop = asyncio.create_task(catalog.run(stop))
    await asyncio.sleep(0)  # the loop waits for inputs
    watcher = asyncio.create_task(catalog.moved_after(cursor))  # as WatchChanges waits
    catalog.update_provider_service(
        "vm", "bookstore", "bookstore-v2", provided("bookstore-v2", "10.0.9.9")
    )
    # a handful of turns of the event loop and no time: no timer stands between an input
    # and its flush (the old debounce waited 20 ms of quiet, up to 200 ms under churn), and
    # the flush wakes the watcher
    for _ in range(5):
        await asyncio.sleep(0)
    assert watcher.done(), "the change waited for something"
    assert catalog.clusters["bookstore/bookstore-v2|14001"].endpoints[0].address == "10.0.9.9"
    stop.set()
    await loop


async def test_changes_during_a_flush_go_out_together_in_the_next(catalog: Catalog) -> None:
    start, _, _ = catalog.changes_since("")
    revision = catalog.resources.revision
    stop = asyncio.Event()
    loop = asyncio.create_task(catalog.run(stop))
    catalog.update_provider_service(
        "vm", "bookstore", "bookstore-v2", provided("bookstore-v2", "10.0.1.0")
    )
    for _ in range(5):  # the leading-edge flush
        await asyncio.sleep(0)
    assert catalog.clusters["bookstore/bookstore-v2|14001"].endpoints[0].address == "10.0.1.0"
    assert catalog.resources.revision == revision + 1
    first_version = catalog.clusters["bookstore/bookstore-v2|14001"].version
    for i in range(1, 20):  # a burst while the loop is busy elsewhere
        catalog.update_provider_service(
            "vm", "bookstore", "bookstore-v2", provided("bookstore-v2", f"10.0.1.{i}")
        )
    await asyncio.wait_for(catalog.moved_after(catalog.resources.cursor), 2)
    stop.set()
    await loop
    # the whole burst was one more recompute and one more revision, not nineteen
    assert catalog.resources.revision == revision + 2
    assert catalog.clusters["bookstore/bookstore-v2|14001"].version != first_version
    assert catalog.clusters["bookstore/bookstore-v2|14001"].endpoints[0].address == "10.0.1.19"
    cursor, full, changed = catalog.changes_since(start)
    assert not full
    versions = catalog.resources.versions
    v2 = "destination/bookstore/bookstore-v2"
    assert changed == [(v2, versions[v2]), (V2_SLICE, versions[V2_SLICE])]
    assert cursor == catalog.resources.cursor


async def test_changes_since_a_cursor_lists_what_changed_after_it(catalog: Catalog) -> None:
    everything = dict(catalog.resources.versions)
    cursor, full, listed = catalog.changes_since("")
    assert full
    assert dict(listed) == everything
    # a cursor from another epoch (a restarted catalog), malformed, or ahead: all again
    epoch = cursor.rsplit("-", 1)[0]
    for other in ("0-1", "garbage", f"{epoch}-x", f"{epoch}-99", "-1", f"{epoch}--1"):
        assert catalog.changes_since(other) == (cursor, True, listed), other
    assert catalog.changes_since(cursor) == (cursor, False, [])

    moved = provided("bookstore-v2", "10.0.9.9")
    catalog.update_provider_service("vm", "bookstore", "bookstore-v2", moved)
    assert await catalog.flush_and_announce() is not None
    after, full, changed = catalog.changes_since(cursor)
    assert after != cursor
    assert not full
    versions = catalog.resources.versions
    v2 = "destination/bookstore/bookstore-v2"
    assert changed == [(v2, versions[v2]), (V2_SLICE, versions[V2_SLICE])]

    # bookthief's proxy goes and nothing else declares it: its policy is removed ("")
    catalog.expect_only([PROXY.format(1, "bookbuyer", "bookbuyer")])
    assert await catalog.flush_and_announce() is not None
    last, _, changed = catalog.changes_since(after)
    assert ("policy/bookthief/bookthief", "") in changed
    assert ("policy/bookthief/bookthief", "") in catalog.changes_since(cursor)[2]  # any older
    assert "policy/bookthief/bookthief" not in dict(catalog.changes_since("")[2])  # a full one
    assert catalog.view_version(THIEF) == "0"
    assert catalog.changes_since(last) == (last, False, [])


def test_a_backend_without_endpoints_leaves_the_split(catalog: Catalog) -> None:
    def split() -> dict[str, int]:
        root = next(o for o in catalog.policies[BUYER].outbound if o.name == "bookstore")
        return {c.cluster: c.weight for c in root.routes[0].clusters}

    v1, v2 = "bookstore/bookstore-v1|14001", "bookstore/bookstore-v2|14001"
    assert split() == {v1: 80, v2: 20}
    catalog.update_provider_service("vm", "bookstore", "bookstore-v2", provided("bookstore-v2"))
    catalog.flush()
    assert split() == {v1: 80}  # no 503s for v2's share
    catalog.update_provider_service(
        "vm", "bookstore", "bookstore-v2", provided("bookstore-v2", "10.0.0.2")
    )
    catalog.flush()
    assert split() == {v1: 80, v2: 20}
    # when no backend has endpoints, the split stays as declared
    catalog.update_provider_service("vm", "bookstore", "bookstore-v1", provided("bookstore-v1"))
    catalog.update_provider_service("vm", "bookstore", "bookstore-v2", provided("bookstore-v2"))
    catalog.flush()
    assert split() == {v1: 80, v2: 20}


def test_a_traffic_target_edit_recomputes_only_the_accounts_it_names(catalog: Catalog) -> None:
    catalog.expect_proxy(PROXY.format(5, "other", "elsewhere"), "other")
    catalog.flush()
    documents, errors = load_paths([ROOT / "examples" / "bookstore"], kinds())
    # let bookthief buy books too: an edit of one TrafficTarget's sources
    edited = []
    for document in documents:
        if document.key.kind == "TrafficTarget":
            spec = document.resource.spec
            thief = spec.sources[0].model_copy(
                update={"name": "bookthief", "namespace": "bookthief"}
            )
            resource = document.resource.model_copy(
                update={"spec": spec.model_copy(update={"sources": (*spec.sources, thief)})}
            )
            document = type(document)(document.key, document.api_version, document.origin, resource)
        edited.append(document)
    catalog.set_documents(edited, errors)
    published = catalog.flush()
    assert published is not None
    # bookstore's account (v1, v2, the root) and the two sources; not elsewhere/other
    assert catalog.last_recomputed == 5
    assert "policy/elsewhere/other" in catalog.resources.versions
    assert "policy/elsewhere/other" not in dict(published.changes)
    assert "policy/bookthief/bookthief" in dict(published.changes)
    assert {o.name for o in catalog.policies[THIEF].outbound} == {
        "bookstore",
        "bookstore-v1",
        "bookstore-v2",
    }
    # the same result as computing everything from scratch
    fresh = Catalog()
    fresh.set_documents(edited, errors)
    fresh.set_provider_services(
        "vm", [provided("bookstore-v1", "10.0.0.1"), provided("bookstore-v2", "10.0.0.2")]
    )
    for record in catalog.proxies.values():
        fresh.expect_proxy(record.common_name, record.service_account)
    fresh.flush()
    assert fresh.policies == catalog.policies


def test_a_service_edit_still_recomputes_everyone(catalog: Catalog) -> None:
    documents, errors = load_paths([ROOT / "examples" / "bookstore"], kinds())
    kept = [d for d in documents if d.key.name != "bookstore-v2" or d.key.kind != "Service"]
    catalog.set_documents(kept, errors)
    catalog.flush()
    assert catalog.last_recomputed == len(catalog.identities())


SPLIT_ROUTES = """
apiVersion: specs.smi-spec.io/v1alpha4
kind: HTTPRouteGroup
metadata: {name: split-routes, namespace: bookstore}
spec:
  matches:
  - {name: canary, pathRegex: /canary, methods: [GET]}
---
apiVersion: split.smi-spec.io/v1alpha4
kind: TrafficSplit
metadata: {name: bookstore-split, namespace: bookstore}
spec:
  service: bookstore
  matches: [{kind: HTTPRouteGroup, name: split-routes}]
  backends:
  - {service: bookstore-v1, weight: 80}
  - {service: bookstore-v2, weight: 20}
"""


def test_a_route_group_that_only_a_split_matches_reaches_the_roots_callers(
    tmp_path: Path,
) -> None:
    """No TrafficTarget names split-routes: its edit still moves every caller's routes."""
    spec = tmp_path / "spec"
    shutil.copytree(ROOT / "examples" / "bookstore", spec)
    (spec / "traffic-split.yaml").write_text(SPLIT_ROUTES)
    catalog = bookstore_catalog(spec)

    def regexes() -> set[str]:
        [root] = [o for o in catalog.policies[BUYER].outbound if o.name == "bookstore"]
        return {route.match.path_regex for route in root.routes}

    assert "/canary" in regexes()
    (spec / "traffic-split.yaml").write_text(SPLIT_ROUTES.replace("/canary", "/canary-2"))
    documents, errors = load_paths([spec], kinds())
    catalog.set_documents(documents, errors)
    assert catalog.flush() is not None
    assert "/canary-2" in regexes()
    assert "/canary" not in regexes()


async def test_the_proxy_sweep_forgets_a_disconnected_proxy_whose_certificate_expired(
    catalog: Catalog,
) -> None:
    """A pod deleted a day ago: its proxy disconnected and stayed expected until its
    certificate expired, and certmanager prunes that record without a signal."""
    job = Identity("bookbuyer", "batch-job")
    gone = PROXY.format(7, "batch-job", "bookbuyer")
    catalog.expect_proxy(gone, "bookbuyer", not_after=time.time() + 0.05)
    catalog.register_proxy(gone)
    catalog.unregister_proxy(gone)  # still expected: kept until its certificate expires
    assert job in catalog.identities_with_proxies()
    stop = asyncio.Event()
    sweep = asyncio.create_task(catalog.sweep_proxies(stop, interval=0.01))
    await eventually(lambda: gone not in catalog.proxies)
    stop.set()
    await sweep
    assert job not in catalog.identities_with_proxies()
    assert PROXY.format(1, "bookbuyer", "bookbuyer") in catalog.proxies  # no expiry known

"""The recompute alone: dirty inputs in, the least work out, the same answer as from scratch."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from trellis_catalog.domain.changes.recompute import Recompute
from trellis_catalog.domain.index.proxies import Proxies
from trellis_catalog.domain.index.reports import ProviderReports
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.domain.model.views import Identity
from trellis_common.documents.base import Document
from trellis_common.model import MeshService

Docs = Callable[[str], list[Document]]
Report = Callable[..., ProvidedService]
Endpoint = Callable[..., ProvidedEndpoint]

API, WEB, DB, CACHE = (Identity("shop", n) for n in ("api", "web", "db", "cache"))
PROXY = "00000000-0000-4000-8000-000000000001.{}.shop"


def service(name: str) -> str:
    return f"""apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: shop}}
spec: {{ports: [{{name: http, port: 80}}]}}"""


def target(*sources: str) -> str:
    listed = ", ".join(f"{{kind: ServiceAccount, name: {s}}}" for s in sources)
    return f"""apiVersion: access.smi-spec.io/v1alpha3
kind: TrafficTarget
metadata: {{name: to-api, namespace: shop}}
spec:
  destination: {{kind: ServiceAccount, name: api}}
  sources: [{listed}]
  rules: [{{kind: HTTPRouteGroup, name: api-routes}}]"""


ROUTES = """apiVersion: specs.smi-spec.io/v1alpha4
kind: HTTPRouteGroup
metadata: {name: api-routes, namespace: shop}
spec:
  matches:
  - {name: anything, methods: ["*"]}"""
SERVICES = [service(n) for n in ("api", "web", "db", "cache")]


def shop(*parts: str) -> str:
    return "\n---\n".join(parts)


@pytest.fixture
def reports() -> ProviderReports:
    return ProviderReports()


@pytest.fixture
def proxies() -> Proxies:
    return Proxies()


@pytest.fixture
def recompute(
    docs: Docs, report: Report, endpoint: Endpoint, reports: ProviderReports, proxies: Proxies
) -> Recompute:
    """api, web, db (each with one endpoint running as its own account) and cache (none);
    web may call api; everything applied once."""
    reports.replace(
        "vm",
        [
            report(f"shop/{n}", endpoint(address, {"http": 8080}, service_account=n))
            for n, address in (("api", "10.0.0.1"), ("web", "10.0.0.2"), ("db", "10.0.0.3"))
        ],
    )
    recompute = Recompute(reports, proxies)
    recompute.set_documents(docs(shop(*SERVICES, ROUTES, target("web"))), [])
    recompute.mark(services=True)
    recompute.apply()
    return recompute


def outbound(recompute: Recompute, identity: Identity) -> set[str]:
    return {o.name for o in recompute.policies[identity].outbound}


def test_the_first_apply_builds_everything(recompute: Recompute) -> None:
    assert recompute.identities() == [API, CACHE, DB, WEB]
    assert sorted(recompute.policies) == [API, CACHE, DB, WEB]
    assert sorted(recompute.clusters.states) == [
        f"shop/{n}|80" for n in ("api", "cache", "db", "web")
    ]
    assert outbound(recompute, WEB) == {"api"}
    assert outbound(recompute, DB) == set()
    assert recompute.last_recomputed == 4


def test_a_moved_endpoint_rebuilds_one_cluster_and_no_policy(
    recompute: Recompute, reports: ProviderReports, report: Report, endpoint: Endpoint
) -> None:
    policies = dict(recompute.policies)
    moved = report("shop/api", endpoint("10.0.0.9", {"http": 8080}, service_account="api"))
    recompute.changed(reports.keep("vm", moved))
    result = recompute.apply()
    assert (result.identities, result.clusters, result.policies) == (set(), {"shop/api|80"}, False)
    assert all(recompute.policies[i] is policies[i] for i in policies)
    assert recompute.apply().clusters == set()  # the marks started over


def test_a_traffic_target_edit_recomputes_only_the_accounts_it_names(
    recompute: Recompute, docs: Docs
) -> None:
    recompute.set_documents(docs(shop(*SERVICES, ROUTES, target("web", "db"))), [])
    result = recompute.apply()
    assert recompute.last_recomputed == 3  # api, web and db; not cache
    assert result.identities == {API, DB}  # api's inbound and db's outbound moved
    assert outbound(recompute, DB) == {"api"}


def test_a_service_edit_recomputes_everyone(recompute: Recompute, docs: Docs) -> None:
    recompute.set_documents(docs(shop(*SERVICES[:3], ROUTES, target("web"))), [])
    result = recompute.apply()
    assert recompute.last_recomputed == 3  # everyone there is: cache went
    assert result.identities == {CACHE}
    assert CACHE not in recompute.policies


def test_an_identitys_account_proxy_first_then_endpoints_then_the_last_known(
    reports: ProviderReports, proxies: Proxies, report: Report, endpoint: Endpoint
) -> None:
    recompute = Recompute(reports, proxies)
    api = MeshService("shop", "api")
    assert recompute.account_of(api) == "api"  # nothing known: the service's name
    reports.replace(
        "vm",
        [
            report(
                "shop/api",
                endpoint("10.0.0.1", service_account="one"),
                endpoint("10.0.0.2", service_account="two"),
                endpoint("10.0.0.3", service_account="two"),
            )
        ],
    )
    recompute.mark(services=True)
    recompute.apply()
    assert recompute.account_of(api) == "two"  # most of its endpoints
    reports.replace("vm", [report("shop/api")])
    recompute.mark(services=True)
    recompute.apply()
    assert recompute.account_of(api) == "two"  # no endpoint for a moment: unchanged
    proxies.expect(PROXY.format("api"), "proxied")
    assert recompute.account_of(api) == "proxied"  # its (established) proxy's, first


def test_a_proxys_identity_gets_a_policy_without_a_service(
    recompute: Recompute, proxies: Proxies
) -> None:
    proxies.expect(PROXY.format("batch"), "web")
    recompute.mark(policies=True)
    result = recompute.apply()
    batch = Identity("shop", "batch")
    assert batch in result.identities
    assert outbound(recompute, batch) == {"api"}  # it runs as web, which may call api
    assert recompute.policy_for(batch, "db").outbound == ()  # asked as another account


def test_a_tcp_port_lost_to_another_service_shows_in_the_services_status(
    recompute: Recompute, docs: Docs, report: Report, reports: ProviderReports
) -> None:
    tcp = "spec: {ports: [{name: tcp-db, port: 5432}]}"
    moved = [s.replace("spec: {ports: [{name: http, port: 80}]}", tcp) for s in SERVICES[2:]]
    recompute.set_documents(docs(shop(*SERVICES[:2], *moved, ROUTES, target("web"))), [])
    recompute.apply()
    cache = recompute.spec.statuses["Service shop/cache"]
    assert (cache.state, cache.reason) == (
        "valid",
        "",
    )  # "cache" is first by name: it takes the port
    db = recompute.spec.statuses["Service shop/db"]
    assert db.state == "warning"
    assert db.reason.startswith("TCP port 5432 is also shop/cache's: a client that may reach")
    # the conflict goes with the shared port
    recompute.set_documents(docs(shop(*SERVICES, ROUTES, target("web"))), [])
    recompute.apply()
    assert recompute.spec.statuses["Service shop/db"].state == "valid"

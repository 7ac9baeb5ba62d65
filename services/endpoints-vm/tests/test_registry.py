"""The endpoint registry: registrations, heartbeats and expiry, and ServiceEntry resolution.

Pure: every call takes an explicit ``now``. Declarations are written as YAML and read the
way the service reads its spec directory (``KindRegistry`` with the Istio kinds, then
``from_documents``), so these tests also pin what a ServiceEntry means to endpoints-vm.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest

from trellis_endpoints_vm.domain.declarations import DeclaredEndpoint, DeclaredEntry
from trellis_endpoints_vm.domain.registry import Change, EndpointRegistry, UnknownWorkload
from trellis_endpoints_vm.domain.views import (
    EndpointInfo,
    PortInfo,
    ServiceInfo,
    ServiceKey,
    ServiceView,
)
from trellis_endpoints_vm.domain.workloads import Workload

MakeWorkload = Callable[..., Workload]
Declarations = tuple[list[DeclaredEntry], list[DeclaredEndpoint]]
Parse = Callable[[str], Declarations]

NOW = 1_000.0


def key(name: str, namespace: str = "shop") -> ServiceKey:
    return ServiceKey(namespace, name)


def addresses(view: ServiceView | None) -> list[str] | None:
    return None if view is None else [e.address for e in view.endpoints]


def summary(changes: Sequence[Change]) -> list[tuple[str, list[str] | None]]:
    """Each change as ("namespace/service", endpoint addresses, or None when removed)."""
    return [(str(c.key), addresses(c.view)) for c in changes]


# --- registrations -------------------------------------------------------------------------


def test_a_workload_is_an_endpoint_of_each_of_its_services(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    w = make_workload(services=("web", "api"), ports=(("http", 8080), ("grpc", 9090)))
    changes = registry.upsert(w, NOW)
    assert [c.key for c in changes] == [key("api"), key("web")]
    for change in changes:
        ports = (PortInfo("grpc", 9090), PortInfo("http", 8080))
        assert change.view == ServiceView(ServiceInfo(change.key, ports=ports), (w.endpoint(),))
    assert registry.views == {c.key: c.view for c in changes}


def test_a_second_workload_joins_the_service(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    registry.upsert(make_workload("vm-1", address="10.0.0.2"), NOW)
    changes = registry.upsert(make_workload("vm-2", address="10.0.0.1"), NOW)
    assert summary(changes) == [("shop/api", ["10.0.0.1", "10.0.0.2"])]  # sorted


def test_the_same_service_name_in_two_namespaces_is_two_services(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    registry.upsert(make_workload(namespace="shop", address="10.0.0.1"), NOW)
    changes = registry.upsert(make_workload(namespace="bank", address="10.0.0.2"), NOW)
    assert summary(changes) == [("bank/api", ["10.0.0.2"])]
    assert addresses(registry.views[key("api")]) == ["10.0.0.1"]


def test_service_ports_are_the_union_numbered_by_the_first_workload(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    registry.upsert(make_workload("vm-2", ports=(("http", 81), ("grpc", 90))), NOW)
    registry.upsert(make_workload("vm-1", ports=(("http", 80),)), NOW)
    assert registry.views[key("api")].info.ports == (PortInfo("grpc", 90), PortInfo("http", 80))


def test_upsert_moves_a_workload_between_addresses_and_services(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    first = make_workload("vm-1", services=("api", "web"), address="10.0.0.1")
    registry.upsert(first, NOW)
    registry.upsert(make_workload("vm-2", services=("api",), address="10.0.0.2"), NOW)

    moved = dataclasses.replace(first, address="10.0.0.9", services=("api", "admin"))
    assert summary(registry.upsert(moved, NOW)) == [
        ("shop/admin", ["10.0.0.9"]),
        ("shop/api", ["10.0.0.2", "10.0.0.9"]),
        ("shop/web", None),  # no workload names it any more
    ]
    assert set(registry.views) == {key("admin"), key("api")}

    # leaving a service another workload still serves keeps the service
    assert summary(registry.upsert(dataclasses.replace(moved, services=("admin",)), NOW)) == [
        ("shop/api", ["10.0.0.2"])
    ]


UPDATES: list[tuple[str, dict[str, object], list[ServiceKey]]] = [
    ("identical", {}, []),
    ("new address", {"address": "10.0.0.7"}, [key("web")]),
    ("new labels", {"labels": (("version", "v2"),)}, [key("web")]),
    ("new weight", {"weight": 5}, [key("web")]),
    ("new port", {"ports": (("http", 8081),)}, [key("web")]),
    ("a ttl, still alive", {"ttl": 60.0, "last_heartbeat": NOW}, []),
    ("registered again later", {"registered_at": NOW + 5, "last_heartbeat": NOW + 5}, []),
    ("another service too", {"services": ("web", "api")}, [key("api")]),
]


@pytest.mark.parametrize(
    ("fields", "changed"), [u[1:] for u in UPDATES], ids=[u[0] for u in UPDATES]
)
def test_only_services_whose_view_changed_produce_changes(
    registry: EndpointRegistry,
    make_workload: MakeWorkload,
    fields: dict[str, object],
    changed: list[ServiceKey],
) -> None:
    registry.upsert(make_workload("vm-1", services=("api",), address="10.0.0.1"), NOW)
    web = make_workload("vm-2", services=("web",), address="10.0.0.2")
    registry.upsert(web, NOW)
    before = dict(registry.views)
    changes = registry.upsert(dataclasses.replace(web, **fields), NOW)  # type: ignore[arg-type]
    assert [c.key for c in changes] == changed
    assert all(registry.views[c.key] == c.view for c in changes)
    assert {k: v for k, v in registry.views.items() if k not in changed} == {
        k: v for k, v in before.items() if k not in changed
    }


def test_remove_takes_the_workload_out_then_the_service(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    registry.upsert(make_workload("vm-1", address="10.0.0.1"), NOW)
    registry.upsert(make_workload("vm-2", address="10.0.0.2"), NOW)
    assert summary(registry.remove("shop/vm-1", NOW)) == [("shop/api", ["10.0.0.2"])]
    assert registry.remove("shop/vm-2", NOW) == [Change(key("api"), None)]
    assert registry.views == {}
    assert registry.workloads == {}


@pytest.mark.parametrize("operation", ["remove", "heartbeat"])
def test_unknown_workload(
    registry: EndpointRegistry, make_workload: MakeWorkload, operation: str
) -> None:
    registry.upsert(make_workload("vm-1"), NOW)
    with pytest.raises(UnknownWorkload) as caught:
        getattr(registry, operation)("shop/vm-2", NOW)
    assert caught.value.workload_id == "shop/vm-2"
    assert "shop/vm-2" in str(caught.value)
    assert list(registry.workloads) == ["shop/vm-1"]


# --- heartbeats and expiry -----------------------------------------------------------------


def test_an_expired_workload_is_taken_out_and_comes_back_with_a_heartbeat(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    registry.upsert(make_workload("vm-1", address="10.0.0.1", ttl=10.0, last_heartbeat=NOW), NOW)
    registry.upsert(make_workload("vm-2", address="10.0.0.2"), NOW)  # no ttl: stays

    assert registry.expire(NOW + 9.9) == ([], [])
    changes, expired = registry.expire(NOW + 10)
    assert expired == ["shop/vm-1"]
    assert summary(changes) == [("shop/api", ["10.0.0.2"])]
    assert "shop/vm-1" in registry.workloads  # the registration is kept
    assert registry.expire(NOW + 11) == ([], [])  # expired once, reported once

    beaten, changes = registry.heartbeat("shop/vm-1", NOW + 20)
    assert beaten.last_heartbeat == NOW + 20
    assert registry.workloads["shop/vm-1"] == beaten
    assert summary(changes) == [("shop/api", ["10.0.0.1", "10.0.0.2"])]
    assert registry.expire(NOW + 29) == ([], [])
    assert registry.expire(NOW + 30)[1] == ["shop/vm-1"]


def test_a_service_whose_workloads_all_expired_stays_with_no_endpoints(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    registry.upsert(make_workload(ttl=10.0, last_heartbeat=NOW), NOW)
    changes, _ = registry.expire(NOW + 10)
    assert len(changes) == 1
    view = changes[0].view
    assert view is not None
    assert view.endpoints == ()
    assert view.info.ports == (PortInfo("http", 8080),)
    assert registry.views[key("api")] == view


def test_a_heartbeat_of_a_live_workload_changes_no_view(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    registry.upsert(make_workload(ttl=10.0, last_heartbeat=NOW), NOW)
    before = dict(registry.views)
    beaten, changes = registry.heartbeat("shop/vm-1", NOW + 5)
    assert changes == []
    assert beaten.expires_at == NOW + 15
    assert registry.views == before
    assert registry.expire(NOW + 12) == ([], [])  # the heartbeat counted


def test_a_workload_without_ttl_never_expires(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    registry.upsert(make_workload(ttl=None, last_heartbeat=0.0), NOW)
    assert registry.expire(1e12) == ([], [])
    assert addresses(registry.views[key("api")]) == ["10.0.0.1"]


def test_a_registration_already_past_its_ttl_is_not_an_endpoint(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    """As after a restart: the stored heartbeat is older than the TTL."""
    changes = registry.upsert(make_workload(ttl=10.0, last_heartbeat=NOW - 60), NOW)
    assert summary(changes) == [("shop/api", [])]
    assert registry.expire(NOW + 1) == ([], [])  # already out: nothing to take out
    _, changes = registry.heartbeat("shop/vm-1", NOW + 2)
    assert summary(changes) == [("shop/api", ["10.0.0.1"])]


def test_views_count_a_workload_past_its_ttl_until_expire_judges_it(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    """Its TTL passed and another change recomputed the service before the periodic
    ``expire`` ran: the view still counts it (the verdict, not the clock, decides what a
    view holds), and a heartbeat then keeps it with no flap. With replicas, a replica whose
    clock says "past" may simply not have heard the heartbeats another replica did."""
    registry.upsert(make_workload("vm-1", address="10.0.0.1", ttl=10.0, last_heartbeat=NOW), NOW)
    changes = registry.upsert(make_workload("vm-2", address="10.0.0.2"), NOW + 12)
    assert summary(changes) == [("shop/api", ["10.0.0.1", "10.0.0.2"])]

    _, changes = registry.heartbeat("shop/vm-1", NOW + 13)
    assert changes == []
    assert registry.expire(NOW + 14) == ([], [])
    assert addresses(registry.views[key("api")]) == ["10.0.0.1", "10.0.0.2"]

    changes, expired = registry.expire(NOW + 24)  # judged: out
    assert (summary(changes), expired) == ([("shop/api", ["10.0.0.2"])], ["shop/vm-1"])


# --- grace: the control plane could not persist heartbeats --------------------------------


def test_a_held_workload_outlives_its_ttl_until_released_and_one_ttl_more(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    registry.upsert(make_workload("vm-1", address="10.0.0.1", ttl=10.0, last_heartbeat=NOW), NOW)
    registry.upsert(make_workload("vm-2", address="10.0.0.2", ttl=10.0, last_heartbeat=NOW), NOW)
    registry.upsert(make_workload("vm-3", address="10.0.0.3", ttl=None), NOW)

    assert registry.hold(NOW + 5) == 2  # vm-3 has no TTL: nothing to hold
    assert registry.expire(NOW + 100) == ([], [])  # far past the TTL: still in
    assert addresses(registry.views[key("api")]) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]

    assert registry.release(NOW + 100) == 2
    assert registry.grace_until("shop/vm-1") == NOW + 110
    assert registry.expire(NOW + 109.9) == ([], [])
    changes, expired = registry.expire(NOW + 110)
    assert expired == ["shop/vm-1", "shop/vm-2"]
    assert summary(changes) == [("shop/api", ["10.0.0.3"])]
    assert registry.grace_until("shop/vm-1") is None  # a spent grace is forgotten


def test_a_workload_dead_before_the_hold_stays_dead(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    registry.upsert(make_workload(ttl=10.0, last_heartbeat=NOW), NOW)
    registry.expire(NOW + 10)
    assert registry.hold(NOW + 20) == 0
    registry.release(NOW + 30)
    assert addresses(registry.views[key("api")]) == []


def test_a_held_workload_that_beats_keeps_its_own_deadline_after_release(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    """A later heartbeat wins over the grace; the grace never shortens a workload's life."""
    registry.upsert(make_workload(ttl=10.0, last_heartbeat=NOW), NOW)
    registry.hold(NOW + 1, ["shop/vm-1"])
    registry.heartbeat("shop/vm-1", NOW + 50)
    registry.release(NOW + 52)  # grace until NOW + 62, own deadline NOW + 60
    assert registry.expire(NOW + 61) == ([], [])
    assert registry.expire(NOW + 62)[1] == ["shop/vm-1"]


def test_a_re_registration_or_removal_ends_a_hold(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    registry.upsert(make_workload("vm-1", ttl=10.0, last_heartbeat=NOW), NOW)
    registry.upsert(make_workload("vm-2", address="10.0.0.2", ttl=10.0, last_heartbeat=NOW), NOW)
    registry.hold(NOW)
    registry.upsert(make_workload("vm-1", ttl=10.0, last_heartbeat=NOW + 1), NOW + 1)
    registry.remove("shop/vm-2", NOW + 1)
    assert registry.grace_until("shop/vm-1") is None
    assert registry.grace_until("shop/vm-2") is None
    assert registry.expire(NOW + 11)[1] == ["shop/vm-1"]


# --- declarations: what a ServiceEntry resolves to -----------------------------------------


def service_entry(name: str, spec: str, namespace: str = "shop") -> str:
    body = "\n".join("  " + line for line in spec.strip().splitlines())
    return (
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\n"
        f"metadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n{body}\n"
    )


def workload_entry(name: str, spec: str, namespace: str = "shop") -> str:
    body = "\n".join("  " + line for line in spec.strip().splitlines())
    return (
        "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\n"
        f"metadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n{body}\n"
    )


def documents(*texts: str) -> str:
    return "---\n".join(texts)


Resolved = dict[str, list[tuple[str, tuple[tuple[str, int], ...]]]]

RESOLUTIONS: list[tuple[str, str, Resolved]] = [
    (
        "NONE: no endpoints",
        """
hosts: [ext.example.com]
ports: [{number: 443, name: https, protocol: TLS}]
resolution: NONE
""",
        {"ext.example.com": []},
    ),
    (
        "NONE with a wildcard host",
        """
hosts: ["*.example.com"]
ports: [{number: 443, name: https, protocol: TLS}]
resolution: NONE
""",
        {"*.example.com": []},
    ),
    (
        "STATIC: endpoint ports, else targetPort, else number",
        """
hosts: [db.internal]
ports:
- {number: 80, name: http, protocol: HTTP, targetPort: 8080}
- {number: 90, name: grpc, protocol: GRPC}
resolution: STATIC
endpoints:
- {address: 10.0.0.1, ports: {grpc: 9090}}
- {address: 10.0.0.2}
- {address: 10.0.0.3, ports: {http: 7070}}
""",
        {
            "db.internal": [
                ("10.0.0.1", (("grpc", 9090), ("http", 8080))),
                ("10.0.0.2", (("grpc", 90), ("http", 8080))),
                ("10.0.0.3", (("grpc", 90), ("http", 7070))),
            ]
        },
    ),
    (
        "STATIC without endpoints or selector",
        """
hosts: [empty.internal]
ports: [{number: 80, name: http}]
resolution: STATIC
""",
        {"empty.internal": []},
    ),
    (
        "STATIC with a unix socket",
        """
hosts: [local.internal]
ports: [{number: 80, name: http, protocol: HTTP}]
resolution: STATIC
endpoints: [{address: "unix:///var/run/app.sock"}]
""",
        {"local.internal": [("unix:///var/run/app.sock", (("http", 80),))]},
    ),
    (
        "DNS: endpoint hostnames are kept as hostnames",
        """
hosts: [mongo.internal]
ports: [{number: 27018, name: mongo, protocol: MONGO, targetPort: 27017}]
resolution: DNS
endpoints:
- {address: db1.example.com}
- {address: db2.example.com, ports: {mongo: 27019}}
""",
        {
            "mongo.internal": [
                ("db1.example.com", (("mongo", 27017),)),
                ("db2.example.com", (("mongo", 27019),)),
            ]
        },
    ),
    (
        "DNS without endpoints: each host is its own endpoint",
        """
hosts: [api.example.com, www.example.com]
ports: [{number: 443, name: https, protocol: TLS}]
resolution: DNS
""",
        {
            "api.example.com": [("api.example.com", (("https", 443),))],
            "www.example.com": [("www.example.com", (("https", 443),))],
        },
    ),
    (
        "DNS with endpoints serves a wildcard host",
        """
hosts: ["*.cdn.example.com"]
ports: [{number: 443, name: https, protocol: TLS}]
resolution: DNS
endpoints: [{address: edge.cdn.example.com}]
""",
        {"*.cdn.example.com": [("edge.cdn.example.com", (("https", 443),))]},
    ),
    (
        "DNS_ROUND_ROBIN without endpoints",
        """
hosts: [rr.example.com]
ports: [{number: 80, name: http, protocol: HTTP, targetPort: 8080}]
resolution: DNS_ROUND_ROBIN
""",
        {"rr.example.com": [("rr.example.com", (("http", 8080),))]},
    ),
    (
        "DNS_ROUND_ROBIN with its one endpoint",
        """
hosts: [rr.example.com]
ports: [{number: 80, name: http, protocol: HTTP}]
resolution: DNS_ROUND_ROBIN
endpoints: [{address: lb.example.com}]
""",
        {"rr.example.com": [("lb.example.com", (("http", 80),))]},
    ),
]


@pytest.mark.parametrize(
    ("spec", "resolved"), [r[1:] for r in RESOLUTIONS], ids=[r[0] for r in RESOLUTIONS]
)
def test_service_entry_resolution(
    registry: EndpointRegistry, declarations: Parse, spec: str, resolved: Resolved
) -> None:
    entries, workload_entries = declarations(service_entry("entry", spec))
    changes = registry.declare(entries, workload_entries, NOW)
    assert [c.key for c in changes] == sorted(key(host) for host in resolved)
    found = {
        k.name: [(e.address, e.ports) for e in view.endpoints] for k, view in registry.views.items()
    }
    assert found == resolved
    for view in registry.views.values():
        assert view.info.hosts == (view.key.name,)
        assert all(e.source == "ServiceEntry shop/entry" for e in view.endpoints)


def test_a_wildcard_host_is_never_an_endpoint(
    registry: EndpointRegistry, declarations: Parse
) -> None:
    """The documents refuse DNS with a wildcard host and no endpoints; given one, none result."""
    spec = """
hosts: ["*.example.com", api.example.com]
ports: [{number: 443, name: https, protocol: TLS}]
resolution: NONE
"""
    (entry,), _ = declarations(service_entry("wild", spec))
    registry.declare([dataclasses.replace(entry, resolution="DNS")], [], NOW)
    assert addresses(registry.views[key("*.example.com")]) == []
    assert addresses(registry.views[key("api.example.com")]) == ["api.example.com"]


CARRIED = service_entry(
    "payments",
    """
hosts: [pay.example.com, pay-eu.example.com]
addresses: [240.0.0.1, 240.0.1.0/24]
ports: [{number: 443, name: https, protocol: HTTPS, targetPort: 8443}]
location: MESH_INTERNAL
resolution: STATIC
exportTo: [".", bank]
subjectAltNames: ["spiffe://cluster.local/ns/shop/sa/payments"]
endpoints:
- address: 10.3.0.1
  labels: {version: v1, app: payments}
  network: vm-net
  locality: us-east/zone-a/rack-1
  weight: 0
  serviceAccount: payments
- {address: 10.3.0.2, weight: 5}
""",
)


def test_service_entry_fields_are_carried_into_views_and_endpoints(
    registry: EndpointRegistry, declarations: Parse
) -> None:
    registry.declare(*declarations(CARRIED), NOW)
    source = "ServiceEntry shop/payments"
    endpoints = (
        EndpointInfo(
            address="10.3.0.1",
            ports=(("https", 8443),),
            labels=(("app", "payments"), ("version", "v1")),
            locality="us-east/zone-a/rack-1",
            network="vm-net",
            weight=1,  # 0 means "not set": an equal share
            service_account="payments",
            source=source,
        ),
        EndpointInfo(address="10.3.0.2", ports=(("https", 8443),), weight=5, source=source),
    )
    assert registry.views == {
        key(host): ServiceView(
            ServiceInfo(
                key=key(host),
                ports=(PortInfo("https", 443, "HTTPS", 8443),),
                hosts=(host,),
                addresses=("240.0.0.1", "240.0.1.0/24"),
                location="MESH_INTERNAL",
                resolution="STATIC",
                export_to=(".", "bank"),
                subject_alt_names=("spiffe://cluster.local/ns/shop/sa/payments",),
                source=source,
            ),
            endpoints,
        )
        for host in ("pay.example.com", "pay-eu.example.com")
    }


def test_location_defaults_to_mesh_external(
    registry: EndpointRegistry, declarations: Parse
) -> None:
    spec = "hosts: [ext.example.com]\nports: [{number: 80, name: http}]"
    registry.declare(*declarations(service_entry("ext", spec)), NOW)
    info = registry.views[key("ext.example.com")].info
    assert (info.location, info.resolution) == ("MESH_EXTERNAL", "NONE")


# --- declarations: workloadSelector --------------------------------------------------------

SELECTING = documents(
    service_entry(
        "db",
        """
hosts: [db.shop.internal]
ports: [{number: 5432, name: tcp, protocol: TCP, targetPort: 5433}]
location: MESH_INTERNAL
resolution: STATIC
workloadSelector: {labels: {app: db}}
""",
    ),
    workload_entry(
        "db-vm-1",
        """
address: 10.1.0.1
labels: {app: db, version: v1}
ports: {tcp: 6000}
network: vm-net
locality: us-east/zone-a
serviceAccount: db
""",
    ),
    workload_entry("db-vm-2", "address: 10.1.0.2\nlabels: {app: db}\nweight: 0"),
    workload_entry("web-vm", "address: 10.1.0.3\nlabels: {app: web}"),
    workload_entry("db-vm", "address: 10.1.0.4\nlabels: {app: db}", namespace="bank"),
)
DB = key("db.shop.internal")


def test_a_selector_picks_workload_entries_of_its_namespace(
    registry: EndpointRegistry, declarations: Parse
) -> None:
    changes = registry.declare(*declarations(SELECTING), NOW)
    assert [c.key for c in changes] == [DB]
    assert registry.views[DB].endpoints == (
        EndpointInfo(
            address="10.1.0.1",
            ports=(("tcp", 6000),),
            labels=(("app", "db"), ("version", "v1")),
            locality="us-east/zone-a",
            network="vm-net",
            weight=1,
            service_account="db",
            workload="shop/db-vm-1",
            source="WorkloadEntry shop/db-vm-1",
        ),
        EndpointInfo(
            address="10.1.0.2",
            ports=(("tcp", 5433),),
            labels=(("app", "db"),),
            weight=1,
            workload="shop/db-vm-2",
            source="WorkloadEntry shop/db-vm-2",
        ),
    )


def test_a_selector_picks_registered_workloads_by_labels(
    registry: EndpointRegistry, declarations: Parse, make_workload: MakeWorkload
) -> None:
    registry.declare(*declarations(SELECTING), NOW)
    agent = make_workload(
        "db-agent",
        services=("db-agent",),
        address="10.1.0.9",
        ports=(("tcp", 7000),),
        labels=(("app", "db"),),
        ttl=10.0,
        last_heartbeat=NOW,
    )
    changes = registry.upsert(agent, NOW)
    assert [c.key for c in changes] == [key("db-agent"), DB]
    assert (
        EndpointInfo(
            address="10.1.0.9",
            ports=(("tcp", 7000),),
            labels=(("app", "db"),),
            service_account="default",  # as in its own services
            workload="shop/db-agent",
            source="registration",
        )
        in registry.views[DB].endpoints
    )
    assert addresses(registry.views[DB]) == ["10.1.0.1", "10.1.0.2", "10.1.0.9"]

    # its labels change: no longer selected; changed back: selected again
    relabelled = dataclasses.replace(agent, labels=(("app", "cache"),))
    assert summary(registry.upsert(relabelled, NOW)) == [
        ("shop/db-agent", ["10.1.0.9"]),
        ("shop/db.shop.internal", ["10.1.0.1", "10.1.0.2"]),
    ]
    assert summary(registry.upsert(agent, NOW)) == [
        ("shop/db-agent", ["10.1.0.9"]),
        ("shop/db.shop.internal", ["10.1.0.1", "10.1.0.2", "10.1.0.9"]),
    ]

    # expired: not selected; a heartbeat brings it back
    changes, expired = registry.expire(NOW + 10)
    assert expired == ["shop/db-agent"]
    assert summary(changes) == [
        ("shop/db-agent", []),
        ("shop/db.shop.internal", ["10.1.0.1", "10.1.0.2"]),
    ]
    _, changes = registry.heartbeat("shop/db-agent", NOW + 11)
    assert [c.key for c in changes] == [key("db-agent"), DB]
    assert addresses(registry.views[DB]) == ["10.1.0.1", "10.1.0.2", "10.1.0.9"]

    # deregistered: gone from both
    assert summary(registry.remove("shop/db-agent", NOW + 12)) == [
        ("shop/db-agent", None),
        ("shop/db.shop.internal", ["10.1.0.1", "10.1.0.2"]),
    ]


def test_a_selector_ignores_registered_workloads_of_other_namespaces_and_labels(
    registry: EndpointRegistry, declarations: Parse, make_workload: MakeWorkload
) -> None:
    registry.declare(*declarations(SELECTING), NOW)
    before = registry.views[DB]
    elsewhere = make_workload("db", namespace="bank", labels=(("app", "db"),))
    other_app = make_workload("web", address="10.0.0.2", labels=(("app", "web"),))
    assert [c.key for c in registry.upsert(elsewhere, NOW)] == [key("api", "bank")]
    assert [c.key for c in registry.upsert(other_app, NOW)] == [key("api")]
    assert registry.views[DB] == before


def test_a_workload_registered_before_the_declaration_is_selected(
    registry: EndpointRegistry, declarations: Parse, make_workload: MakeWorkload
) -> None:
    registry.upsert(make_workload("db-agent", address="10.1.0.9", labels=(("app", "db"),)), NOW)
    registry.declare(*declarations(SELECTING), NOW)
    assert addresses(registry.views[DB]) == ["10.1.0.1", "10.1.0.2", "10.1.0.9"]


# --- declarations: conflicts, removal, reloads ---------------------------------------------

HTTP = "ports: [{number: 80, name: http, protocol: HTTP}]\nresolution: STATIC"
CONFLICTING = documents(
    service_entry(
        "b-second",
        f"hosts: [api.example.com, extra.example.com]\n{HTTP}\nendpoints: [{{address: 10.2.0.2}}]",
    ),
    service_entry(
        "a-first", f"hosts: [api.example.com]\n{HTTP}\nendpoints: [{{address: 10.2.0.1}}]"
    ),
    service_entry(
        "c-other",
        f"hosts: [api.example.com]\n{HTTP}\nendpoints: [{{address: 10.2.0.3}}]",
        namespace="bank",
    ),
)


def test_the_first_service_entry_by_id_owns_a_host(
    registry: EndpointRegistry, declarations: Parse
) -> None:
    entries, workload_entries = declarations(CONFLICTING)
    registry.declare(entries, workload_entries, NOW)
    assert {str(k): addresses(v) for k, v in registry.views.items()} == {
        "shop/api.example.com": ["10.2.0.1"],
        "shop/extra.example.com": ["10.2.0.2"],  # the loser keeps its other hosts
        "bank/api.example.com": ["10.2.0.3"],  # another namespace: no conflict
    }
    assert registry.views[key("api.example.com")].info.source == "ServiceEntry shop/a-first"
    assert len(registry.conflicts) == 1
    conflict = registry.conflicts[0]
    assert conflict.startswith("ServiceEntry shop/b-second:")
    assert "'api.example.com'" in conflict
    assert "ServiceEntry shop/a-first" in conflict

    # the order of the documents does not matter
    again = EndpointRegistry()
    again.declare(list(reversed(entries)), workload_entries, NOW)
    assert again.views == registry.views
    assert again.conflicts == registry.conflicts

    # without the winner, the other entry takes the host
    without = [e for e in entries if e.name != "a-first"]
    assert summary(registry.declare(without, workload_entries, NOW)) == [
        ("shop/api.example.com", ["10.2.0.2"])
    ]
    assert registry.conflicts == []


def test_removing_an_entry_removes_its_views(
    registry: EndpointRegistry, declarations: Parse
) -> None:
    entries, workload_entries = declarations(CONFLICTING)
    registry.declare(entries, workload_entries, NOW)
    kept = [e for e in entries if e.name == "c-other"]
    assert registry.declare(kept, workload_entries, NOW) == [
        Change(key("api.example.com"), None),
        Change(key("extra.example.com"), None),
    ]
    assert registry.declare([], [], NOW) == [Change(key("api.example.com", "bank"), None)]
    assert registry.views == {}


def test_removing_an_entry_keeps_registered_workloads_of_the_same_name(
    registry: EndpointRegistry, declarations: Parse, make_workload: MakeWorkload
) -> None:
    registry.upsert(make_workload(services=("db",), address="10.0.0.5"), NOW)
    registry.declare(*declarations(SELECTING.replace("db.shop.internal", "db")), NOW)
    assert addresses(registry.views[key("db")]) == ["10.0.0.5", "10.1.0.1", "10.1.0.2"]
    changes = registry.declare([], [], NOW)
    assert summary(changes) == [("shop/db", ["10.0.0.5"])]
    assert registry.views[key("db")].info == ServiceInfo(key("db"), (PortInfo("http", 8080),))


def test_a_reload_with_identical_content_changes_nothing(
    registry: EndpointRegistry, declarations: Parse
) -> None:
    text = documents(SELECTING, CARRIED, CONFLICTING)
    first = registry.declare(*declarations(text), NOW)
    assert len(first) == 6
    views = dict(registry.views)
    assert registry.declare(*declarations(text), NOW + 1) == []
    assert registry.views == views


def test_a_reload_changes_only_the_services_it_touches(
    registry: EndpointRegistry, declarations: Parse
) -> None:
    registry.declare(*declarations(documents(SELECTING, CARRIED)), NOW)
    moved = SELECTING.replace("address: 10.1.0.2", "address: 10.1.0.20")
    assert summary(registry.declare(*declarations(documents(moved, CARRIED)), NOW)) == [
        ("shop/db.shop.internal", ["10.1.0.1", "10.1.0.20"])
    ]
    added = service_entry("new", "hosts: [new.example.com]\nports: [{number: 80, name: http}]")
    changes = registry.declare(*declarations(documents(moved, CARRIED, added)), NOW)
    assert [c.key for c in changes] == [key("new.example.com")]


def test_after_a_restart_every_ttl_workload_gets_one_ttl_from_then(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    """Heartbeats could not arrive while endpoints-vm restarted: that time is not held
    against a workload that beat within two TTLs; one that really stopped leaves one TTL
    after the restart."""
    registry.upsert(make_workload("vm-1", ttl=10.0, last_heartbeat=NOW), NOW + 15)
    registry.upsert(make_workload("vm-2", address="10.0.0.2", ttl=None), NOW + 15)
    silent = make_workload("vm-3", address="10.0.0.3", ttl=10.0, last_heartbeat=NOW - 10)
    registry.upsert(silent, NOW + 15)
    assert addresses(registry.views[key("api")]) == ["10.0.0.2"]  # past their TTL when loaded

    granted, changes = registry.restarted(NOW + 15)
    assert granted == 1  # vm-3 was silent for more than two TTLs: its heartbeats decide
    assert summary(changes) == [("shop/api", ["10.0.0.1", "10.0.0.2"])]
    assert registry.grace_until("shop/vm-1") == NOW + 25
    assert registry.expire(NOW + 24.9) == ([], [])
    assert registry.expire(NOW + 25)[1] == ["shop/vm-1"]


def test_a_registration_converts_only_its_own_endpoint(
    registry: EndpointRegistry, make_workload: MakeWorkload
) -> None:
    """The service's other endpoints are the objects of its last view; the view is the
    sorted endpoints of its live workloads, as if built from nothing."""
    for i in range(30):
        registry.upsert(make_workload(f"vm-{i}", address=f"10.0.{i % 3}.{i}"), NOW)
    before = {e.workload: e for e in registry.views[key("api")].endpoints}
    newcomer = make_workload("vm-new", address="10.0.0.200")
    [change] = registry.upsert(newcomer, NOW)
    assert change.view is not None
    after = change.view.endpoints
    assert sum(1 for e in after if before.get(e.workload) is e) == 30
    expected = sorted([*before.values(), newcomer.endpoint()])
    assert list(after) == expected
    # gone: deregistered, its endpoint leaves; the rest are still the same objects
    [change] = registry.remove("shop/vm-3", NOW)
    assert change.view is not None
    assert [e.workload for e in change.view.endpoints if before.get(e.workload) is e] == [
        e.workload for e in expected if e.workload not in ("shop/vm-new", "shop/vm-3")
    ]

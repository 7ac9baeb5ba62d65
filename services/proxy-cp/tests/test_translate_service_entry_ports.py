"""ServiceEntry hosts on TLS, HTTPS, TCP and MONGO ports: the outbound listeners that carry
them, for a pod whose traffic is captured and for a VM sidecar; each checked on the
resources and by ``envoy --mode validate`` (which refuses two chains of one match).

The entries are the Istio seed's own (dropbox, wikipedia, mongo) and the README's
``payments.example.com:443``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp.testing.static import as_dict, buyer_view, cluster, static_bootstrap
from trellis_proxy_cp.translate import names
from trellis_proxy_cp.translate.proxy import translate
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.translate.settings import ProxySettings
from trellis_testing import envoy

MATERIAL = SecretMaterial(b"-----BEGIN CERTIFICATE-----\n", b"key", b"ca")
TLS_INSPECTOR = "envoy.filters.listener.tls_inspector"
DROPBOX = "shop/dropbox|443"
WIKIPEDIA = "shop/wikipedia|443"
PAYMENTS = "shop/payments|443"
MONGO = "shop/mongo|27018"
LEGACY = "shop/legacy|5433"
LEGACY_B = "shop/legacy-b|5433"


def entry(host: str, port: int, protocol: str, cluster_name: str, *addresses: str) -> Any:
    return pb.ExternalService(
        host=host, port=port, protocol=protocol, cluster=cluster_name, addresses=list(addresses)
    )


def seed_view() -> pb.View:
    """bookbuyer's view (an HTTP entry on port 80) with the seed's entries: two TLS hosts
    on 443 (one a wildcard of resolution NONE), an HTTPS host on 443, a MONGO host with
    addresses, two TCP entries without addresses on one port, and an HTTP entry on 443."""
    view = buyer_view()
    view.external.extend(
        [
            entry("*.wikipedia.org", 443, "tls", WIKIPEDIA),
            entry("legacy-a.internal", 5433, "tcp", LEGACY),
            entry("legacy-b.internal", 5433, "tcp", LEGACY_B),
            entry("mymongodb.somedomain", 27018, "mongo", MONGO, "192.192.192.192/24"),
            entry("payments.example.com", 443, "https", PAYMENTS),
            entry("plain.example.com", 443, "http", "shop/plain|443"),
            entry("wikipedia.org", 443, "tls", WIKIPEDIA),
            entry("www.dropbox.com", 443, "tls", DROPBOX),
        ]
    )
    view.clusters.extend(
        [
            cluster(DROPBOX, ("www.dropbox.com", 443), discovery="DNS", mesh_tls=False),
            cluster(WIKIPEDIA, discovery="PASSTHROUGH", protocol="tcp", mesh_tls=False),
            cluster(PAYMENTS, ("payments.example.com", 443), discovery="DNS", mesh_tls=False),
            cluster(MONGO, ("2.2.2.2", 7777), protocol="tcp"),  # MESH_INTERNAL: mesh mTLS
            cluster(LEGACY, ("10.1.0.5", 5433), protocol="tcp", mesh_tls=False),
            cluster(LEGACY_B, ("10.1.0.6", 5433), protocol="tcp", mesh_tls=False),
            cluster("shop/plain|443", ("plain.example.com", 443), discovery="DNS"),
        ]
    )
    return view


def listeners_of(view: pb.View, settings: ProxySettings) -> dict[str, dict[str, Any]]:
    resources = translate(view, settings, MATERIAL)
    return {found["name"]: found for found in map(as_dict, resources.listeners)}


def chains(listener: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The listener's chains by name; an entry's name is on one chain only (a mesh
    service's is on one per address)."""
    found: dict[str, dict[str, Any]] = {}
    for chain in listener["filter_chains"]:
        name = chain.get("name", "")
        assert not (name.startswith("external|") and name in found), chain
        found[name] = chain
    return found


def filters(chain: dict[str, Any]) -> list[tuple[str, str]]:
    """(filter name, its tcp_proxy cluster or "")."""
    return [(f["name"], f["typed_config"].get("cluster", "")) for f in chain["filters"]]


def accepted(view: pb.View, settings: ProxySettings, material: SecretMaterial) -> None:
    result = envoy.validate(static_bootstrap(translate(view, settings, material)))
    assert result.returncode == 0, result.stdout + result.stderr


def test_captured_tls_hosts_share_port_443_by_sni_next_to_http() -> None:
    listener = listeners_of(seed_view(), ProxySettings(capture=True))[names.OUTBOUND_LISTENER]
    found = chains(listener)
    for host, cluster_name in [
        ("www.dropbox.com", DROPBOX),
        ("*.wikipedia.org", WIKIPEDIA),  # a wildcard, as Envoy matches server names
        ("wikipedia.org", WIKIPEDIA),
        ("payments.example.com", PAYMENTS),
    ]:
        chain = found[f"external|{host}|443"]
        assert chain["filter_chain_match"] == {
            "destination_port": 443,
            "server_names": [host],
            "transport_protocol": "tls",
        }
        # the application's TLS passes through: no transport socket, tcp_proxy only
        assert "transport_socket" not in chain
        assert filters(chain) == [("envoy.filters.network.tcp_proxy", cluster_name)]
    # plain HTTP to port 443 still reaches the outbound routes (Host header)
    assert found["outbound-http|443"]["filter_chain_match"] == {"destination_port": 443}
    inspector = next(f for f in listener["listener_filters"] if f["name"] == TLS_INSPECTOR)
    assert inspector["filter_disabled"] == {
        "not_match": {"destination_port_range": {"start": 443, "end": 444}}
    }


def test_captured_tcp_goes_by_addresses_else_by_port_and_mongo_is_parsed_first() -> None:
    found = chains(listeners_of(seed_view(), ProxySettings(capture=True))["outbound"])
    mongo = found["external|mymongodb.somedomain|27018"]
    assert mongo["filter_chain_match"] == {
        "destination_port": 27018,
        "prefix_ranges": [{"address_prefix": "192.192.192.0", "prefix_len": 24}],
    }
    assert filters(mongo) == [
        ("envoy.filters.network.mongo_proxy", ""),
        ("envoy.filters.network.tcp_proxy", MONGO),
    ]
    assert mongo["filters"][0]["typed_config"]["stat_prefix"] == (
        "external_mymongodb.somedomain_27018"
    )
    # no addresses: the port, for any address; of two such entries the first keeps it
    legacy = found["external|legacy-a.internal|5433"]
    assert legacy["filter_chain_match"] == {"destination_port": 5433}
    assert filters(legacy) == [("envoy.filters.network.tcp_proxy", LEGACY)]
    assert "external|legacy-b.internal|5433" not in found


def test_a_vm_sidecar_gets_a_listener_per_port_with_a_chain_per_entry() -> None:
    found = listeners_of(seed_view(), ProxySettings())
    tls = found["outbound-external|443"]
    assert tls["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 443}
    by_name = chains(tls)
    assert set(by_name) == {
        "external|payments.example.com|443",
        "external|www.dropbox.com|443",
        "external|*.wikipedia.org|443",
        "external|wikipedia.org|443",
    }
    assert by_name["external|www.dropbox.com|443"]["filter_chain_match"] == {
        "server_names": ["www.dropbox.com"],
        "transport_protocol": "tls",
    }
    assert [f["name"] for f in tls["listener_filters"]] == [TLS_INSPECTOR]
    assert tls["continue_on_listener_filters_timeout"] is True
    # TCP and MONGO: the port alone (the destination is the sidecar's own address)
    (legacy,) = found["outbound-external|5433"]["filter_chains"]
    assert legacy["name"] == "external|legacy-a.internal|5433"
    assert "filter_chain_match" not in legacy
    assert "listener_filters" not in found["outbound-external|5433"]
    (mongo,) = found["outbound-external|27018"]["filter_chains"]
    assert [f["name"] for f in mongo["filters"]] == [
        "envoy.filters.network.mongo_proxy",
        "envoy.filters.network.tcp_proxy",
    ]
    # HTTP entries stay on the shared outbound HTTP listener
    assert not any(name.endswith("|80") for name in found)


def test_a_vm_sends_a_resolution_none_tls_host_to_the_host_its_sni_names() -> None:
    """On a VM the original destination is the sidecar itself: the ClientHello's name, on
    the entry's port, is where the application meant to go."""
    resources = translate(seed_view(), ProxySettings(), MATERIAL)
    listener = next(
        found
        for found in map(as_dict, resources.listeners)
        if found["name"] == "outbound-external|443"
    )
    forwarded = "sni-forward|" + WIKIPEDIA
    for host in ("*.wikipedia.org", "wikipedia.org"):
        chain = chains(listener)[f"external|{host}|443"]
        assert filters(chain) == [
            ("envoy.filters.network.sni_dynamic_forward_proxy", ""),
            ("envoy.filters.network.tcp_proxy", forwarded),
        ]
        assert chain["filters"][0]["typed_config"]["port_value"] == 443
    by_name = {c["name"]: c for c in map(as_dict, resources.clusters)}
    assert by_name[forwarded]["cluster_type"]["name"] == "envoy.clusters.dynamic_forward_proxy"
    # a captured pod keeps the original destination (ORIGINAL_DST): no such cluster
    captured = translate(seed_view(), ProxySettings(capture=True), MATERIAL)
    assert forwarded not in {as_dict(c)["name"] for c in captured.clusters}


def test_a_vm_mesh_tcp_service_and_tls_entries_share_the_port_listener() -> None:
    view = seed_view()
    db = "shop/secure-db|443"
    view.outbound.append(
        pb.OutboundService(
            namespace="shop", name="secure-db", port=443, protocol="tcp",
            routes=[pb.Route(name="default", clusters=[pb.WeightedCluster(cluster=db, weight=1)])],
        )
    )  # fmt: skip
    view.clusters.append(cluster(db, ("10.0.0.30", 443), protocol="tcp"))
    found = listeners_of(view, ProxySettings())
    assert "outbound-external|443" not in found
    shared = found[names.outbound_tcp_listener("shop", "secure-db", 443)]
    matches = [c.get("filter_chain_match", {}) for c in shared["filter_chains"]]
    # the mesh service keeps the port; each TLS host's ClientHello goes to its entry
    assert matches[0] == {}
    assert sorted(m["server_names"][0] for m in matches[1:]) == [
        "*.wikipedia.org",
        "payments.example.com",
        "wikipedia.org",
        "www.dropbox.com",
    ]
    assert [f["name"] for f in shared["listener_filters"]] == [TLS_INSPECTOR]


def test_a_port_of_the_sidecars_own_gets_no_entry_listener() -> None:
    view = seed_view()
    found = listeners_of(view, ProxySettings(outbound_port=5433))
    assert "outbound-external|5433" not in found
    assert "outbound-external|27018" in found


def test_envoy_accepts_the_entries_captured_and_on_a_vm(
    real_material: SecretMaterial, sidecar: Callable[..., ProxySettings]
) -> None:
    accepted(seed_view(), sidecar(capture=True), real_material)
    accepted(seed_view(), sidecar(), real_material)
    shared = seed_view()
    shared.outbound.append(
        pb.OutboundService(
            namespace="shop", name="secure-db", port=443, protocol="tcp",
            routes=[pb.Route(name="default",
                             clusters=[pb.WeightedCluster(cluster="shop/secure-db|443",
                                                          weight=1)])],
        )
    )  # fmt: skip
    shared.clusters.append(cluster("shop/secure-db|443", ("10.0.0.30", 443), protocol="tcp"))
    accepted(shared, sidecar(), real_material)


def test_envoy_refuses_two_chains_of_one_match_which_is_why_the_first_keeps_it(
    real_material: SecretMaterial, sidecar: Callable[..., ProxySettings]
) -> None:
    """The check the deduplication stands on: a copy of a chain makes Envoy refuse."""
    resources = translate(seed_view(), sidecar(), real_material)
    bootstrap = static_bootstrap(resources)
    tls = next(
        item
        for item in bootstrap["static_resources"]["listeners"]
        if item["name"] == "outbound-external|443"
    )
    twin = dict(tls["filter_chains"][0], name="twin")
    tls["filter_chains"].append(twin)
    result = envoy.validate(bootstrap)
    assert result.returncode != 0
    assert "duplicate matcher" in result.stdout + result.stderr

"""Listeners for a sidecar whose pod redirects its traffic (``capture``): chains by
original destination outbound, by pod port inbound; passthrough or blackhole; Envoy
itself accepts the result."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp.testing.static import as_dict, buyer_view, cluster, static_bootstrap
from trellis_proxy_cp.translate import capture, names
from trellis_proxy_cp.translate.proxy import translate
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.translate.settings import InvalidNodeMetadata, ProxySettings, from_metadata
from trellis_testing import envoy

MATERIAL = SecretMaterial(b"-----BEGIN CERTIFICATE-----\n", b"key", b"ca")
CAPTURE = ProxySettings(capture=True)


def captured_view(egress: bool = False) -> pb.View:
    """bookbuyer's view with ClusterIPs, a TCP database, a headless service, a TLS
    ServiceEntry host, a ServiceEntry range and an Egress rule by address."""
    view = buyer_view()
    view.mesh.egress = egress
    view.outbound[0].addresses.append("10.96.0.10")
    view.outbound[1].addresses.append("10.96.0.11")
    db = "shop/db|5432"
    view.outbound.append(
        pb.OutboundService(
            namespace="shop", name="db", port=5432, protocol="tcp", addresses=["10.96.0.20"],
            routes=[pb.Route(name="default", clusters=[pb.WeightedCluster(cluster=db, weight=1)])],
        )
    )  # fmt: skip
    headless = "shop/ledger|7000"
    view.outbound.append(
        pb.OutboundService(
            namespace="shop", name="ledger", port=7000, protocol="tcp",
            routes=[pb.Route(name="default",
                             clusters=[pb.WeightedCluster(cluster=headless, weight=1)])],
        )
    )  # fmt: skip
    view.clusters.append(cluster(db, ("10.244.1.5", 5432), protocol="tcp"))
    view.clusters.append(
        cluster(headless, ("10.244.1.7", 7000), ("10.244.1.8", 7000), protocol="tcp")
    )
    view.external.append(
        pb.ExternalService(
            host="api.stripe.com", port=443, protocol="tls", cluster="shop/api.stripe.com|443"
        )
    )
    view.external.append(
        pb.ExternalService(
            host="partners", port=9000, protocol="tcp", cluster="shop/passthrough.example|443",
            addresses=["203.0.113.0/24"],
        )
    )  # fmt: skip
    view.clusters.append(
        cluster(
            "shop/api.stripe.com|443", ("api.stripe.com", 443), discovery="DNS",
            protocol="tcp", mesh_tls=False,
        )
    )  # fmt: skip
    view.egress.append(
        pb.EgressRoute(
            policies=["shop/smtp"], protocol="tcp", port=25, ip_ranges=["198.51.100.0/24"]
        )
    )
    return view


def outbound_listener(view: pb.View) -> dict[str, Any]:
    resources = translate(view, CAPTURE, MATERIAL)
    return next(
        as_dict(item)
        for item in resources.listeners
        if as_dict(item)["name"] == names.OUTBOUND_LISTENER
    )


def chains_by_name(listener: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for chain in listener["filter_chains"]:
        found.setdefault(chain["name"], []).append(chain)
    return found


def destinations(chains: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [
        (
            c["filter_chain_match"]["prefix_ranges"][0]["address_prefix"],
            c["filter_chain_match"]["destination_port"],
        )
        for c in chains
    ]


def test_outbound_chains_go_by_cluster_ip_and_port_and_speak_each_protocol() -> None:
    listener = outbound_listener(captured_view())
    assert listener["listener_filters"][0]["name"] == "envoy.filters.listener.original_dst"
    assert "use_original_dst" not in listener  # no hand-off to the sidecar's own listeners
    chains = chains_by_name(listener)
    store = chains["outbound|bookstore/bookstore|14001"]
    assert destinations(store) == [("10.96.0.10", 14001)]
    assert store[0]["filters"][0]["name"] == capture.HCM
    db = chains["outbound|shop/db|5432"]
    assert destinations(db) == [("10.96.0.20", 5432)]
    assert db[0]["filters"][0]["name"] == capture.TCP_PROXY
    assert db[0]["filters"][0]["typed_config"]["cluster"] == "shop/db|5432"


def test_a_service_without_cluster_ips_is_matched_on_its_endpoints_addresses() -> None:
    chains = chains_by_name(outbound_listener(captured_view()))
    assert destinations(chains["outbound|shop/ledger|7000"]) == [
        ("10.244.1.7", 7000),
        ("10.244.1.8", 7000),
    ]


def test_tls_hosts_match_by_sni_and_only_their_port_is_inspected() -> None:
    listener = outbound_listener(captured_view())
    (stripe,) = chains_by_name(listener)["external|api.stripe.com|443"]
    match = stripe["filter_chain_match"]
    assert (match["server_names"], match["destination_port"], match["transport_protocol"]) == (
        ["api.stripe.com"],
        443,
        "tls",
    )
    _, inspector = listener["listener_filters"]  # after the original destination is back
    assert inspector["name"] == "envoy.filters.listener.tls_inspector"
    # disabled unless the destination port is 443: a server-first protocol elsewhere is
    # never held waiting for a ClientHello
    assert inspector["filter_disabled"] == {
        "not_match": {"destination_port_range": {"start": 443, "end": 444}}
    }


def test_service_entry_ranges_and_egress_ranges_get_chains_by_cidr() -> None:
    chains = chains_by_name(outbound_listener(captured_view()))
    assert destinations(chains["external|partners|9000"]) == [("203.0.113.0", 9000)]
    (smtp,) = chains["egress|shop/smtp|tcp|25"]
    assert smtp["filter_chain_match"]["prefix_ranges"] == [
        {"address_prefix": "198.51.100.0", "prefix_len": 24}
    ]
    assert smtp["filters"][0]["typed_config"]["cluster"] == capture.PASSTHROUGH


@pytest.mark.parametrize(
    ("egress", "cluster_name", "stat"),
    [
        (False, capture.BLACKHOLE, "outbound_blackhole"),
        (True, capture.PASSTHROUGH, "outbound_passthrough"),
    ],
)
def test_anything_else_is_refused_or_passed_through_by_meshconfig_egress(
    egress: bool, cluster_name: str, stat: str
) -> None:
    view = captured_view(egress=egress)
    listener = outbound_listener(view)
    fallback = listener["default_filter_chain"]["filters"][0]["typed_config"]
    assert (fallback["cluster"], fallback["stat_prefix"]) == (cluster_name, stat)
    made = {as_dict(c)["name"]: as_dict(c) for c in translate(view, CAPTURE, MATERIAL).clusters}
    assert made[capture.PASSTHROUGH]["type"] == "ORIGINAL_DST"
    assert (capture.BLACKHOLE in made) is not egress


def test_one_address_and_port_is_one_chain_the_first_destination_keeps_it() -> None:
    view = captured_view()
    view.outbound[1].addresses[:] = ["10.96.0.10"]  # bookstore-v1 claims bookstore's IP
    listener = outbound_listener(view)
    matches = [str(sorted(c["filter_chain_match"].items())) for c in listener["filter_chains"]]
    assert len(matches) == len(set(matches))
    assert "outbound|bookstore/bookstore-v1|14001" not in chains_by_name(listener)


def store_view(permissive: bool = False) -> pb.View:
    rule = pb.InboundRule(policy="bookstore/buyer", source_spiffe_ids=["spiffe://x/ns/a/sa/b"])
    return pb.View(
        identity="bookstore/bookstore-v1",
        namespace="bookstore",
        service="bookstore-v1",
        mesh=pb.MeshSettings(permissive=permissive),
        inbound=[
            pb.InboundPort(port=14001, target_port=8081, protocol="http", name="h", rules=[rule]),
            pb.InboundPort(port=6379, target_port=6379, protocol="tcp", name="r", rules=[rule]),
            pb.InboundPort(port=80, target_port=8081, protocol="http", name="a", rules=[rule]),
        ],
    )


def test_inbound_chains_go_by_pod_port_each_with_its_own_routes_and_mtls() -> None:
    resources = translate(store_view(), CAPTURE, MATERIAL)
    inbound = next(as_dict(x) for x in resources.listeners if as_dict(x)["name"] == "inbound")
    assert [f["name"] for f in inbound["listener_filters"]] == [
        "envoy.filters.listener.original_dst"
    ]
    chains = {c["name"]: c for c in inbound["filter_chains"]}
    assert set(chains) == {"inbound|14001", "inbound|6379"}  # port 80 shares 8081: first wins
    http = chains["inbound|14001"]
    assert http["filter_chain_match"] == {"destination_port": 8081}
    assert http["transport_socket"]["name"] == "envoy.transport_sockets.tls"
    rds = http["filters"][0]["typed_config"]["rds"]["route_config_name"]
    assert rds == "inbound-http|14001"
    assert [f["name"] for f in chains["inbound|6379"]["filters"]] == [
        "envoy.filters.network.rbac",
        "envoy.filters.network.tcp_proxy",
    ]
    assert [as_dict(r)["name"] for r in resources.routes] == [
        names.OUTBOUND_ROUTES,
        "inbound-http|14001",
    ]
    made = {as_dict(c)["name"]: as_dict(c) for c in resources.clusters}
    endpoint = made["inbound|6379"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert endpoint["endpoint"]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": 6379,
    }


def test_permissive_mode_also_takes_plaintext_told_apart_by_the_tls_inspector() -> None:
    resources = translate(store_view(permissive=True), CAPTURE, MATERIAL)
    inbound = next(as_dict(x) for x in resources.listeners if as_dict(x)["name"] == "inbound")
    assert [f["name"] for f in inbound["listener_filters"]][-1] == (
        "envoy.filters.listener.tls_inspector"
    )
    chains = {c["name"]: c for c in inbound["filter_chains"]}
    assert chains["inbound|14001"]["filter_chain_match"]["transport_protocol"] == "tls"
    plain = chains["inbound-plaintext|14001"]
    assert plain["filter_chain_match"]["transport_protocol"] == "raw_buffer"
    assert "transport_socket" not in plain


@pytest.mark.parametrize(
    "view",
    [captured_view(), captured_view(egress=True), store_view(), store_view(permissive=True)],
    ids=["outbound", "outbound-egress", "inbound", "inbound-permissive"],
)
def test_envoy_accepts_the_captured_translation(
    view: pb.View, real_material: SecretMaterial, sidecar: Callable[..., ProxySettings]
) -> None:
    resources = translate(view, sidecar(capture=True), real_material)
    result = envoy.validate(static_bootstrap(resources))
    assert result.returncode == 0, result.stdout + result.stderr


def test_capture_comes_from_node_metadata_and_is_part_of_the_snapshot_key() -> None:
    settings = from_metadata({"trellis": {"capture": True}})
    assert settings.capture
    assert settings.key() != ProxySettings().key()
    with pytest.raises(InvalidNodeMetadata, match="capture"):
        from_metadata({"trellis": {"capture": "yes"}})


def test_a_vm_sidecar_keeps_its_explicit_listeners() -> None:
    resources = translate(captured_view(), ProxySettings(), MATERIAL)
    listener = next(as_dict(x) for x in resources.listeners if as_dict(x)["name"] == "outbound")
    assert "listener_filters" not in listener
    assert capture.BLACKHOLE not in {as_dict(c)["name"] for c in resources.clusters}


def _managers(node: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(node, dict):
        if str(node.get("@type", "")).endswith("HttpConnectionManager"):
            found.append(node)
        for value in node.values():
            found += _managers(value)
    elif isinstance(node, list):
        for value in node:
            found += _managers(value)
    return found


@pytest.mark.parametrize("settings", [CAPTURE, ProxySettings()], ids=["pod", "vm"])
def test_every_connection_manager_normalizes_paths_before_routes_and_rbac_see_them(
    settings: ProxySettings,
) -> None:
    view = captured_view()
    view.inbound.extend(store_view().inbound)
    view.inbound[0].ingress.CopyFrom(
        pb.IngressRule(policy="shop/ingress", protocol="http", source_ranges=["10.0.0.0/8"])
    )
    listeners = [as_dict(x) for x in translate(view, settings, MATERIAL).listeners]
    managers = _managers(listeners)
    assert len(managers) >= 3  # outbound, inbound, the IngressBackend's
    for manager in managers:
        assert manager["normalize_path"] is True
        assert manager["merge_slashes"] is True
        assert manager["path_with_escaped_slashes_action"] == "REJECT_REQUEST"


def test_a_pod_agents_proxy_is_sent_no_key_its_certificate_names_the_agents_files() -> None:
    material = SecretMaterial(b"-----BEGIN CERTIFICATE-----\n", b"SERVICE-KEY-BYTES", b"ca")
    settings = from_metadata({"trellis": {"capture": True, "workload_dir": "/etc/trellis/proxy"}})
    assert settings.key().endswith("|files:/etc/trellis/proxy")  # its own snapshot group

    def service_cert(found: Any) -> Any:
        [cert] = [s for s in found.secrets if s.name == names.SERVICE_CERT]
        return cert

    cert = service_cert(translate(buyer_view(), settings, material))
    assert cert.tls_certificate.private_key.filename == "/etc/trellis/proxy/key.pem"
    assert cert.tls_certificate.certificate_chain.filename == "/etc/trellis/proxy/workload.pem"
    assert cert.tls_certificate.watched_directory.path == "/etc/trellis/proxy"
    assert b"SERVICE-KEY-BYTES" not in cert.SerializeToString()  # the service key stays home
    # a sidecar naming no folder of its own gets no service certificate, never the key
    bare = translate(buyer_view(), ProxySettings(capture=True), material).secrets
    assert [as_dict(s)["name"] for s in bare] == [names.MESH_CA]
    assert b"SERVICE-KEY-BYTES" not in b"".join(s.SerializeToString() for s in bare)


@pytest.mark.parametrize("folder", ["relative/dir", "/etc/../root", "/a b", 7, "/" + "x" * 300])
def test_a_workload_folder_must_be_a_plain_absolute_path(folder: Any) -> None:
    with pytest.raises(InvalidNodeMetadata, match="workload_dir"):
        from_metadata({"trellis": {"workload_dir": folder}})

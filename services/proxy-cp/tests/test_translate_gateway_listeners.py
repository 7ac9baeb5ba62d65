"""A Gateway's Envoy: its listeners (HTTP, HTTPS by server name), their routes, the
certificates it reads from files, its node metadata (Envoy's verdict and a real Envoy:
test_translate_gateway_envoy.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp.testing.control import SIDECAR
from trellis_proxy_cp.testing.gateway import HELLO, SHOP, WEB, gateway_view, rules, server
from trellis_proxy_cp.testing.static import as_dict, self_signed_material
from trellis_proxy_cp.translate import names
from trellis_proxy_cp.translate.proxy import translate
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.translate.settings import InvalidNodeMetadata, ProxySettings, from_metadata

HCM = "envoy.filters.network.http_connection_manager"
CERTS = "/etc/trellis/gateway-certs"
GATEWAY = ProxySettings(workload_dir=SIDECAR.workload_dir, gateway=True, gateway_certs_dir=CERTS)


def by_name(messages: list[Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in map(as_dict, messages)}


def manager(chain: dict[str, Any]) -> dict[str, Any]:
    [hcm] = chain["filters"]
    assert hcm["name"] == HCM
    body: dict[str, Any] = hcm["typed_config"]
    return body


def test_an_http_port_is_one_listener_with_every_servers_virtual_hosts() -> None:
    found = translate(gateway_view(), GATEWAY, self_signed_material())
    listener = by_name(found.listeners)["gateway_8080"]
    assert listener["address"]["socket_address"] == {"address": "0.0.0.0", "port_value": 8080}
    [chain] = listener["filter_chains"]
    hcm = manager(chain)
    assert hcm.get("codec_type", "AUTO") == "AUTO"  # HTTP/1.1, and h2c for gRPC clients
    assert "strip_any_host_port" not in hcm  # the backend gets the Host as sent
    assert hcm["use_remote_address"] is True
    assert hcm["rds"]["route_config_name"] == names.gateway_routes(8080) == "gateway_8080"
    assert [f["name"] for f in hcm["http_filters"]] == ["envoy.filters.http.router"]
    assert (hcm["normalize_path"], hcm["merge_slashes"]) == (True, True)
    config = by_name(found.routes)["gateway_8080"]
    assert config["ignore_port_in_host_matching"] is True  # foo.example.com:8080 matches
    assert config["validate_clusters"] is False
    hosts = {h["name"]: h for h in config["virtual_hosts"]}
    assert {name: h["domains"] for name, h in hosts.items()} == {
        "edge/gw/http|0": ["*"],
        "edge/gw/foo|0": ["foo.example.com"],
    }
    any_name = hosts["edge/gw/http|0"]["routes"]
    assert [r["name"] for r in any_name] == [
        "GRPCRoute shop/hello rule 0 match 0",
        "HTTPRoute shop/web rule 0 match 0",
        "no-route",
    ]
    assert any_name[0]["match"]["path_separated_prefix"] == "/helloworld.Greeter"
    assert any_name[0]["route"]["cluster"] == HELLO
    assert any_name[2]["direct_response"] == {"status": 404}
    foo = hosts["edge/gw/foo|0"]["routes"][0]
    assert (foo["match"]["path_separated_prefix"], foo["route"]["cluster"]) == ("/foo", WEB)
    assert foo["route"]["cluster_not_found_response_code"] == "INTERNAL_SERVER_ERROR"


def test_an_https_port_has_a_chain_per_server_name_with_its_own_certificate_and_hosts() -> None:
    found = translate(gateway_view(), GATEWAY, self_signed_material())
    listener = by_name(found.listeners)["gateway_8443"]
    assert [f["name"] for f in listener["listener_filters"]] == [
        "envoy.filters.listener.tls_inspector"
    ]
    chains = {c["name"]: c for c in listener["filter_chains"]}
    assert sorted(chains) == ["edge/gw/https-bar", "edge/gw/https-foo"]
    for index, (name, host, cert) in enumerate(
        [("https-foo", "foo.example.com", "foo-cert"), ("https-bar", "bar.example.com", "bar-cert")]
    ):
        chain = chains[f"edge/gw/{name}"]
        assert chain["filter_chain_match"] == {"server_names": [host], "transport_protocol": "tls"}
        tls = chain["transport_socket"]["typed_config"]
        assert tls["require_client_certificate"] is False
        context = tls["common_tls_context"]
        assert context["alpn_protocols"] == ["h2", "http/1.1"]
        [sds] = context["tls_certificate_sds_secret_configs"]
        assert sds["name"] == names.gateway_cert("edge", cert) == f"gateway-cert/edge/{cert}"
        assert "validation_context_sds_secret_config" not in context  # no client certificate
        route_name = manager(chain)["rds"]["route_config_name"]
        assert route_name == f"gateway_8443_{index}"
        hosts = by_name(found.routes)[route_name]["virtual_hosts"]
        assert [h["domains"] for h in hosts] == [[host]]  # that server's hosts only
    assert sorted(by_name(found.routes)) == ["gateway_8080", "gateway_8443_0", "gateway_8443_1"]


def test_a_server_without_hostname_is_the_chain_for_any_name() -> None:
    view = gateway_view()
    view.gateway_ports[1].servers[1].hostname = ""
    found = translate(view, GATEWAY, self_signed_material())
    chains = by_name(found.listeners)["gateway_8443"]["filter_chains"]
    assert [c["filter_chain_match"] for c in chains] == [
        {"server_names": ["foo.example.com"], "transport_protocol": "tls"},
        {"transport_protocol": "tls"},
    ]


def test_the_certificates_are_files_the_envoy_reads_and_no_key_is_sent() -> None:
    material = SecretMaterial(b"-----BEGIN CERTIFICATE-----\n", b"SERVICE-KEY-BYTES", b"ca")
    found = translate(gateway_view(), GATEWAY, material)
    secrets = by_name(found.secrets)
    assert sorted(secrets) == sorted(
        [
            names.SERVICE_CERT,
            names.MESH_CA,
            "gateway-cert/edge/foo-cert",
            "gateway-cert/edge/bar-cert",
        ]
    )
    foo = secrets["gateway-cert/edge/foo-cert"]["tls_certificate"]
    assert foo == {
        "certificate_chain": {"filename": f"{CERTS}/edge/foo-cert/tls.crt"},
        "private_key": {"filename": f"{CERTS}/edge/foo-cert/tls.key"},
        "watched_directory": {"path": f"{CERTS}/edge/foo-cert"},
    }
    own = secrets[names.SERVICE_CERT]["tls_certificate"]["private_key"]
    assert own == {"filename": f"{SIDECAR.workload_dir}/key.pem"}
    assert b"SERVICE-KEY-BYTES" not in b"".join(s.SerializeToString() for s in found.secrets)


def test_the_backends_are_mesh_mtls_clusters_and_nothing_is_inbound() -> None:
    view = gateway_view()
    view.inbound.append(pb.InboundPort(port=8080, protocol="http", allow_any=True))
    found = translate(view, GATEWAY, self_signed_material())
    clusters = by_name(found.clusters)
    assert sorted(clusters) == [HELLO, WEB]  # no inbound|8080
    tls = clusters[WEB]["transport_socket"]["typed_config"]["common_tls_context"]
    assert tls["tls_certificate_sds_secret_configs"][0]["name"] == names.SERVICE_CERT
    matchers = tls["combined_validation_context"]["default_validation_context"]
    assert matchers["match_typed_subject_alt_names"][0]["matcher"] == {"exact": f"{SHOP}/web"}
    assert "typed_extension_protocol_options" in clusters[HELLO]  # gRPC: HTTP/2 upstream
    assert {e["cluster_name"] for e in map(as_dict, found.endpoints)} == {HELLO, WEB}
    assert sorted(by_name(found.listeners)) == ["gateway_8080", "gateway_8443"]  # no sidecar


def test_a_deleted_gateway_has_no_listeners_but_keeps_clusters_and_secrets() -> None:
    view = gateway_view()
    del view.gateway_ports[:]
    found = translate(view, GATEWAY, self_signed_material())
    assert (found.listeners, found.routes) == ([], [])
    assert sorted(by_name(found.clusters)) == [HELLO, WEB]
    assert sorted(by_name(found.secrets)) == sorted([names.SERVICE_CERT, names.MESH_CA])


def test_without_a_certificates_folder_https_is_left_out_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = ProxySettings(workload_dir=SIDECAR.workload_dir, gateway=True)
    with caplog.at_level(logging.WARNING):
        found = translate(gateway_view(), settings, self_signed_material())
    assert sorted(by_name(found.listeners)) == ["gateway_8080"]
    assert sorted(by_name(found.routes)) == ["gateway_8080"]
    assert not any(name.startswith("gateway-cert/") for name in by_name(found.secrets))
    assert "gateway_https_not_served identity=edge/gw listener=gateway_8443" in caplog.text


def test_what_envoy_would_refuse_is_left_out_not_the_whole_listener(
    caplog: pytest.LogCaptureFixture,
) -> None:
    view = gateway_view()
    https = view.gateway_ports[1]
    https.servers.append(server("dup", "foo.example.com", rules(WEB), cert="dup-cert"))
    https.servers.append(server("bad", "evil.example.com", rules(WEB), cert="../../etc"))
    https.servers.append(server("pass", "tls.example.com", []))
    https.servers[-1].tls_mode = "Passthrough"
    view.gateway_ports.append(
        pb.GatewayPort(port=9443, protocol="TLS", servers=[server("t", "", [])])
    )
    view.gateway_ports.append(pb.GatewayPort(port=8080, protocol="HTTP"))  # a port twice
    view.gateway_ports.append(pb.GatewayPort(port=70000, protocol="HTTP"))
    http = view.gateway_ports[0]
    http.servers.append(server("again", "foo.example.com", rules(HELLO)))  # a domain taken
    with caplog.at_level(logging.INFO):
        found = translate(view, GATEWAY, self_signed_material())
    listeners = by_name(found.listeners)
    assert sorted(listeners) == ["gateway_8080", "gateway_8443"]
    chains = [c["name"] for c in listeners["gateway_8443"]["filter_chains"]]
    assert chains == ["edge/gw/https-foo", "edge/gw/https-bar"]
    hosts = by_name(found.routes)["gateway_8080"]["virtual_hosts"]
    assert [h["name"] for h in hosts] == ["edge/gw/http|0", "edge/gw/foo|0"]
    assert not {"gateway-cert/edge/dup-cert", "gateway-cert/edge/../../etc"} & set(
        by_name(found.secrets)
    )
    for event in (
        "gateway_server_name_taken",
        "gateway_certificate_ref_invalid",
        "gateway_server_not_served",
        "gateway_listener_empty",  # a TLS port whose listener has no TLSRoute
        "gateway_domain_taken",
        "gateway_port_invalid identity=edge/gw port=8080",
        "gateway_port_invalid identity=edge/gw port=70000",
    ):
        assert event in caplog.text


def test_gateway_settings_come_from_node_metadata() -> None:
    settings = from_metadata(
        {"trellis": {"gateway": True, "gateway_certs_dir": CERTS, "workload_dir": "/w"}}
    )
    assert (settings.gateway, settings.gateway_certs_dir) == (True, CERTS)
    assert settings.key().endswith(f"|gateway|gateway-certs:{CERTS}")
    assert from_metadata({"trellis": {}}).gateway is False
    assert "gateway" not in from_metadata({"trellis": {}}).key()


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"gateway": "yes"}, "gateway: 'yes' is not true or false"),
        ({"gateway": True, "gateway_certs_dir": "certs"}, "gateway_certs_dir: 'certs' is not"),
        ({"gateway": True, "gateway_certs_dir": "/a/../b"}, "gateway_certs_dir"),
        ({"gateway": True, "gateway_certs_dir": 7}, "gateway_certs_dir"),
        ({"gateway_certs_dir": CERTS}, "gateway_certs_dir: only a gateway Envoy"),
        ({"gateway": True, "proxyless": True}, "gateway: a gateway Envoy cannot also be proxyless"),
        ({"gateway": True, "capture": True}, "gateway: a gateway Envoy cannot also be capture"),
    ],
)
def test_bad_gateway_metadata_is_refused_naming_the_key(
    section: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidNodeMetadata, match=message):
        from_metadata({"trellis": section})

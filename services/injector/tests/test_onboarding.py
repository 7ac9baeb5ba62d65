"""The pure onboarding logic: request checks that name the field, and the bootstrap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trellis_identity.identity import csr_for, new_key
from trellis_injector.domain.onboarding import (
    ControlPlane,
    InvalidOnboarding,
    ProxyCertificate,
    ProxyRequest,
    XdsEndpoint,
    build_bootstrap,
    check_csr,
    onboarding,
    proxy_cp_spiffe_id,
)

CN = "0b0e4a6e-1a2b-4c3d-8e9f-00000000abcd.cart.shop"
SPIFFE = "spiffe://cluster.local/ns/trellis-system/sa/proxy-cp"
CONTROL_PLANE = ControlPlane(XdsEndpoint("10.1.2.3", 15999), SPIFFE)


def proxy_request(**overrides: Any) -> ProxyRequest:
    fields: dict[str, Any] = {
        "namespace": "shop",
        "service": "cart",
        "service_account": "cart-sa",
        "app_port": 8080,
        "inbound_port": 15003,
        "outbound_port": 15001,
        "admin_port": 15000,
        "output_dir": "/etc/trellis/cart",
    }
    fields.update(overrides)
    return ProxyRequest(**fields)


def test_a_valid_request() -> None:
    request = proxy_request()
    assert request.identity == "shop/cart"
    assert request.protocol == "sotw"
    assert request.files.cert_chain == Path("/etc/trellis/cart/cert.pem")
    assert request.files.key == Path("/etc/trellis/cart/key.pem")
    assert request.files.trust_bundle == Path("/etc/trellis/cart/ca.pem")


def test_the_service_account_defaults_to_the_service() -> None:
    assert proxy_request(service_account="").service_account == "cart"


def test_a_client_only_workload_has_no_app_port() -> None:
    assert proxy_request(app_port=0).app_port == 0


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"namespace": "Shop"}, "namespace", "lower case"),
        ({"namespace": ""}, "namespace", "empty"),
        ({"service": "cart_v1"}, "service", "lower case"),
        ({"service": "a" * 20, "namespace": "b" * 10}, "service", "26 characters"),
        ({"service_account": "Cart"}, "service_account", "lower case"),
        ({"app_port": -1}, "app_port", "0..65535"),
        ({"app_port": 65536}, "app_port", "0..65535"),
        ({"inbound_port": 0}, "inbound_port", "1..65535"),
        ({"outbound_port": 70000}, "outbound_port", "1..65535"),
        ({"admin_port": 0}, "admin_port", "1..65535"),
        ({"admin_port": True}, "admin_port", "integer"),
        ({"outbound_port": 15003}, "outbound_port", "inbound_port"),
        ({"admin_port": 15001}, "admin_port", "outbound_port"),
        ({"inbound_port": 8080}, "inbound_port", "app_port"),
        ({"protocol": "incremental"}, "protocol", "sotw, delta"),
        ({"output_dir": "cart-proxy"}, "output_dir", "absolute"),
        ({"output_dir": ""}, "output_dir", "path"),
    ],
)
def test_invalid_requests_name_the_field(overrides: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidOnboarding) as caught:
        proxy_request(**overrides)
    assert caught.value.field == field
    assert words in caught.value.reason
    assert str(caught.value).startswith(f"{field}: ")


def test_the_bootstrap() -> None:
    bootstrap = build_bootstrap(proxy_request(), CN, CONTROL_PLANE)

    node = bootstrap["node"]
    assert node["id"] == CN
    assert node["cluster"] == "shop/cart"
    assert node["metadata"]["trellis"] == {
        "outbound_port": 15001,
        "inbound_port": 15003,
        "app_port": 8080,
        "admin_port": 15000,
        # its own workload certificate is in its folder: proxy-cp names it, sends no key
        "workload_dir": "/etc/trellis/cart",
    }
    ads = bootstrap["dynamic_resources"]["ads_config"]
    assert ads["api_type"] == "GRPC"
    (grpc_service,) = ads["grpc_services"]
    assert grpc_service["envoy_grpc"]["cluster_name"] == "trellis-xds"
    # Envoy's own default waits up to 30 s before retrying a broken ADS stream
    back_off = grpc_service["envoy_grpc"]["retry_policy"]["retry_back_off"]
    assert back_off == {"base_interval": "0.25s", "max_interval": "3s"}

    (cluster,) = bootstrap["static_resources"]["clusters"]
    assert cluster["name"] == "trellis-xds"
    (endpoints,) = cluster["load_assignment"]["endpoints"]
    address = endpoints["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert address == {"address": "10.1.2.3", "port_value": 15999}

    tls = cluster["transport_socket"]["typed_config"]["common_tls_context"]
    # the certificate comes over file-based SDS, so a renewal needs no restart
    assert tls["tls_certificate_sds_secret_configs"] == [
        {
            "name": "trellis-proxy-certificate",
            "sds_config": {
                "path_config_source": {
                    "path": "/etc/trellis/cart/proxy-sds.yaml",
                    "watched_directory": {"path": "/etc/trellis/cart"},
                },
                "resource_api_version": "V3",
            },
        }
    ]
    validation = tls["validation_context"]
    assert validation["trusted_ca"] == {"filename": "/etc/trellis/cart/ca.pem"}
    assert validation["match_typed_subject_alt_names"] == [
        {"san_type": "URI", "matcher": {"exact": SPIFFE}}
    ]
    assert bootstrap["admin"]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": 15000,
    }


def test_the_delta_protocol() -> None:
    bootstrap = build_bootstrap(proxy_request(protocol="delta"), CN, CONTROL_PLANE)
    assert bootstrap["dynamic_resources"]["ads_config"]["api_type"] == "DELTA_GRPC"


def test_the_proxy_cp_identity() -> None:
    assert proxy_cp_spiffe_id("cluster.local", "trellis-system", "proxy-cp") == SPIFFE
    assert proxy_cp_spiffe_id("example.org", "mesh", "xds") == "spiffe://example.org/ns/mesh/sa/xds"
    with pytest.raises(ValueError, match="trust domain"):
        proxy_cp_spiffe_id("Example Org", "mesh", "xds")


@pytest.mark.parametrize(
    ("address", "host", "port", "shown"),
    [
        ("127.0.0.1:15128", "127.0.0.1", 15128, "127.0.0.1:15128"),
        ("proxy-cp.trellis-system:15128", "proxy-cp.trellis-system", 15128, None),
        ("[::1]:15128", "::1", 15128, "[::1]:15128"),
    ],
)
def test_xds_addresses(address: str, host: str, port: int, shown: str | None) -> None:
    endpoint = XdsEndpoint.parse(address)
    assert (endpoint.host, endpoint.port) == (host, port)
    assert str(endpoint) == (shown or address)


@pytest.mark.parametrize("address", ["127.0.0.1", ":15128", "host:port", "host:0", "h:70000"])
def test_bad_xds_addresses(address: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        XdsEndpoint.parse(address)


def test_an_onboarding_carries_no_key() -> None:
    certificate = ProxyCertificate(CN, "CERT", "CA")
    done = onboarding(proxy_request(), certificate, CONTROL_PLANE)
    assert done.common_name == CN
    assert done.bootstrap["node"]["id"] == CN
    assert "PRIVATE KEY" not in repr(done)


def test_a_csr_is_checked_naming_csr_pem() -> None:
    good = csr_for(new_key()[1], "cart proxy")
    assert check_csr(good.decode()) == good
    for bad, words in [
        ("", "is required"),
        ("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n", "not a PEM"),
        (good.decode().replace("A", "B", 3), ""),
        ("x" * 20_000, "longer than"),
    ]:
        with pytest.raises(InvalidOnboarding) as refused:
            check_csr(bad)
        assert refused.value.field == "csr_pem"
        assert words in refused.value.reason

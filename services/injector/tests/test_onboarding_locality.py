"""A proxy's locality at onboarding (``trellis vm bootstrap --locality``): checked, naming
the field, and written as Envoy's ``node.locality``, which proxy-cp reads for locality
failover."""

from __future__ import annotations

import pytest

from trellis_injector.domain.onboarding import (
    ControlPlane,
    InvalidOnboarding,
    ProxyRequest,
    XdsEndpoint,
    build_bootstrap,
)

CN = "0b0e4a6e-1a2b-4c3d-8e9f-00000000abcd.cart.shop"
CONTROL_PLANE = ControlPlane(
    XdsEndpoint("10.1.2.3", 15999), "spiffe://cluster.local/ns/trellis-system/sa/proxy-cp"
)


def request(locality: str) -> ProxyRequest:
    return ProxyRequest(
        namespace="shop",
        service="cart",
        inbound_port=15003,
        outbound_port=15001,
        admin_port=15000,
        output_dir="/etc/trellis/cart",
        locality=locality,
    )


@pytest.mark.parametrize(
    ("locality", "node"),
    [
        ("eu-west/a/1", {"region": "eu-west", "zone": "a", "sub_zone": "1"}),
        ("eu-west/a", {"region": "eu-west", "zone": "a"}),
        ("eu-west", {"region": "eu-west"}),
    ],
)
def test_the_bootstrap_carries_the_locality_as_envoys_node_locality(
    locality: str, node: dict[str, str]
) -> None:
    assert build_bootstrap(request(locality), CN, CONTROL_PLANE)["node"]["locality"] == node


def test_without_a_locality_the_node_has_none() -> None:
    assert "locality" not in build_bootstrap(request(""), CN, CONTROL_PLANE)["node"]


@pytest.mark.parametrize("locality", ["eu//1", "/a", "eu/a/1/x", "eu/"])
def test_a_malformed_locality_is_refused_naming_the_field(locality: str) -> None:
    with pytest.raises(InvalidOnboarding) as caught:
        request(locality)
    assert caught.value.field == "locality"
    assert repr(locality) in caught.value.reason
    assert "region[/zone[/subzone]]" in caught.value.reason

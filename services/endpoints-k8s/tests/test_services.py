"""A Service, its EndpointSlices and Pods, as endpoints-k8s reports them (pure translation)."""

from __future__ import annotations

from typing import Any

import pytest

from trellis_endpoints_k8s.domain.services import service_of_slice, view

SERVICE = {
    "metadata": {"name": "cart", "namespace": "shop"},
    "spec": {
        "clusterIP": "10.96.0.10",
        "ports": [
            {"name": "http", "port": 80, "targetPort": 8080},
            {"name": "grpc-api", "port": 9090},
            {"name": "db", "port": 5432, "appProtocol": "postgresql"},
        ],
    },
}
PODS: dict[tuple[str, str], dict[str, Any]] = {
    ("shop", "cart-1"): {
        "metadata": {"name": "cart-1", "namespace": "shop", "labels": {"app": "cart"}},
        "spec": {"serviceAccountName": "cart"},
    },
    ("shop", "cart-2"): {"metadata": {"name": "cart-2", "namespace": "shop"}, "spec": {}},
}


def slice_of(*endpoints: dict[str, Any], ports: list[dict[str, Any]] | None = None) -> Any:
    return {
        "metadata": {
            "name": "s",
            "namespace": "shop",
            "labels": {"kubernetes.io/service-name": "cart"},
        },
        "addressType": "IPv4",
        "ports": ports if ports is not None else [{"name": "http", "port": 8080}],
        "endpoints": list(endpoints),
    }


def endpoint(ip: str, pod: str = "cart-1", **conditions: bool) -> dict[str, Any]:
    return {
        "addresses": [ip],
        "conditions": conditions,
        "zone": "zone-a",
        "targetRef": {"kind": "Pod", "name": pod},
    }


def test_ports_follow_osm_protocol_rules_and_endpoints_carry_their_pod() -> None:
    found = view(SERVICE, [slice_of(endpoint("10.1.0.1", ready=True))], PODS)
    assert [(p.name, p.number, p.protocol, p.target_port) for p in found.ports] == [
        ("http", 80, "http", 8080),
        ("grpc-api", 9090, "grpc", 0),
        ("db", 5432, "tcp", 0),  # an appProtocol the proxy must not parse
    ]
    assert found.addresses == ("10.96.0.10",)
    [only] = found.endpoints
    assert (only.address, only.ports, only.locality) == ("10.1.0.1", (("http", 8080),), "zone-a")
    assert (only.service_account, only.workload, only.labels) == (
        "cart",
        "cart-1",
        (("app", "cart"),),
    )


@pytest.mark.parametrize(
    ("conditions", "served"),
    [
        ({}, True),  # unset ready means ready
        ({"ready": True}, True),
        ({"ready": False}, False),
        ({"ready": False, "serving": True, "terminating": True}, True),  # the only one: drain
        ({"ready": False, "serving": False, "terminating": True}, False),
    ],
)
def test_ready_serving_and_terminating(conditions: dict[str, bool], served: bool) -> None:
    raw = {**endpoint("10.1.0.1"), "conditions": conditions}
    found = view(SERVICE, [slice_of(raw)], PODS)
    assert [e.address for e in found.endpoints] == (["10.1.0.1"] if served else [])


def test_a_draining_endpoint_is_used_only_while_none_is_ready() -> None:
    both = slice_of(
        endpoint("10.1.0.1", ready=True),
        endpoint("10.1.0.2", "cart-2", ready=False, serving=True, terminating=True),
    )
    found = view(SERVICE, [both], PODS)
    assert [(e.address, e.draining) for e in found.endpoints] == [("10.1.0.1", False)]
    assert found.endpoints[0].service_account == "cart"


def test_a_pod_without_an_account_runs_as_default_and_bad_ports_are_warnings() -> None:
    service = {**SERVICE, "spec": {"ports": [{"name": "Bad Name", "port": 80}, {"port": 81}]}}
    slices = [slice_of(endpoint("10.1.0.2", "cart-2"), ports=[{"name": "", "port": 81}])]
    found = view(service, slices, PODS)
    assert [p.number for p in found.ports] == [81]
    assert "spec.ports[0]" in found.warnings[0]
    assert [(e.address, e.service_account) for e in found.endpoints] == [("10.1.0.2", "default")]


def test_a_slice_names_its_service_by_label() -> None:
    assert service_of_slice(slice_of()) == ("shop", "cart")
    assert service_of_slice({"metadata": {"name": "x", "namespace": "shop"}}) is None

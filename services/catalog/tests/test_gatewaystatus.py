"""The status the catalog writes to GatewayClasses, Gateways and routes (no server: the
patches as :func:`trellis_catalog.kubesource.status_body` makes them)."""

from __future__ import annotations

from typing import Any

from trellis_catalog.kubesource import status_body
from trellis_spec.statuses import (
    GATEWAY_CONTROLLER,
    MESH_CONTROLLER,
    Condition,
    ListenerStatus,
    ParentStatus,
    Status,
)

OLD = "2020-01-01T00:00:00Z"
GROUP = "gateway.networking.k8s.io"
ACCEPTED = Condition("Accepted", "True", "Accepted", "served by Trellis")
PROGRAMMED = Condition("Programmed", "True", "Programmed", "")


def status(kind: str, **fields: Any) -> Status:
    return Status(key=f"{kind} x", kind=kind, namespace="shop", name="x", state="valid", **fields)


def gateway_class(controller: str = GATEWAY_CONTROLLER, **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "trellis", "generation": 3},
        "spec": {"controllerName": controller},
        **extra,
    }


def gateway(**extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": "edge", "namespace": "shop", "generation": 7}, **extra}


def test_a_gateway_class_of_ours_gets_its_conditions_with_the_generation() -> None:
    body = status_body(
        "GatewayClass", status("GatewayClass", conditions=(ACCEPTED,)), gateway_class()
    )
    assert body is not None
    [accepted] = body["conditions"]
    assert {k: v for k, v in accepted.items() if k != "lastTransitionTime"} == {
        "type": "Accepted", "status": "True", "reason": "Accepted",
        "message": "served by Trellis", "observedGeneration": 3,
    }  # fmt: skip
    assert accepted["lastTransitionTime"].endswith("Z")
    assert set(body) == {"conditions"}  # a class has no listeners


def test_another_controllers_gateway_class_is_never_written() -> None:
    theirs = gateway_class("example.com/gateway", status={"conditions": [{"type": "Accepted"}]})
    assert status_body("GatewayClass", status("GatewayClass"), theirs) is None
    # even were the catalog to give it conditions: the object names another controller
    assert (
        status_body("GatewayClass", status("GatewayClass", conditions=(ACCEPTED,)), theirs) is None
    )


def test_a_gateway_without_conditions_is_not_ours_and_gets_nothing() -> None:
    assert status_body("Gateway", status("Gateway"), gateway()) is None


def test_a_gateway_gets_conditions_and_listeners() -> None:
    listener = ListenerStatus(
        name="http",
        supported_kinds=((GROUP, "HTTPRoute"), (GROUP, "GRPCRoute")),
        attached_routes=2,
        conditions=(Condition("Accepted", "True", "Accepted", ""),
                    Condition("Conflicted", "False", "NoConflicts", "")),
    )  # fmt: skip
    found = status("Gateway", conditions=(ACCEPTED, PROGRAMMED), listeners=(listener,))
    body = status_body("Gateway", found, gateway(status={"addresses": [{"value": "10.0.0.1"}]}))
    assert body is not None
    assert [c["type"] for c in body["conditions"]] == ["Accepted", "Programmed"]
    [written] = body["listeners"]
    assert written["name"] == "http"
    assert written["supportedKinds"] == [
        {"group": GROUP, "kind": "HTTPRoute"}, {"group": GROUP, "kind": "GRPCRoute"},
    ]  # fmt: skip
    assert written["attachedRoutes"] == 2
    assert [(c["type"], c["status"], c["observedGeneration"]) for c in written["conditions"]] == [
        ("Accepted", "True", 7), ("Conflicted", "False", 7),
    ]  # fmt: skip
    assert "addresses" not in body  # left as it is by the merge patch


def test_the_transition_time_moves_only_when_the_status_does() -> None:
    listener = ListenerStatus("http", ((GROUP, "HTTPRoute"),), 0, (ACCEPTED,))
    found = status("Gateway", conditions=(ACCEPTED, PROGRAMMED), listeners=(listener,))
    written = status_body("Gateway", found, gateway())
    assert written is not None
    aged = {
        "conditions": [{**c, "lastTransitionTime": OLD} for c in written["conditions"]],
        "listeners": [
            {**item, "conditions": [{**c, "lastTransitionTime": OLD} for c in item["conditions"]]}
            for item in written["listeners"]
        ],
    }
    # the same status again: nothing to write
    assert status_body("Gateway", found, gateway(status=aged)) is None
    # a new generation: written again, but no condition moved, so no time moves
    again = status_body("Gateway", found, {**gateway(status=aged), "metadata": {"generation": 8}})
    assert again is not None
    assert {c["lastTransitionTime"] for c in again["conditions"]} == {OLD}
    assert {c["observedGeneration"] for c in again["conditions"]} == {8}
    # Programmed goes False: its time moves, Accepted's (and the listener's) stays
    failed = Condition("Programmed", "False", "Invalid", "no address")
    moved = status_body(
        "Gateway", status("Gateway", conditions=(ACCEPTED, failed), listeners=(listener,)),
        gateway(status=aged),
    )  # fmt: skip
    assert moved is not None
    times = {c["type"]: c["lastTransitionTime"] for c in moved["conditions"]}
    assert times["Accepted"] == OLD
    assert times["Programmed"] != OLD
    assert moved["listeners"][0]["conditions"][0]["lastTransitionTime"] == OLD


def test_a_route_with_no_parent_and_no_entry_of_ours_is_left_as_it_is() -> None:
    # a route the catalog resolved no parent of, which has no entry of ours: unchanged
    route = {"metadata": {"generation": 1}, "status": {"parents": []}}
    assert status_body("HTTPRoute", status("HTTPRoute"), route) is None


def _service_parent(status_: str = "True") -> ParentStatus:
    return ParentStatus(
        group="", kind="Service", namespace="shop", name="hello", port=9000,
        conditions=(Condition("Accepted", status_, "Accepted", ""),),
    )  # fmt: skip


def _gateway_parent(section: str | None = "http") -> ParentStatus:
    return ParentStatus(
        group=GROUP, kind="Gateway", namespace="shop", name="edge", port=None,
        conditions=(Condition("Accepted", "True", "Accepted", ""),
                    Condition("ResolvedRefs", "True", "ResolvedRefs", "")),
        section_name=section,
    )  # fmt: skip


THEIRS = {
    "parentRef": {"group": GROUP, "kind": "Gateway", "namespace": "shop", "name": "other"},
    "controllerName": "example.com/gateway",
    "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}],
}


def test_a_route_gets_one_entry_per_parent_under_each_ones_controller() -> None:
    found = status("HTTPRoute", parents=(_service_parent(), _gateway_parent()))
    route = {"metadata": {"generation": 4}, "status": {"parents": [THEIRS]}}
    body = status_body("HTTPRoute", found, route)
    assert body is not None
    theirs, mesh, edge = body["parents"]
    assert theirs == THEIRS  # another controller's entry is kept as it was
    assert mesh["controllerName"] == MESH_CONTROLLER
    assert mesh["parentRef"] == {
        "group": "", "kind": "Service", "namespace": "shop", "name": "hello", "port": 9000,
    }  # fmt: skip
    assert edge["controllerName"] == GATEWAY_CONTROLLER
    assert edge["parentRef"] == {
        "group": GROUP, "kind": "Gateway", "namespace": "shop", "name": "edge",
        "sectionName": "http",
    }  # fmt: skip
    assert {c["observedGeneration"] for c in mesh["conditions"] + edge["conditions"]} == {4}
    # written back as it is: nothing to write; an entry of ours gone stale is replaced
    assert status_body("HTTPRoute", found, {**route, "status": body}) is None
    no_section = status("HTTPRoute", parents=(_service_parent(), _gateway_parent(None)))
    replaced = status_body("HTTPRoute", no_section, {**route, "status": body})
    assert replaced is not None
    assert len(replaced["parents"]) == 3
    assert "sectionName" not in replaced["parents"][2]["parentRef"]


def test_a_route_parents_transition_time_is_kept_per_controller_and_parent() -> None:
    found = status("HTTPRoute", parents=(_service_parent(), _gateway_parent()))
    body = status_body("HTTPRoute", found, {"metadata": {"generation": 1}})
    assert body is not None
    aged = [
        {**p, "conditions": [{**c, "lastTransitionTime": OLD} for c in p["conditions"]]}
        for p in body["parents"]
    ]
    refused = status("HTTPRoute", parents=(_service_parent("False"), _gateway_parent()))
    moved = status_body("HTTPRoute", refused, {"metadata": {"generation": 1},
                                               "status": {"parents": aged}})  # fmt: skip
    assert moved is not None
    mesh, edge = moved["parents"]
    assert mesh["conditions"][0]["lastTransitionTime"] != OLD  # it moved
    assert {c["lastTransitionTime"] for c in edge["conditions"]} == {OLD}  # these did not

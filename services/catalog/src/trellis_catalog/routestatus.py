"""Gateway API route status (``status.parents``) as the catalog writes it back, and the
conditions every Gateway API status the catalog writes is made of.

A route's status is a list of ``RouteParentStatus``, one per parent and controller. The
catalog writes its own entries, one per parent it resolved: under
:data:`~trellis_spec.mesh.MESH_CONTROLLER` for a Service parent (the mesh,
GAMMA) and under :data:`~trellis_spec.mesh.GATEWAY_CONTROLLER` for a Gateway
of Trellis' GatewayClass (``ParentStatus.controller``), each with the ``Accepted`` and
``ResolvedRefs`` conditions it resolved and a ``parentRef`` that names the listener
(``sectionName``) when the route's did. It keeps every entry another controller wrote
(another class' Gateway): the list is replaced as a whole by a merge patch, so what is not
ours is copied back.

Every condition (here, and a Gateway's or GatewayClass' in :mod:`.gatewaystatus`) carries
the object's ``observedGeneration``, and its ``lastTransitionTime`` moves only when its
status does (:func:`conditions`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from trellis_spec.statuses import (
    GATEWAY_CONTROLLER,
    MESH_CONTROLLER,
    Condition,
    ParentStatus,
    Status,
)

#: Our ``controllerName``\ s: a route's entries under either are the catalog's to write.
OURS = frozenset({MESH_CONTROLLER, GATEWAY_CONTROLLER})
ROUTE_KINDS = frozenset({"GRPCRoute", "HTTPRoute", "TLSRoute"})


def now() -> str:
    """The time a condition moves, as the API writes it (RFC 3339, seconds, ``Z``)."""
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def generation_of(obj: dict[str, Any]) -> int:
    found = (obj.get("metadata") or {}).get("generation")
    return found if isinstance(found, int) else 0


def conditions(
    wanted: Iterable[Condition], before: Any, generation: int, moved_at: str
) -> list[dict[str, Any]]:
    """``wanted`` as written: each with ``observedGeneration``, and the
    ``lastTransitionTime`` of the condition of its type in ``before`` (the object's
    current list, whatever its shape) while the status is the same, else ``moved_at``."""
    listed = before if isinstance(before, list) else []
    old = {c.get("type"): c for c in listed if isinstance(c, dict)}
    written = []
    for condition in wanted:
        previous = old.get(condition.type) or {}
        same = previous.get("status") == condition.status and "lastTransitionTime" in previous
        written.append(
            {
                "type": condition.type,
                "status": condition.status,
                "reason": condition.reason,
                "message": condition.message,
                "observedGeneration": generation,
                "lastTransitionTime": previous["lastTransitionTime"] if same else moved_at,
            }
        )
    return written


def timeless(value: Any) -> Any:
    """``value`` without any ``lastTransitionTime`` (what "unchanged" compares)."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if k != "lastTransitionTime"}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


def _ref(parent: ParentStatus) -> dict[str, Any]:
    ref: dict[str, Any] = {
        "group": parent.group,
        "kind": parent.kind,
        "namespace": parent.namespace,
        "name": parent.name,
    }
    if parent.section_name is not None:
        ref["sectionName"] = parent.section_name
    if parent.port is not None:
        ref["port"] = parent.port
    return ref


def _refused_parents(status: Status, obj: dict[str, Any]) -> tuple[ParentStatus, ...]:
    """A route the catalog could not read: each Service parent its object names gets
    ``Accepted=False`` (``UnsupportedValue``) with the reason (whether a Gateway parent
    is of Trellis' class, an unread route cannot say)."""
    namespace = (obj.get("metadata") or {}).get("namespace") or "default"
    found = []
    for ref in ((obj.get("spec") or {}).get("parentRefs")) or []:
        if not isinstance(ref, dict) or ref.get("kind") != "Service" or ref.get("group") != "":
            continue
        port = ref.get("port")
        reason = (f"{status.field}: " if status.field else "") + status.reason
        found.append(
            ParentStatus(
                group="",
                kind="Service",
                namespace=str(ref.get("namespace") or namespace),
                name=str(ref.get("name")),
                port=port if isinstance(port, int) else None,
                conditions=(Condition("Accepted", "False", "UnsupportedValue", reason),),
            )
        )
    return tuple(found)


def parents(status: Status, obj: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The ``status.parents`` the route ``obj`` should have; None if it has them already."""
    if not status.parents and status.state == "error":
        status = replace(status, parents=_refused_parents(status, obj))
    generation = generation_of(obj)
    current = [p for p in ((obj.get("status") or {}).get("parents") or []) if isinstance(p, dict)]
    ours = [p for p in current if p.get("controllerName") in OURS]
    others = [p for p in current if p.get("controllerName") not in OURS]
    moved_at = now()
    wanted = []
    for parent in status.parents:
        ref = _ref(parent)
        before = next(
            (
                p
                for p in ours
                if p.get("parentRef") == ref and p.get("controllerName") == parent.controller
            ),
            {},
        )
        written = conditions(parent.conditions, before.get("conditions"), generation, moved_at)
        wanted.append(
            {"parentRef": ref, "controllerName": parent.controller, "conditions": written}
        )
    if timeless(wanted) == timeless(ours):
        return None
    return others + wanted

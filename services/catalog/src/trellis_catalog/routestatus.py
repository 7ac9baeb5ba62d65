"""Gateway API route status (``status.parents``) as the catalog writes it back.

A route's status is a list of ``RouteParentStatus``, one per parent and controller. The
catalog writes its own entries (``controllerName`` :data:`CONTROLLER`), one per Service
parent, with the ``Accepted`` and ``ResolvedRefs`` conditions it resolved, and keeps every
entry another controller wrote (a Gateway's controller for the route's Gateway parents):
the list is replaced as a whole by a merge patch, so what is not ours is copied back. A
condition's ``lastTransitionTime`` moves only when its status does.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from trellis_catalog.domain.spec import Condition, ParentStatus, Status

#: Our ``controllerName`` (a domain-prefixed path, as Gateway API requires).
CONTROLLER = "trellis.dev/mesh-controller"
ROUTE_KINDS = frozenset({"GRPCRoute", "HTTPRoute"})


def _ref(parent: ParentStatus) -> dict[str, Any]:
    ref: dict[str, Any] = {
        "group": parent.group,
        "kind": parent.kind,
        "namespace": parent.namespace,
        "name": parent.name,
    }
    if parent.port is not None:
        ref["port"] = parent.port
    return ref


def _timeless(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            **entry,
            "conditions": [
                {k: v for k, v in c.items() if k != "lastTransitionTime"}
                for c in entry.get("conditions") or []
            ],
        }
        for entry in entries
    ]


def _refused_parents(status: Status, obj: dict[str, Any]) -> tuple[ParentStatus, ...]:
    """A route the catalog could not read: each Service parent its object names gets
    ``Accepted=False`` (``UnsupportedValue``) with the reason."""
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
    generation = (obj.get("metadata") or {}).get("generation") or 0
    current = [p for p in ((obj.get("status") or {}).get("parents") or []) if isinstance(p, dict)]
    ours = [p for p in current if p.get("controllerName") == CONTROLLER]
    others = [p for p in current if p.get("controllerName") != CONTROLLER]
    now = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    wanted = []
    for parent in status.parents:
        ref = _ref(parent)
        before = next((p for p in ours if p.get("parentRef") == ref), {})
        old = {c.get("type"): c for c in before.get("conditions") or [] if isinstance(c, dict)}
        conditions = []
        for condition in parent.conditions:
            previous = old.get(condition.type) or {}
            same = previous.get("status") == condition.status
            conditions.append(
                {
                    "type": condition.type,
                    "status": condition.status,
                    "reason": condition.reason,
                    "message": condition.message,
                    "observedGeneration": generation,
                    "lastTransitionTime": previous.get("lastTransitionTime", now) if same else now,
                }
            )
        wanted.append({"parentRef": ref, "controllerName": CONTROLLER, "conditions": conditions})
    if _timeless(wanted) == _timeless(ours):
        return None
    return others + wanted

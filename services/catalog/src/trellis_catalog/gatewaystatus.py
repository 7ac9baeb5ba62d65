"""Gateway and GatewayClass status as the catalog writes it back.

Trellis serves the Gateways of the GatewayClasses whose ``spec.controllerName`` is
:data:`~trellis_spec.mesh.GATEWAY_CONTROLLER`, and the catalog gives a status
with conditions only to those classes and their Gateways (``Status.conditions``; a
Gateway's listeners in ``Status.listeners``). Everything else belongs to another
controller and is never written: a status without conditions writes nothing, and a
GatewayClass is written only when its own object names our controller too, whatever the
status says (another controller's class must keep what its controller wrote).

What is written, by merge patch of the ``status`` subresource:

* GatewayClass: ``status.conditions`` (``Accepted``, ``SupportedVersion``);
* Gateway: ``status.conditions`` (``Accepted``, ``Programmed``) and ``status.listeners``,
  one ``ListenerStatus`` per listener (``name``, ``supportedKinds``, ``attachedRoutes``,
  its ``conditions``); ``status.addresses`` is left as it is.

The lists are replaced whole (a merge patch cannot edit a list's item). Each condition has
``observedGeneration`` and a ``lastTransitionTime`` that moves only when its status does
(:func:`trellis_catalog.routestatus.conditions`; a listener's conditions are compared with
the same listener's, by name). ReferenceGrants have no status (:data:`STATUSLESS_KINDS`).
"""

from __future__ import annotations

from typing import Any

from trellis_catalog import routestatus
from trellis_spec.statuses import GATEWAY_CONTROLLER, ListenerStatus, Status

GATEWAY_KINDS = frozenset({"GatewayClass", "Gateway"})
#: Kinds the catalog reads but writes no status to (upstream's CRD has none).
STATUSLESS_KINDS = frozenset({"ReferenceGrant"})


def _listener(
    listener: ListenerStatus, before: dict[str, Any], generation: int, moved_at: str
) -> dict[str, Any]:
    return {
        "name": listener.name,
        "supportedKinds": [{"group": g, "kind": k} for g, k in listener.supported_kinds],
        "attachedRoutes": listener.attached_routes,
        "conditions": routestatus.conditions(
            listener.conditions, before.get("conditions"), generation, moved_at
        ),
    }


def _names_our_controller(gateway_class: dict[str, Any]) -> bool:
    spec = gateway_class.get("spec")
    return isinstance(spec, dict) and spec.get("controllerName") == GATEWAY_CONTROLLER


def status_of(status: Status, obj: dict[str, Any]) -> dict[str, Any] | None:
    """The ``status`` (the fields the catalog owns) that the GatewayClass or Gateway
    ``obj`` should have; None when there is nothing to write: not ours, or it has it."""
    if not status.conditions or status.kind not in GATEWAY_KINDS:
        return None
    if status.kind == "GatewayClass" and not _names_our_controller(obj):
        return None
    generation = routestatus.generation_of(obj)
    found = obj.get("status")
    current: dict[str, Any] = found if isinstance(found, dict) else {}
    moved_at = routestatus.now()
    body: dict[str, Any] = {
        "conditions": routestatus.conditions(
            status.conditions, current.get("conditions"), generation, moved_at
        )
    }
    if status.kind == "Gateway":
        listed = current.get("listeners")
        old = {
            item.get("name"): item
            for item in (listed if isinstance(listed, list) else [])
            if isinstance(item, dict)
        }
        body["listeners"] = [
            _listener(listener, old.get(listener.name) or {}, generation, moved_at)
            for listener in status.listeners
        ]
    if routestatus.timeless(body) == routestatus.timeless({k: current.get(k) for k in body}):
        return None
    return body

"""What the catalog says of each document: its state and reason, and for Gateway API
objects the conditions upstream defines (a route's per parent, a GatewayClass's and a
Gateway's own, a Gateway's listeners'). ``trellis spec list``, the catalog's
``/v1/resources`` and, in Kubernetes, the objects' ``status`` (:mod:`trellis_catalog.routestatus`,
:mod:`trellis_catalog.gatewaystatus`) show them.
"""

from __future__ import annotations

from dataclasses import dataclass

from trellis_common.documents.base import Document, DocumentError, Ignored, UnreadKind


@dataclass(frozen=True, slots=True)
class Condition:
    """A Gateway API condition (``Accepted``, ``ResolvedRefs``) as upstream spells it."""

    type: str
    status: str  # "True" or "False"
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class ParentStatus:
    """A route's status for one of its parents: a Service (the mesh, GAMMA) or a Gateway
    of Trellis' GatewayClass (``section_name``: the parentRef's listener, if it names one)."""

    group: str
    kind: str
    namespace: str
    name: str
    port: int | None
    conditions: tuple[Condition, ...]
    section_name: str | None = None

    @property
    def controller(self) -> str:
        """The controllerName this entry is written under."""
        return GATEWAY_CONTROLLER if self.kind == "Gateway" else MESH_CONTROLLER


#: The controllerName of Trellis' mesh (routes on Services) and of its GatewayClass.
MESH_CONTROLLER = "trellis.dev/mesh-controller"
GATEWAY_CONTROLLER = "trellis.dev/gateway"


@dataclass(frozen=True, slots=True)
class ListenerStatus:
    """A Gateway listener's status: the route kinds it takes, how many routes attached,
    and its ``Accepted``, ``Programmed``, ``ResolvedRefs`` and ``Conflicted`` conditions."""

    name: str
    supported_kinds: tuple[tuple[str, str], ...]  # (group, kind)
    attached_routes: int
    conditions: tuple[Condition, ...]


@dataclass(frozen=True, slots=True)
class Status:
    key: str
    kind: str
    namespace: str
    name: str
    state: str  # valid, warning, error, ignored (a kind no service reads)
    reason: str = ""
    field: str = ""
    source: str = ""
    document: int = 0
    api_version: str = ""
    parents: tuple[ParentStatus, ...] = ()  # Gateway API routes: per parent
    # GatewayClass and Gateway (of Trellis' class): their own conditions (Accepted,
    # Programmed, SupportedVersion); a Gateway's listeners
    conditions: tuple[Condition, ...] = ()
    listeners: tuple[ListenerStatus, ...] = ()


def document_status(document: Document, state: str = "valid", reason: str = "") -> Status:
    """A document's status, where it came from and what state it is in."""
    key = document.key
    return Status(
        key=str(key),
        kind=key.kind,
        namespace=key.namespace,
        name=key.name,
        state=state,
        reason=reason,
        source=document.origin.source,
        document=document.origin.index + 1,
        api_version=document.api_version,
    )


def error_status(error: DocumentError) -> Status:
    """An error's status: ``error``, or ``ignored`` for a kind no service reads."""
    key = error.key
    return Status(
        key=str(key) if key else f"{error.origin.source}#{error.origin.index + 1}",
        kind=key.kind if key else "",
        namespace=key.namespace if key else "",
        name=key.name if key else "",
        state="ignored" if isinstance(error, UnreadKind | Ignored) else "error",
        reason=error.reason,
        field=error.field,
        source=error.origin.source,
        document=error.origin.index + 1,
    )

"""TLSRoutes on Trellis' Gateways: TLS passed through, by server name.

A TLSRoute attaches, like an HTTPRoute, to the listeners of a Gateway its parentRefs name
(:func:`~.gateways.attach`): a ``TLS`` listener in ``Passthrough`` mode that admits
TLSRoutes from its namespace, whose hostname intersects the route's ``hostnames`` (at least
one, as upstream requires). Connections whose TLS server name (SNI) is one of those names
go, still encrypted, to the route's backends by weight: the gateway reads nothing of them
but the ClientHello, and the backend's application terminates the client's TLS. Between
the gateway and the backend's sidecar the bytes travel inside mesh mTLS, as a TCP service's
(the backend port is TCP unless it declares otherwise).

Two TLSRoutes that claim one server name on one listener: the older route keeps it
(creation time, then namespace/name), as Gateway API resolves conflicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from trellis_catalog.domain.index.services import KnownService
from trellis_catalog.domain.model.views import Identity
from trellis_catalog.domain.routing.gateway import EPOCH, route_status
from trellis_catalog.domain.routing.gateway_listeners import GatewayListener
from trellis_catalog.domain.routing.gateway_rules import Backend, Refs, resolve_backend
from trellis_catalog.domain.routing.gateways import (
    Attach,
    Gateways,
    TlsRule,
    attach,
    gateway_parent,
)
from trellis_catalog.domain.routing.refgrants import GATEWAY_GROUP
from trellis_common.documents.base import Document, DocumentKey
from trellis_common.model import MeshService


def attach_tls_routes(
    resolved: Gateways,
    documents: Iterable[Document],
    services: Mapping[MeshService, KnownService],
    first_seen: Mapping[DocumentKey, datetime],
) -> None:
    """Attach every TLSRoute to Trellis' Gateways; its status goes to ``resolved``."""

    def created(document: Document) -> datetime:
        stamp: datetime | None = document.resource.metadata.creation_timestamp
        if stamp is not None:
            return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
        return first_seen.get(document.key, EPOCH)

    for document in sorted(documents, key=lambda d: (created(d), d.key.namespace, d.key.name)):
        key = document.key
        route = document.resource
        refs = Refs()
        (rule,) = route.spec.rules
        backends = tuple(
            Backend(
                resolve_backend(
                    ref,
                    ("TLSRoute", key.namespace),
                    services,
                    f"spec.rules[0].backendRefs[{index}]",
                    refs,
                    resolved.grants,
                ),
                ref.port or 0,
                ref.weight,
            )
            for index, ref in enumerate(rule.backend_refs)
            if ref.weight > 0
        )
        stamp = created(document)
        parents = []
        for parent_ref in route.spec.parent_refs:
            if parent_ref.group != GATEWAY_GROUP or parent_ref.kind != "Gateway":
                continue
            namespace = parent_ref.namespace or key.namespace
            served = resolved.served.get(Identity(namespace, parent_ref.name))
            if served is None:
                continue  # another controller's Gateway

            take = _taker(served.tls_rules, str(key), backends, stamp)
            accepted = attach(served, document, parent_ref, take)
            parents.append(gateway_parent(parent_ref, namespace, (accepted, refs.condition())))
        resolved.statuses[str(key)] = route_status(document, tuple(parents))


def _taker(
    rules: dict[str, list[TlsRule]], source: str, backends: tuple[Backend, ...], stamp: datetime
) -> Attach:
    """Records the route on each listener it attaches to. A name two routes claim on one
    listener stays with the older (:mod:`.gatewayports` drops it from the later one)."""

    def take(listener: GatewayListener, domains: tuple[str, ...]) -> str | None:
        rules.setdefault(listener.name, []).append(TlsRule(source, domains, backends, stamp))
        return None

    return take

"""ReferenceGrant: which references across namespaces are permitted.

Gateway API lets an object refer to one in another namespace only when a ReferenceGrant in
the *target's* namespace says so: ``from`` names the referring kinds and their namespaces,
``to`` the kinds (and optionally the name) that may be referred to. Trellis checks it for a
route's backendRefs and mirror backends (HTTPRoute or GRPCRoute to a Service) and for a
Gateway listener's certificateRefs (Gateway to a Secret); without a grant the reference is
``RefNotPermitted``. A grant is read as written: the core group is ``""``.
"""

from __future__ import annotations

from collections.abc import Iterable

from trellis_common.documents import gateway_api
from trellis_common.documents.base import Document

GATEWAY_GROUP = "gateway.networking.k8s.io"


def _core(group: str) -> str:
    return "" if group == "core" else group


class ReferenceGrants:
    """Every ReferenceGrant, indexed by the namespace it grants access into."""

    def __init__(self, documents: Iterable[Document] = ()) -> None:
        self._by_namespace: dict[str, list[gateway_api.ReferenceGrantSpec]] = {}
        for document in documents:
            resource = document.resource
            if isinstance(resource, gateway_api.ReferenceGrant):
                self._by_namespace.setdefault(document.key.namespace, []).append(resource.spec)

    def permits(
        self,
        source: tuple[str, str, str],
        target: tuple[str, str, str, str],
    ) -> bool:
        """May an object of ``source`` (group, kind, namespace) refer to ``target`` (group,
        kind, namespace, name)? Always within one namespace."""
        group, kind, namespace = source
        to_group, to_kind, to_namespace, to_name = target
        if namespace == to_namespace:
            return True
        for grant in self._by_namespace.get(to_namespace, ()):
            from_ok = any(
                _core(f.group) == _core(group) and f.kind == kind and f.namespace == namespace
                for f in grant.from_
            )
            to_ok = any(
                _core(t.group) == _core(to_group)
                and t.kind == to_kind
                and (t.name is None or t.name == to_name)
                for t in grant.to
            )
            if from_ok and to_ok:
                return True
        return False

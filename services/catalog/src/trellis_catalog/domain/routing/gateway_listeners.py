"""A Gateway's listeners as Trellis serves them: which can be served and why not, which
routes they admit, and their host names intersected with a route's.

- Protocols: ``HTTP``; ``HTTPS`` terminated at the gateway; ``TLS`` passed through
  (``Passthrough``: TLSRoutes pick a backend by the server name; ``Terminate`` on a TLS
  listener is ``Accepted=False``, ``UnsupportedValue``). Others (``TCP``, ``UDP``, a
  domain-prefixed one) are ``Accepted=False``, ``UnsupportedProtocol``.
- On one port every listener speaks one protocol: the first listener's (in the Gateway's
  order) wins, the others are ``Conflicted=True``, ``ProtocolConflict``.
- ``certificateRefs``: a Secret (core group), in the Gateway's namespace or one whose
  ReferenceGrant lets Gateways of this namespace refer to it. Otherwise
  ``ResolvedRefs=False`` (``InvalidCertificateRef``, ``RefNotPermitted``); an HTTPS listener
  with no valid certificate is not served.
- ``allowedRoutes.kinds``: HTTPRoute and GRPCRoute on HTTP and HTTPS, TLSRoute on TLS (the
  defaults); another kind is ``ResolvedRefs=False``, ``InvalidRouteKinds``, and left out
  of ``supportedKinds``.
- ``allowedRoutes.namespaces``: ``Same`` (the default), ``All``, or ``Selector`` over the
  namespaces' labels (the Namespace documents; ``kubernetes.io/metadata.name`` always).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trellis_catalog.domain.routing.refgrants import GATEWAY_GROUP, ReferenceGrants
from trellis_common.documents import gateway_api
from trellis_common.documents.base import Document
from trellis_spec.statuses import Condition, ListenerStatus

SERVED_PROTOCOLS = ("HTTP", "HTTPS", "TLS")
HTTP_KINDS = ("HTTPRoute", "GRPCRoute")
TLS_KINDS = ("TLSRoute",)


def host_matches(pattern: str, name: str) -> bool:
    """``name`` (a host name, or a ``*.`` wildcard) is covered by ``pattern``: equal, or
    under a ``*.`` wildcard (one or more labels)."""
    if pattern == name:
        return True
    if pattern.startswith("*."):
        suffix = pattern[1:]
        bare = name[2:] if name.startswith("*.") else name
        return bare.endswith(suffix) and len(bare) > len(suffix)
    return False


@dataclass(frozen=True, slots=True)
class GatewayListener:
    name: str
    port: int
    protocol: str
    hostname: str  # "": any
    tls_mode: str  # HTTPS: Terminate; TLS: Passthrough
    certificates: tuple[tuple[str, str], ...]  # (namespace, name) of the valid Secrets
    kinds: tuple[str, ...]  # the route kinds it admits
    namespaces: str  # All, Same, Selector
    admitted_namespaces: frozenset[str] | None  # Selector: the matching namespaces
    gateway_namespace: str
    conditions: tuple[Condition, ...]
    served: bool

    def admits(self, kind: str, namespace: str) -> str | None:
        """Why a route of ``kind`` in ``namespace`` may not attach; None if it may."""
        if not self.served:
            return "is not served (see the Gateway's listener conditions)"
        if kind not in self.kinds:
            return f"admits {', '.join(self.kinds) or 'no route kind'}, not {kind}"
        if self.namespaces == "Same" and namespace != self.gateway_namespace:
            return f"admits routes of namespace {self.gateway_namespace} only (from: Same)"
        if self.admitted_namespaces is not None and namespace not in self.admitted_namespaces:
            return f"namespace {namespace} does not match allowedRoutes.namespaces.selector"
        return None

    def intersect(self, hostnames: tuple[str, ...]) -> tuple[str, ...]:
        """The names a route with ``hostnames`` holds for on this listener ("*": any)."""
        own = self.hostname or "*"
        if not hostnames:
            return (own,)
        if not self.hostname:
            return tuple(dict.fromkeys(hostnames))
        found: list[str] = []
        for name in hostnames:
            if host_matches(self.hostname, name):
                found.append(name)  # the route's is as or more specific
            elif host_matches(name, self.hostname):
                found.append(self.hostname)  # the listener's is more specific
        return tuple(dict.fromkeys(found))

    def status(self, attached: int) -> ListenerStatus:
        return ListenerStatus(
            name=self.name,
            supported_kinds=tuple((GATEWAY_GROUP, k) for k in self.kinds),
            attached_routes=attached,
            conditions=self.conditions,
        )


def listeners_of(
    document: Document,
    grants: ReferenceGrants,
    namespace_labels: Mapping[str, Mapping[str, str]],
) -> list[GatewayListener]:
    """The Gateway's listeners, each with its conditions."""
    namespace = document.key.namespace
    protocols: dict[int, str] = {}
    found = []
    for listener in document.resource.spec.listeners:
        conditions: list[Condition] = []
        served = True
        winner = protocols.setdefault(listener.port, listener.protocol)
        conflicted = winner != listener.protocol
        kinds, kind_problem = _kinds(listener)
        certificates, refs_problem = _certificates(listener, namespace, grants)
        if listener.protocol not in SERVED_PROTOCOLS:
            served = False
            accepted = Condition(
                "Accepted",
                "False",
                "UnsupportedProtocol",
                f"protocol {listener.protocol}: Trellis' gateway serves HTTP, HTTPS and TLS",
            )
            kinds = ()
        elif listener.protocol == "TLS" and listener.tls and listener.tls.mode != "Passthrough":
            served = False
            accepted = Condition(
                "Accepted",
                "False",
                "UnsupportedValue",
                "tls.mode Terminate on a TLS listener: Trellis' gateway passes TLS through "
                "(Passthrough); terminate on an HTTPS listener",
            )
        else:
            accepted = Condition("Accepted", "True", "Accepted", "listener accepted")
        conditions.append(accepted)
        if conflicted:
            served = False
            conditions.append(
                Condition(
                    "Conflicted",
                    "True",
                    "ProtocolConflict",
                    f"port {listener.port} is taken by {winner} listeners of this Gateway",
                )
            )
        else:
            conditions.append(Condition("Conflicted", "False", "NoConflicts", "no conflict"))
        problem = kind_problem or refs_problem
        if problem is not None:
            conditions.append(Condition("ResolvedRefs", "False", *problem))
        else:
            conditions.append(
                Condition("ResolvedRefs", "True", "ResolvedRefs", "all references resolved")
            )
        if listener.protocol == "HTTPS" and not certificates:
            served = False
        conditions.append(
            Condition("Programmed", "True", "Programmed", "served by the gateway Envoy")
            if served
            else Condition("Programmed", "False", "Invalid", "not served: see the conditions")
        )
        routes = listener.allowed_routes.namespaces
        admitted = None
        if routes.from_ == "Selector" and routes.selector is not None:
            admitted = frozenset(
                name
                for name, labels in namespace_labels.items()
                if routes.selector.matches(dict(labels))
            )
        found.append(
            GatewayListener(
                name=listener.name,
                port=listener.port,
                protocol=listener.protocol,
                hostname=listener.hostname or "",
                tls_mode=listener.tls.mode if listener.tls else "",
                certificates=certificates,
                kinds=kinds,
                namespaces=routes.from_,
                admitted_namespaces=admitted,
                gateway_namespace=namespace,
                conditions=tuple(conditions),
                served=served,
            )
        )
    return found


def _kinds(listener: gateway_api.Listener) -> tuple[tuple[str, ...], tuple[str, str] | None]:
    possible = TLS_KINDS if listener.protocol == "TLS" else HTTP_KINDS
    asked = listener.allowed_routes.kinds
    if not asked:
        return possible, None
    kinds = tuple(k.kind for k in asked if k.group == GATEWAY_GROUP and k.kind in possible)
    invalid = [f"{k.group}/{k.kind}" for k in asked if k.kind not in kinds]
    if invalid:
        return kinds, (
            "InvalidRouteKinds",
            f"allowedRoutes.kinds: {', '.join(invalid)} not supported on a "
            f"{listener.protocol} listener ({', '.join(possible)})",
        )
    return kinds, None


def _certificates(
    listener: gateway_api.Listener, namespace: str, grants: ReferenceGrants
) -> tuple[tuple[tuple[str, str], ...], tuple[str, str] | None]:
    if listener.tls is None:
        return (), None
    found = []
    problems: list[tuple[str, str]] = []
    for index, ref in enumerate(listener.tls.certificate_refs):
        where = f"tls.certificateRefs[{index}]"
        target = ref.namespace or namespace
        if not ref.is_secret:
            problems.append(("InvalidCertificateRef", f"{where}: {ref.kind} is not a Secret"))
        elif not grants.permits(
            (GATEWAY_GROUP, "Gateway", namespace), ("", "Secret", target, ref.name)
        ):
            problems.append(
                (
                    "RefNotPermitted",
                    f"{where}: Secret {target}/{ref.name} is in another namespace and no "
                    f"ReferenceGrant in {target} lets Gateways of {namespace} refer to it",
                )
            )
        else:
            found.append((target, ref.name))
    if problems:
        return tuple(found), (problems[0][0], "; ".join(m for _, m in problems))
    return tuple(found), None

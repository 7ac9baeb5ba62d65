"""The upstream conformance manifests as Trellis reads them, and the status checks of the
upstream suite (``conformance/utils/kubernetes/helpers.go``) over what the catalog answers.

Loading (:func:`manifest_text`, :func:`raw`): ``base/manifests.yaml`` and the test's own
manifests, with ``{GATEWAY_CLASS_NAME}`` replaced by :data:`CLASS` (a GatewayClass of controllerName
``trellis.dev/gateway``, which the upstream suite creates itself, so it is added here), and
only the documents of kinds Trellis reads (:func:`trellis_common.documents.all_kinds`):
the Deployments, Secrets and ConfigMaps that run upstream's backends in a cluster are left
out. Every Service gets one endpoint, as a provider would report it (:func:`reports`).

Checks: upstream compares conditions by type, status and (when given) reason, as a subset
of what the object has; ``supportedKinds`` as a subset (or empty when expected empty);
``attachedRoutes`` exactly. The helpers here do the same, so each test states exactly what
its Go test asserts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trellis_catalog.domain.access.policy import PolicyBuilder
from trellis_catalog.domain.index import services
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.domain.routing.gateways import statuses
from trellis_common.documents import all_kinds
from trellis_common.documents.base import Document, DocumentError, Origin
from trellis_common.model import MeshService
from trellis_spec import mesh as meshspec
from trellis_spec.statuses import Condition, ParentStatus, Status

MANIFESTS = Path(__file__).resolve().parent / "manifests"
CLASS_NAME = "trellis-conformance"
CLASS = f"""
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: {CLASS_NAME}}}
spec: {{controllerName: trellis.dev/gateway}}
"""
INFRA = "gateway-conformance-infra"
GATEWAY_GROUP = "gateway.networking.k8s.io"
HTTP_ROUTE = (GATEWAY_GROUP, "HTTPRoute")
GRPC_ROUTE = (GATEWAY_GROUP, "GRPCRoute")


def manifest_text(*tests: str, base: bool = True) -> str:
    """The raw text of ``base/manifests.yaml`` (unless ``base`` is False) and of each
    ``tests/<name>.yaml``, the class name substituted."""
    paths = ([MANIFESTS / "base" / "manifests.yaml"] if base else []) + [
        MANIFESTS / "tests" / f"{name}.yaml" for name in tests
    ]
    texts = [CLASS] + [path.read_text() for path in paths]
    return "\n---\n".join(texts).replace("{GATEWAY_CLASS_NAME}", CLASS_NAME)


def raw(*tests: str, base: bool = True) -> list[dict[str, Any]]:
    """The documents of the manifests (see :func:`manifest_text`) as mappings, to edit
    before :func:`build_raw` (upstream's tests that patch an object)."""
    return [d for d in yaml.safe_load_all(manifest_text(*tests, base=base)) if d]


def documents(raws: Iterable[dict[str, Any]]) -> list[Document]:
    """The documents of kinds Trellis reads; any of those that is invalid fails the test
    (so a document is never dropped silently)."""
    registry = all_kinds()
    read = registry.kinds()
    found: list[Document] = []
    errors: list[str] = []
    for index, item in enumerate(raws):
        if item.get("kind") not in read:
            continue
        try:
            found.append(registry.parse(item, Origin("upstream.yaml", index)))
        except DocumentError as exc:
            errors.append(str(exc))
    if errors:
        raise AssertionError(f"upstream documents Trellis refused: {errors}")
    return found


def reports(spec: meshspec.MeshSpec) -> list[ProvidedService]:
    """One endpoint for each Service (10.1.0.1, 10.1.0.2...) on each port's target, as a
    provider (endpoints-k8s) would report a ready backend."""
    found = []
    for index, (service, declared) in enumerate(sorted(spec.services.items(), key=str)):
        ports = tuple(
            (p.name or "", p.port, "", p.target_port if isinstance(p.target_port, int) else p.port)
            for p in declared.spec.ports
        )
        address = f"10.1.{index // 250}.{index % 250 + 1}"
        endpoint = ProvidedEndpoint(address, (), service_account=service.name)
        found.append(
            ProvidedService(
                provider="k8s",
                namespace=service.namespace,
                name=service.name,
                ports=ports,
                endpoints=(endpoint,),
            )
        )
    return found


def build_raw(raws: Iterable[dict[str, Any]]) -> PolicyBuilder:
    """The catalog's policy builder over documents given as mappings."""
    spec = meshspec.build(documents(raws))
    known = services.index(spec.services, reports(spec), spec.route_ports())

    def account_of(service: MeshService) -> str:
        return service.name

    return PolicyBuilder(spec, known, account_of, "cluster.local")


def build(*tests: str, base: bool = True) -> PolicyBuilder:
    """The catalog's policy builder over the base and ``tests``' manifests."""
    return build_raw(raw(*tests, base=base))


def find(raws: Iterable[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The document of ``kind`` and ``name`` among ``raws`` (to edit it)."""
    return next(d for d in raws if d.get("kind") == kind and d["metadata"]["name"] == name)


# -- what upstream's helpers assert ----------------------------------------------------------


def gateway_status(builder: PolicyBuilder, name: str, namespace: str = INFRA) -> Status:
    assert builder.gateways is not None
    return statuses(builder.gateways, builder.spec.gateways)[f"Gateway {namespace}/{name}"]


def route_status(builder: PolicyBuilder, kind: str, name: str, namespace: str = INFRA) -> Status:
    return builder.routes.statuses[f"{kind} {namespace}/{name}"]


@dataclass(frozen=True)
class Want:
    """A condition upstream expects: type, status, and reason ("" matches any)."""

    type: str
    status: str
    reason: str = ""


def missing(expected: Iterable[Want], actual: Iterable[Condition]) -> list[str]:
    """upstream's ``conditionsMatch``: each expected condition is among ``actual``; the
    ones that are not, with what is there instead."""
    have = list(actual)
    return [
        f"{want} not in {[(c.type, c.status, c.reason) for c in have]}"
        for want in expected
        if not any(
            c.type == want.type and c.status == want.status and want.reason in ("", c.reason)
            for c in have
        )
    ]


@dataclass(frozen=True)
class WantListener:
    name: str
    supported_kinds: tuple[tuple[str, str], ...]
    conditions: tuple[Want, ...]
    attached_routes: int


def assert_listeners(status: Status, expected: Iterable[WantListener]) -> None:
    """upstream's ``GatewayStatusMustHaveListeners``: as many listeners as expected; each by
    name, its supportedKinds (empty if expected empty, else a superset), attachedRoutes
    exactly, and its conditions (a superset)."""
    wanted = list(expected)
    assert len(status.listeners) == len(wanted), status.listeners
    for want in wanted:
        actual = next((item for item in status.listeners if item.name == want.name), None)
        assert actual is not None, f"no status for listener {want.name}"
        if not want.supported_kinds:
            assert actual.supported_kinds == (), actual
        assert set(want.supported_kinds) <= set(actual.supported_kinds), actual
        assert actual.attached_routes == want.attached_routes, actual
        assert not missing(want.conditions, actual.conditions), actual


def assert_gateway_conditions(status: Status, *expected: Want) -> None:
    assert not missing(expected, status.conditions), status


def assert_listener_conditions(status: Status, *expected: Want, listener: str = "") -> None:
    """upstream's ``GatewayListenersMustHaveConditions``: every listener (or the one named)
    has the conditions."""
    chosen = [item for item in status.listeners if not listener or item.name == listener]
    assert chosen, status.listeners
    for item in chosen:
        assert not missing(expected, item.conditions), item


def gateway_parents(status: Status, gateway: str, namespace: str = INFRA) -> list[ParentStatus]:
    return [
        p
        for p in status.parents
        if p.kind == "Gateway" and p.name == gateway and p.namespace == namespace
    ]


def assert_route_condition(
    builder: PolicyBuilder, route: tuple[str, str, str], gateway: str, want: Want
) -> None:
    """upstream's ``HTTPRouteMustHaveCondition``: some parent status for ``gateway``
    (namespace/name) has the condition. ``route``: kind, namespace, name."""
    kind, namespace, name = route
    gw_namespace, gw_name = gateway.split("/")
    status = route_status(builder, kind, name, namespace)
    parents = gateway_parents(status, gw_name, gw_namespace)
    assert any(not missing([want], p.conditions) for p in parents), status.parents


def assert_no_accepted_parents(
    builder: PolicyBuilder, kind: str, namespace: str, name: str
) -> None:
    """upstream's ``HTTPRouteMustHaveNoAcceptedParents``: no parent status, or exactly one
    with Accepted=False."""
    parents = route_status(builder, kind, name, namespace).parents
    if parents:
        assert len(parents) == 1, parents
        assert not missing([Want("Accepted", "False")], parents[0].conditions), parents


def assert_accepted(
    builder: PolicyBuilder, gateway: str, routes: Iterable[tuple[str, str, str]]
) -> None:
    """upstream's ``GatewayAndRoutesMustBeAccepted``: each route (kind, namespace, name) has
    a parent status for ``gateway`` (namespace/name) with Accepted=True (Accepted), and
    every listener of the gateway has ResolvedRefs, Accepted and Programmed True. (Upstream
    builds one expected parent per listener it names, but ``parentsForRouteMatch`` compares
    group, kind, name, namespace and conditions, not the section: neither is it here.)"""
    for route in routes:
        assert_route_condition(builder, route, gateway, Want("Accepted", "True", "Accepted"))
    gw_namespace, gw_name = gateway.split("/")
    assert_listener_conditions(
        gateway_status(builder, gw_name, gw_namespace),
        Want("ResolvedRefs", "True"),
        Want("Accepted", "True"),
        Want("Programmed", "True"),
    )

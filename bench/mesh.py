"""A synthetic mesh for the catalog benchmark: documents, provider reports and proxies.

The catalog benchmark needs a mesh of a given size that looks like a real one to the code
under test, and the same mesh on every run. :func:`generate` builds it from ``services``
alone, with a :class:`random.Random` seeded by that number:

* ``services`` services ``s0000``, ``s0001``, ... spread round-robin over ``services / 20``
  namespaces ``ns00``, ``ns01``, ... (names stay short: a proxy's CN
  ``<uuid>.<service>.<namespace>`` must fit 64 characters);
* per service a ``v1`` Service (one port ``http`` 8080), its own ServiceAccount
  ``<service>-sa``, an HTTPRouteGroup ``<service>-routes`` with 2 matches, and
  :data:`ENDPOINTS_PER_SERVICE` endpoints reported by one provider (:data:`PROVIDER`);
* 2 policies per service on average: TrafficTargets ``<service>-tt<k>`` allowing 3 to 5
  random source accounts of the mesh to call the service's account, on the route group
  (all of it, or its ``read`` match only), and one TrafficSplit per namespace (5% of the
  services) from its first service to the next two, 90/10; a split root gets one
  TrafficTarget instead of two, so policies are exactly twice the services;
* per service one expected proxy, CN ``<uuid>.<service>.<namespace>``.

Documents are raw mappings, as read from YAML: the benchmark parses them through the real
:class:`~trellis_common.documents.base.KindRegistry`, and times that separately.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, replace
from typing import Any

from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService

SEED = 20_240_601
PROVIDER = "bench"
SERVICES_PER_NAMESPACE = 20
ENDPOINTS_PER_SERVICE = 10
POLICIES_PER_SERVICE = 2
PORT = 8080
SOURCES = (3, 5)  # accounts a TrafficTarget allows, inclusive range
SPLIT_WEIGHTS = (90, 10)

Raw = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Proxy:
    common_name: str
    service_account: str


@dataclass(frozen=True, slots=True)
class Mesh:
    services: int
    namespaces: int
    documents: tuple[Raw, ...]
    reports: tuple[ProvidedService, ...]
    proxies: tuple[Proxy, ...]
    traffic_targets: int
    traffic_splits: int

    @property
    def endpoints(self) -> int:
        return sum(len(r.endpoints) for r in self.reports)

    @property
    def policies(self) -> int:
        return self.traffic_targets + self.traffic_splits

    def describe(self) -> str:
        return (
            f"{self.services:,} services in {_count(self.namespaces, 'namespace')}, "
            f"{self.endpoints:,} endpoints, {self.policies:,} policies "
            f"({_count(self.traffic_targets, 'TrafficTarget')}, "
            f"{_count(self.traffic_splits, 'TrafficSplit')}), "
            f"{len(self.proxies):,} proxies, {len(self.documents):,} documents"
        )


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def generate(services: int) -> Mesh:
    rng = random.Random(SEED + services)
    namespaces = max(1, round(services / SERVICES_PER_NAMESPACE))
    names = [(f"ns{i % namespaces:02d}", f"s{i:04d}") for i in range(services)]
    accounts = [(ns, f"{name}-sa") for ns, name in names]
    by_namespace: dict[str, list[str]] = {}
    for ns, name in names:
        by_namespace.setdefault(ns, []).append(name)
    split_roots = {
        (ns, members[0]): members[1:3] for ns, members in by_namespace.items() if len(members) >= 3
    }
    documents: list[Raw] = []
    reports: list[ProvidedService] = []
    proxies: list[Proxy] = []
    targets = 0
    for index, (ns, name) in enumerate(names):
        account = f"{name}-sa"
        documents += [_service(ns, name), _account(ns, account), _route_group(ns, name)]
        backends = split_roots.get((ns, name))
        for k in range(POLICIES_PER_SERVICE - (1 if backends else 0)):
            count = rng.randint(*SOURCES)
            picks = rng.sample(accounts, count + 1)  # one more, in case it picks its own
            sources = [a for a in picks if a != (ns, account)][:count]
            documents.append(_traffic_target(ns, name, account, k, sources))
            targets += 1
        if backends:
            documents.append(_traffic_split(ns, name, backends))
        reports.append(_report(ns, name, account, index))
        proxy_id = uuid.UUID(int=rng.getrandbits(128), version=4)
        proxies.append(Proxy(f"{proxy_id}.{name}.{ns}", account))
    return Mesh(
        services,
        namespaces,
        tuple(documents),
        tuple(reports),
        tuple(proxies),
        targets,
        len(split_roots),
    )


def address(number: int) -> str:
    """The ``number``-th address of ``10.0.0.0/8`` (``number`` < 2**24)."""
    return f"10.{number >> 16 & 255}.{number >> 8 & 255}.{number & 255}"


def moved(report: ProvidedService, which: int, number: int) -> ProvidedService:
    """``report`` with endpoint ``which`` moved to ``address(number)``: one endpoint change."""
    endpoints = list(report.endpoints)
    endpoints[which] = replace(endpoints[which], address=address(number))
    return replace(report, endpoints=tuple(endpoints))


def edited_target(document: Raw, sources: list[tuple[str, str]]) -> Raw:
    """A copy of TrafficTarget ``document`` with ``sources`` as its source accounts."""
    spec = dict(document["spec"], sources=[_subject(ns, sa) for ns, sa in sources])
    return dict(document, spec=spec)


def _meta(ns: str, name: str) -> Raw:
    return {"name": name, "namespace": ns}


def _subject(ns: str, account: str) -> Raw:
    return {"kind": "ServiceAccount", "name": account, "namespace": ns}


def _service(ns: str, name: str) -> Raw:
    port = {"name": "http", "port": PORT, "targetPort": PORT}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(ns, name),
        "spec": {"ports": [port], "selector": {"app": name}},
    }


def _account(ns: str, account: str) -> Raw:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(ns, account)}


def _route_group(ns: str, name: str) -> Raw:
    matches = [
        {"name": "read", "pathRegex": f"/{name}/items(/.*)?", "methods": ["GET", "HEAD"]},
        {"name": "write", "pathRegex": f"/{name}/items/[0-9]+", "methods": ["POST", "PUT"]},
    ]
    return {
        "apiVersion": "specs.smi-spec.io/v1alpha4",
        "kind": "HTTPRouteGroup",
        "metadata": _meta(ns, f"{name}-routes"),
        "spec": {"matches": matches},
    }


def _traffic_target(
    ns: str, name: str, account: str, k: int, sources: list[tuple[str, str]]
) -> Raw:
    rule: Raw = {"kind": "HTTPRouteGroup", "name": f"{name}-routes"}
    if k % 2:
        rule["matches"] = ["read"]
    return {
        "apiVersion": "access.smi-spec.io/v1alpha3",
        "kind": "TrafficTarget",
        "metadata": _meta(ns, f"{name}-tt{k}"),
        "spec": {
            "destination": _subject(ns, account),
            "sources": [_subject(src_ns, src) for src_ns, src in sources],
            "rules": [rule],
        },
    }


def _traffic_split(ns: str, root: str, backends: list[str]) -> Raw:
    weighted = [{"service": b, "weight": w} for b, w in zip(backends, SPLIT_WEIGHTS, strict=True)]
    return {
        "apiVersion": "split.smi-spec.io/v1alpha4",
        "kind": "TrafficSplit",
        "metadata": _meta(ns, f"{root}-split"),
        "spec": {"service": root, "backends": weighted},
    }


def _report(ns: str, name: str, account: str, index: int) -> ProvidedService:
    endpoints = tuple(
        ProvidedEndpoint(
            address=address(index * ENDPOINTS_PER_SERVICE + j),
            ports=(("http", PORT),),
            labels=(("app", name),),
            service_account=account,
            workload=f"{name}-{j}",
            provider=PROVIDER,  # as the catalog's provider client stamps each endpoint
        )
        for j in range(ENDPOINTS_PER_SERVICE)
    )
    return ProvidedService(
        provider=PROVIDER,
        namespace=ns,
        name=name,
        ports=(("http", PORT, "http", PORT),),
        endpoints=endpoints,
    )

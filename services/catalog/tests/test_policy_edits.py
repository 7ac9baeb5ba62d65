"""Edits of access policy patch the spec: every answer equals a catalog built from scratch.

A seeded random walk over a small mesh edits TrafficTargets, HTTPRouteGroups and TCPRoutes
(new, changed, gone, naming routes or matches that do not exist), now and then together
with an endpoint move or a Service edit (which build the spec again). After each flush the
catalog's spec, statuses, policies, destinations and cluster references must equal those
of a new catalog given the same inputs (the slices too, and who references each), and every
identity whose policy moved must have a new policy version.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.access.explain import explain
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.domain.publish.resources import policy_name
from trellis_common.documents.base import Document
from trellis_common.model import MeshService, ServiceAccount

Docs = Callable[[str], list[Document]]
Report = Callable[..., ProvidedService]
Endpoint = Callable[..., ProvidedEndpoint]

SERVICES = [("shop", f"s{i}") for i in range(6)] + [("back", f"b{i}") for i in range(3)]
ACCOUNTS = [*SERVICES, ("shop", "extra")]
GROUPS = ["rg0", "rg1", "rg2", "ghost"]  # ghost is never declared
TCP_ROUTES = ["tcp0", "tcp1", "ghost"]
STEPS = 300

FIXED = """apiVersion: split.smi-spec.io/v1alpha4
kind: TrafficSplit
metadata: {name: split, namespace: shop}
spec:
  service: s0
  matches: [{kind: HTTPRouteGroup, name: rg0}]
  backends: [{service: s1, weight: 80}, {service: s2, weight: 20}]
---
apiVersion: policy.openservicemesh.io/v1alpha1
kind: Egress
metadata: {name: out, namespace: shop}
spec:
  sources: [{kind: ServiceAccount, name: s3, namespace: shop}]
  hosts: [example.org]
  ports: [{number: 80, protocol: http}]
  matches: [{apiGroup: specs.smi-spec.io/v1alpha4, kind: HTTPRouteGroup, name: rg1}]"""


def service(namespace: str, name: str, port: int = 80) -> str:
    return f"""apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  ports: [{{name: http, port: {port}}}, {{name: db, port: 5432, appProtocol: tcp}}]"""


def route_group(rng: random.Random, namespace: str, name: str) -> str:
    methods = ["GET", '"*"']
    matches = ", ".join(
        f"{{name: m{i}, pathRegex: /{rng.choice('abc')}{i}, methods: [{rng.choice(methods)}]}}"
        for i in range(rng.randint(1, 3))
    )
    return f"""apiVersion: specs.smi-spec.io/v1alpha4
kind: HTTPRouteGroup
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  matches: [{matches}]"""


def tcp_route(rng: random.Random, name: str) -> str:
    ports = rng.choice(["[]", "[5432]", "[80, 5432]"])
    return f"""apiVersion: specs.smi-spec.io/v1alpha4
kind: TCPRoute
metadata: {{name: {name}, namespace: shop}}
spec: {{matches: {{ports: {ports}}}}}"""


def traffic_target(rng: random.Random, name: str) -> str:
    namespace, destination = rng.choice([a for a in ACCOUNTS if a[0] == "shop"])
    sources = ", ".join(
        f"{{kind: ServiceAccount, name: {n}, namespace: {ns}}}"
        for ns, n in rng.sample(ACCOUNTS, rng.randint(1, 4))
    )
    rules = []
    for _ in range(rng.randint(1, 2)):
        if rng.random() < 0.7:
            matches = rng.choice(["", ", matches: [m0]", ", matches: [m1, nope]"])
            rules.append(f"{{kind: HTTPRouteGroup, name: {rng.choice(GROUPS)}{matches}}}")
        else:
            rules.append(f"{{kind: TCPRoute, name: {rng.choice(TCP_ROUTES)}}}")
    port = rng.choice(["", ", port: 80", ", port: 5432"])
    version = "v1alpha2" if port else "v1alpha3"  # v1alpha3 has no destination port
    return f"""apiVersion: access.smi-spec.io/{version}
kind: TrafficTarget
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  destination: {{kind: ServiceAccount, name: {destination}, namespace: {namespace}{port}}}
  sources: [{sources}]
  rules: [{", ".join(rules)}]"""


class Mesh:
    """The documents by name, parsed once per text (as a spec directory keeps them)."""

    def __init__(self, rng: random.Random, docs: Docs) -> None:
        self.rng = rng
        self.docs = docs
        self.parsed: dict[str, list[Document]] = {}
        self.texts: dict[str, str] = {"fixed": FIXED}
        self.texts |= {f"svc {ns}/{n}": service(ns, n) for ns, n in SERVICES}
        self.texts |= {f"rg {n}": route_group(rng, "shop", n) for n in GROUPS[:3]}
        self.texts["rg back"] = route_group(rng, "back", "rg0")
        self.texts |= {f"tcp {n}": tcp_route(rng, n) for n in TCP_ROUTES[:2]}
        self.texts |= {f"tt t{i}": traffic_target(rng, f"t{i}") for i in range(8)}

    def documents(self) -> list[Document]:
        found = []
        for text in self.texts.values():
            if text not in self.parsed:
                self.parsed[text] = self.docs(text)
            found += self.parsed[text]
        return found

    def edit(self) -> None:
        """One random edit of access policy: changed, new or gone."""
        rng = self.rng
        kind = rng.choice(["tt", "tt", "tt", "rg", "tcp"])
        if kind == "tt":
            name = f"t{rng.randrange(10)}"
            text = traffic_target(rng, name)
        elif kind == "rg":
            name = rng.choice(GROUPS[:3])
            text = route_group(rng, "shop", name)
        else:
            name = rng.choice(TCP_ROUTES[:2])
            text = tcp_route(rng, name)
        key = f"{kind} {name}"
        if key in self.texts and rng.random() < 0.2:
            del self.texts[key]
        else:
            self.texts[key] = text


def reports(report: Report, endpoint: Endpoint, moved: int) -> list[ProvidedService]:
    """Every service with one endpoint; s1's and b0's run as another account."""
    found = []
    for position, (namespace, name) in enumerate(SERVICES):
        account = "extra" if name in ("s1", "b0") else name
        address = f"10.0.{position}.{moved if position == moved % len(SERVICES) else 1}"
        ports = {"http": 8080, "db": 5432}
        found.append(
            report(
                f"{namespace}/{name}",
                endpoint(address, ports, service_account=account),
                ports=[("http", 80), ("db", 5432, "tcp")],
            )
        )
    return found


def catalog_of(documents: list[Document], provided: list[ProvidedService]) -> Catalog:
    catalog = Catalog()
    catalog.set_documents(documents, [])
    catalog.set_provider_services("vm", provided)
    for position, (namespace, name) in enumerate(SERVICES[:4]):
        catalog.expect_proxy(f"00000000-0000-4000-8000-00000000000{position}.{name}.{namespace}")
    catalog.flush()
    return catalog


def same(catalog: Catalog, scratch: Catalog) -> None:
    assert catalog.spec.grants == scratch.spec.grants
    assert catalog.spec.targets == scratch.spec.targets
    assert catalog.spec.route_groups == scratch.spec.route_groups
    assert catalog.spec.tcp_routes == scratch.spec.tcp_routes
    assert catalog.spec.statuses == scratch.spec.statuses
    assert dict(catalog.policies) == dict(scratch.policies)
    assert catalog.destinations.records == scratch.destinations.records
    assert catalog.resources.versions == scratch.resources.versions
    for identity in scratch.policies:
        slices = scratch.resources.slices_of(identity)
        assert sorted(catalog.resources.slices_of(identity)) == sorted(slices), identity
        for name in slices:
            assert catalog.resources.concerned(name) == scratch.resources.concerned(name), name


def test_policy_edits_patch_the_spec_to_what_a_build_from_scratch_makes(
    docs: Docs, report: Report, endpoint: Endpoint
) -> None:
    rng = random.Random(14)
    mesh = Mesh(rng, docs)
    moved = 1
    catalog = catalog_of(mesh.documents(), reports(report, endpoint, moved))
    for _ in range(STEPS):
        policies, versions = dict(catalog.policies), dict(catalog.resources.versions)
        mesh.edit()
        roll = rng.random()
        if roll < 0.15:  # an endpoint moves in the same flush
            moved += 1
            catalog.set_provider_services("vm", reports(report, endpoint, moved))
        elif roll < 0.2:  # a Service edit: the spec is built again
            namespace, name = rng.choice(SERVICES)
            mesh.texts[f"svc {namespace}/{name}"] = service(namespace, name, rng.choice([80, 81]))
        catalog.set_documents(mesh.documents(), [])
        catalog.flush()
        same(catalog, catalog_of(mesh.documents(), reports(report, endpoint, moved)))
        changed = {i for i, p in catalog.policies.items() if policies.get(i) != p}
        assert all(
            catalog.resources.versions[policy_name(i)] != versions.get(policy_name(i))
            for i in changed
        )
    assert catalog.spec_updates["patched"] > STEPS // 2, catalog.spec_updates
    assert catalog.spec_updates["built"] > 1, catalog.spec_updates


def test_the_same_documents_again_build_nothing(
    docs: Docs, report: Report, endpoint: Endpoint
) -> None:
    """A source that lists the same documents again (a rescan, a resync) costs no build."""
    mesh = Mesh(random.Random(1), docs)
    catalog = catalog_of(mesh.documents(), reports(report, endpoint, 1))
    versions = dict(catalog.resources.versions)
    catalog.set_documents(mesh.documents(), [])
    assert catalog.flush() is None
    mesh.parsed.clear()  # parsed again: equal documents, new objects
    catalog.set_documents(mesh.documents(), [])
    assert catalog.flush() is None
    assert catalog.spec_updates == {"built": 1}
    assert catalog.resources.versions == versions


def test_a_policy_question_uses_the_last_builder_and_sees_the_last_edit(
    docs: Docs, report: Report, endpoint: Endpoint
) -> None:
    """CheckPolicy's builder is the last recompute's (no index of every service per
    question), and it answers for the edit just flushed."""
    mesh = Mesh(random.Random(2), docs)
    rule = "{kind: HTTPRouteGroup, name: rg0}"
    target = f"""apiVersion: access.smi-spec.io/v1alpha3
kind: TrafficTarget
metadata: {{name: to-s5, namespace: shop}}
spec:
  destination: {{kind: ServiceAccount, name: s5, namespace: shop}}
  sources: [{{kind: ServiceAccount, name: b2, namespace: back}}]
  rules: [{rule}]"""
    catalog = catalog_of(mesh.documents(), reports(report, endpoint, 1))
    caller, callee = ServiceAccount("back", "b2"), MeshService("shop", "s5")
    builder = catalog.builder()
    assert catalog.builder() is builder
    assert not explain(builder, caller, callee).allowed  # no target lets b2 call s5 yet
    mesh.texts["tt to-s5"] = target
    catalog.set_documents(mesh.documents(), [])
    catalog.flush()
    assert catalog.spec_updates["patched"] == 1
    assert catalog.builder() is not builder  # the edit's, sharing what it learned
    assert explain(catalog.builder(), caller, callee).allowed
    del mesh.texts["tt to-s5"]
    catalog.set_documents(mesh.documents(), [])
    catalog.flush()
    assert not explain(catalog.builder(), caller, callee).allowed

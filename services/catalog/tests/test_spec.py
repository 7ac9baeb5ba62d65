"""The mesh specification: statuses of documents checked against each other, and grants."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from trellis_common.documents.base import Document, DocumentError
from trellis_common.model import MeshService, ServiceAccount
from trellis_spec import mesh as meshspec

Docs = Callable[[str], list[Document]]
DocsAndErrors = Callable[[str], tuple[list[Document], list[DocumentError]]]

SHOP = """
apiVersion: v1
kind: Service
metadata: {name: api, namespace: shop}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: api-v1, namespace: shop}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: api, namespace: shop}
---
apiVersion: specs.smi-spec.io/v1alpha4
kind: HTTPRouteGroup
metadata: {name: routes, namespace: shop}
spec:
  matches:
  - {name: read, pathRegex: /items, methods: [GET]}
  - {name: write, pathRegex: /items, methods: [POST]}
---
apiVersion: specs.smi-spec.io/v1alpha4
kind: TCPRoute
metadata: {name: db, namespace: shop}
spec: {matches: {ports: [5432]}}
---
apiVersion: specs.smi-spec.io/v1alpha3
kind: TCPRoute
metadata: {name: any-port, namespace: shop}
spec: {}
"""

EXTRAS = """
---
apiVersion: split.smi-spec.io/v1alpha2
kind: TrafficSplit
metadata: {name: api-split, namespace: shop}
spec:
  service: api
  backends: [{service: api-v1, weight: 100}]
---
apiVersion: access.smi-spec.io/v1alpha3
kind: TrafficTarget
metadata: {name: web-to-api, namespace: shop}
spec:
  destination: {kind: ServiceAccount, name: api}
  sources: [{kind: ServiceAccount, name: web}]
  rules: [{kind: HTTPRouteGroup, name: routes}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: payments, namespace: shop}
spec:
  hosts: [payments.example.com]
  ports: [{number: 443, name: https, protocol: HTTPS}]
  resolution: DNS
---
apiVersion: config.openservicemesh.io/v1alpha2
kind: MeshConfig
metadata: {name: osm-mesh-config, namespace: trellis-system}
spec: {traffic: {enablePermissiveTrafficPolicyMode: false}}
"""

API = ServiceAccount("shop", "api")
WEB = ServiceAccount("shop", "web")


def _target(rules: str, name: str = "web-to-api", destination: str = "api") -> str:
    return f"""
---
apiVersion: access.smi-spec.io/v1alpha3
kind: TrafficTarget
metadata: {{name: {name}, namespace: shop}}
spec:
  destination: {{kind: ServiceAccount, name: {destination}}}
  sources: [{{kind: ServiceAccount, name: web}}]
  rules: {rules}
"""


def test_valid_documents_are_valid_with_where_they_came_from(docs: Docs) -> None:
    documents = docs(SHOP + EXTRAS)
    spec = meshspec.build(documents)

    assert set(spec.statuses) == {str(d.key) for d in documents}
    assert {s.state for s in spec.statuses.values()} == {"valid"}
    assert all(s.reason == "" and s.source == "test.yaml" for s in spec.statuses.values())
    split = spec.statuses["TrafficSplit shop/api-split"]
    assert (split.kind, split.namespace, split.name) == ("TrafficSplit", "shop", "api-split")
    assert split.api_version == "split.smi-spec.io/v1alpha2"
    assert split.document == 7  # 1-based position in the YAML text
    assert spec.statuses["Service shop/api"].document == 1
    assert spec.splits[MeshService("shop", "api")].metadata.name == "api-split"
    assert len(spec.service_entries) == 1
    assert spec.settings is not None
    assert not spec.permissive
    assert set(spec.services) == {MeshService("shop", "api"), MeshService("shop", "api-v1")}
    assert spec.service_accounts == {API}


def test_a_second_traffic_split_for_the_same_root_is_an_error_naming_the_winner(
    docs: Docs,
) -> None:
    splits = """
---
apiVersion: split.smi-spec.io/v1alpha2
kind: TrafficSplit
metadata: {name: b-split, namespace: shop}
spec:
  service: api.shop
  backends: [{service: api-v1, weight: 1}]
---
apiVersion: split.smi-spec.io/v1alpha2
kind: TrafficSplit
metadata: {name: a-split, namespace: shop}
spec:
  service: api
  backends: [{service: api-v1, weight: 9}]
"""
    spec = meshspec.build(docs(SHOP + splits))

    loser = spec.statuses["TrafficSplit shop/b-split"]
    assert loser.state == "error"
    assert "conflicts with TrafficSplit shop/a-split" in loser.reason
    assert "ignored" in loser.reason
    assert spec.statuses["TrafficSplit shop/a-split"].state == "valid"
    assert spec.splits[MeshService("shop", "api")].metadata.name == "a-split"


def test_a_second_mesh_config_is_an_error_and_the_first_is_read(docs: Docs) -> None:
    configs = """
---
apiVersion: config.trellis.io/v1alpha1
kind: MeshConfig
metadata: {name: b-config, namespace: trellis-system}
spec: {trustDomain: b.example}
---
apiVersion: config.openservicemesh.io/v1alpha2
kind: MeshConfig
metadata: {name: a-config, namespace: trellis-system}
spec: {traffic: {enablePermissiveTrafficPolicyMode: true}}
"""
    spec = meshspec.build(docs(SHOP + configs))

    second = spec.statuses["MeshConfig trellis-system/b-config"]
    assert second.state == "error"
    assert "a second MeshConfig" in second.reason
    assert spec.statuses["MeshConfig trellis-system/a-config"].state == "valid"
    assert spec.permissive
    assert spec.settings is not None
    assert spec.settings.trust_domain is None


@pytest.mark.parametrize(
    ("rules", "state", "reasons", "allowed"),
    [
        pytest.param(
            "[{kind: HTTPRouteGroup, name: routes}]", "valid", [], ["read", "write"], id="group"
        ),
        pytest.param(
            "[{kind: HTTPRouteGroup, name: routes, matches: [write]}]",
            "valid",
            [],
            ["write"],
            id="named-match",
        ),
        pytest.param("[{kind: TCPRoute, name: db}]", "valid", [], [(5432,)], id="tcp-route-ports"),
        pytest.param(
            "[{kind: TCPRoute, name: any-port}]", "valid", [], ["tcp-all"], id="tcp-route-all"
        ),
        pytest.param(
            "[{kind: HTTPRouteGroup, name: missing}, {kind: TCPRoute, name: db}]",
            "warning",
            ["spec.rules[0]: HTTPRouteGroup shop/missing not found"],
            [(5432,)],
            id="missing-group-other-rule-remains",
        ),
        pytest.param(
            "[{kind: HTTPRouteGroup, name: routes, matches: [read, nope, nada]}]",
            "warning",
            ["spec.rules[0]: HTTPRouteGroup shop/routes has no match named 'nope', 'nada'"],
            ["read"],
            id="missing-match-other-match-remains",
        ),
        pytest.param(
            "[{kind: HTTPRouteGroup, name: routes, matches: [read]}, {kind: TCPRoute, name: gone}]",
            "warning",
            ["spec.rules[1]: TCPRoute shop/gone not found"],
            ["read"],
            id="missing-tcp-route-other-rule-remains",
        ),
        pytest.param(
            "[{kind: HTTPRouteGroup, name: missing}]",
            "error",
            ["HTTPRouteGroup shop/missing not found", "this TrafficTarget allows nothing"],
            [],
            id="missing-group-alone",
        ),
        pytest.param(
            "[{kind: HTTPRouteGroup, name: routes, matches: [nope]}]",
            "error",
            ["has no match named 'nope'", "this TrafficTarget allows nothing"],
            [],
            id="missing-match-alone",
        ),
        pytest.param(
            "[{kind: TCPRoute, name: gone}]",
            "error",
            ["TCPRoute shop/gone not found", "this TrafficTarget allows nothing"],
            [],
            id="missing-tcp-route-alone",
        ),
    ],
)
def test_traffic_target_references(
    docs: Docs,
    rules: str,
    state: str,
    reasons: list[str],
    allowed: list[str | tuple[int, ...]],
) -> None:
    spec = meshspec.build(docs(SHOP + _target(rules)))

    status = spec.statuses["TrafficTarget shop/web-to-api"]
    assert status.state == state
    for reason in reasons:
        assert reason in status.reason
    if not reasons:
        assert status.reason == ""
    grants = spec.grants_to(API)
    if not allowed:  # a broken TrafficTarget grants nothing at all: deny by default
        assert grants == []
        assert spec.allowed_accounts() == {}
        return
    [grant] = grants
    assert grant.policy == "shop/web-to-api"
    assert grant.sources == (WEB,)
    assert grant.port is None
    granted: list[str | tuple[int, ...]] = []
    for rule in grant.rules:
        granted += [m.name for m in rule.http]
        if rule.tcp_ports:
            granted.append(rule.tcp_ports)
        if rule.tcp_all:
            granted.append("tcp-all")
    assert granted == allowed  # the broken rule or match adds nothing
    assert spec.allowed_accounts() == {WEB: {API}}


def test_traffic_split_with_undeclared_backends_is_a_warning_naming_them(docs: Docs) -> None:
    split = """
---
apiVersion: split.smi-spec.io/v1alpha4
kind: TrafficSplit
metadata: {name: api-split, namespace: shop}
spec:
  service: api
  backends:
  - {service: api-v1, weight: 50}
  - {service: api-v2, weight: 30}
  - {service: api-v3, weight: 20}
"""
    spec = meshspec.build(docs(SHOP + split))

    status = spec.statuses["TrafficSplit shop/api-split"]
    assert status.state == "warning"
    assert "backend services not declared (yet): api-v2, api-v3" in status.reason
    assert "api-v1" not in status.reason
    assert status.source == "test.yaml"
    assert status.api_version.endswith("v1alpha4")
    assert MeshService("shop", "api") in spec.splits  # still applied: endpoints may come


def test_loader_errors_are_error_statuses_with_field_and_source(
    docs_and_errors: DocsAndErrors,
) -> None:
    text = """
apiVersion: split.smi-spec.io/v1alpha2
kind: TrafficSplit
metadata: {name: quantities, namespace: shop}
spec:
  service: api
  backends: [{service: api-v1, weight: 50m}]
---
apiVersion: v1
metadata: {name: no-kind}
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: shop}
spec: {ports: [{name: http, port: 80}]}
"""
    documents, errors = docs_and_errors(text)
    assert len(documents) == 1
    assert len(errors) == 2

    spec = meshspec.build(documents, errors)

    split = spec.statuses["TrafficSplit shop/quantities"]
    assert split.state == "error"
    assert split.field == "spec.backends[0].weight"
    assert "SMI v1alpha1 weights" in split.reason
    assert (split.kind, split.namespace, split.name) == ("TrafficSplit", "shop", "quantities")
    assert (split.source, split.document) == ("test.yaml", 1)
    keyless = spec.statuses["test.yaml#2"]  # no kind: no key, named by where it is
    assert (keyless.state, keyless.field, keyless.reason) == ("error", "kind", "is required")
    assert (keyless.kind, keyless.source, keyless.document) == ("", "test.yaml", 2)
    assert spec.statuses["Service shop/api"].state == "valid"  # the rest is unaffected
    assert spec.splits == {}


def test_allowed_accounts_maps_each_source_to_the_accounts_it_may_call(docs: Docs) -> None:
    targets = """
---
apiVersion: access.smi-spec.io/v1alpha3
kind: TrafficTarget
metadata: {name: to-api, namespace: shop}
spec:
  destination: {kind: ServiceAccount, name: api}
  sources:
  - {kind: ServiceAccount, name: web}
  - {kind: ServiceAccount, name: client, namespace: edge}
  rules: [{kind: HTTPRouteGroup, name: routes}]
---
apiVersion: access.smi-spec.io/v1alpha3
kind: TrafficTarget
metadata: {name: to-db, namespace: shop}
spec:
  destination: {kind: ServiceAccount, name: db}
  sources: [{kind: ServiceAccount, name: api}, {kind: ServiceAccount, name: web}]
  rules: [{kind: TCPRoute, name: db}]
---
apiVersion: access.smi-spec.io/v1alpha3
kind: TrafficTarget
metadata: {name: to-cache, namespace: shop}
spec:
  destination: {kind: ServiceAccount, name: cache}
  sources: [{kind: ServiceAccount, name: web}]
  rules: [{kind: HTTPRouteGroup, name: missing}]
"""
    spec = meshspec.build(docs(SHOP + targets))

    db = ServiceAccount("shop", "db")
    assert spec.allowed_accounts() == {
        WEB: {API, db},
        ServiceAccount("edge", "client"): {API},
        API: {db},
    }
    assert spec.statuses["TrafficTarget shop/to-cache"].state == "error"
    assert spec.grants_to(ServiceAccount("shop", "cache")) == []
    assert [g.policy for g in spec.grants_to(db)] == ["shop/to-db"]


def test_a_kind_no_service_reads_is_listed_as_ignored_with_the_reason(
    docs_and_errors: DocsAndErrors,
) -> None:
    documents, errors = docs_and_errors(
        SHOP
        + """
---
apiVersion: gateway.networking.k8s.io/v1
kind: UDPRoute
metadata: {name: grpc, namespace: shop}
spec: {}
---
apiVersion: split.smi-spec.io/v9
kind: TrafficSplit
metadata: {name: future, namespace: shop}
spec: {}
"""
    )
    statuses = meshspec.build(documents, errors).statuses
    ignored = statuses["UDPRoute shop/grpc"]
    assert (ignored.state, ignored.field) == ("ignored", "kind")
    assert "not read by any Trellis service" in ignored.reason
    # a kind Trellis reads, in a version it does not: an error the user must fix
    future = statuses["TrafficSplit shop/future"]
    assert (future.state, future.field) == ("error", "apiVersion")
    assert "v1alpha2" in future.reason


def test_osm_meshconfig_fields_trellis_does_not_apply_are_listed_never_refused(
    docs_and_errors: DocsAndErrors,
) -> None:
    documents, errors = docs_and_errors(
        """
apiVersion: config.openservicemesh.io/v1alpha2
kind: MeshConfig
metadata: {name: osm-mesh-config, namespace: osm-system}
spec:
  sidecar: {envoyImage: "envoyproxy/envoy:v1.22", logLevel: debug}
  traffic: {enablePermissiveTrafficPolicyMode: true, outboundPortExclusionList: [6379]}
"""
    )
    spec = meshspec.build(documents, errors)
    status = spec.statuses["MeshConfig osm-system/osm-mesh-config"]
    assert status.state == "valid"
    # logLevel and the exclusion lists are applied (by the injector), so not listed
    assert status.reason == "accepted; not applied by Trellis: spec.sidecar.envoyImage"
    assert spec.permissive


def test_a_service_entry_served_in_part_says_which_fields(docs: Docs) -> None:
    spec = meshspec.build(
        docs("""
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: shop}
spec:
  hosts: [db.internal]
  ports: [{number: 5432, name: tcp, protocol: TCP}]
  resolution: STATIC
  endpoints: [{address: 10.0.0.7}, {address: "unix:///var/run/db.sock"}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api, namespace: shop}
spec:
  hosts: [a.example.com, b.example.com]
  ports: [{number: 443, name: https, protocol: HTTPS}]
  resolution: DNS_ROUND_ROBIN
  subjectAltNames: [api.example.com]
""")
    )
    db = spec.statuses["ServiceEntry shop/db"]
    assert (db.state, db.field) == ("warning", "spec.endpoints[1].address")
    assert db.reason.startswith("spec.endpoints[1].address: 'unix:///var/run/db.sock' is served")
    assert "spec.endpoints[0]" not in db.reason
    api = spec.statuses["ServiceEntry shop/api"].reason.split("; ")
    assert [r.split(":")[0] for r in api] == ["spec.subjectAltNames", "spec.resolution"]
    assert len(spec.service_entries) == 2  # both still served

"""Tests for trellis_common.documents.smi: TrafficSplit, TrafficTarget, HTTPRouteGroup, TCPRoute.

The OSM bookstore demo's documents must parse in every apiVersion Trellis reads; invalid
documents are those examples with one field changed, and the error must name that field
(``spec.backends[0].weight``) and say why.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml

from trellis_common import model
from trellis_common.documents import smi
from trellis_common.documents.base import Document, DocumentError, KindRegistry, Origin

ORIGIN = Origin("file.yaml", 0)
DELETE = object()

BOOKSTORE_SPLIT = """
apiVersion: {version}
kind: TrafficSplit
metadata:
  name: bookstore-split
  namespace: bookstore
spec:
  service: bookstore.bookstore # <root-service>.<namespace>
  backends:
  - service: bookstore-v1
    weight: 80
  - service: bookstore-v2
    weight: 20
"""

BOOKSTORE_TARGET = """
apiVersion: {version}
kind: TrafficTarget
metadata:
  name: bookstore
  namespace: bookstore
spec:
  destination:
    kind: ServiceAccount
    name: bookstore
    namespace: bookstore
  rules:
  - kind: HTTPRouteGroup
    name: bookstore-service-routes
    matches:
    - buy-a-book
    - books-bought
  sources:
  - kind: ServiceAccount
    name: bookbuyer
    namespace: bookbuyer
"""

BOOKSTORE_ROUTES = """
apiVersion: {version}
kind: HTTPRouteGroup
metadata:
  name: bookstore-service-routes
  namespace: bookstore
spec:
  matches:
  - name: books-bought
    pathRegex: /books-bought
    methods:
    - GET
    headers:
      user-agent: ".*-http-client/*.*"
      client-app: "bookbuyer"
  - name: buy-a-book
    pathRegex: ".*a-book.*new"
    methods:
    - GET
  - name: update-books-bought
    pathRegex: /update-books-bought
    methods:
    - POST
"""

TCP_ROUTE = """
apiVersion: {version}
kind: TCPRoute
metadata:
  name: mysql
  namespace: bookwarehouse
spec:
  matches:
    ports:
    - 3306
"""


@pytest.fixture
def registry() -> KindRegistry:
    registry = KindRegistry()
    smi.register(registry)
    return registry


def load(template: str, version: str) -> dict[str, Any]:
    raw = yaml.safe_load(template.format(version=version))
    assert isinstance(raw, dict)
    return raw


def changed(raw: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    """A copy of ``raw`` with ``path`` (``spec.backends[0].weight``) set to ``value``."""
    raw = copy.deepcopy(raw)
    parts: list[str | int] = [
        int(index) if index else key for key, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path)
    ]
    parent: Any = raw
    for part in parts[:-1]:
        parent = parent[part]
    if value is DELETE:
        del parent[parts[-1]]
    else:
        parent[parts[-1]] = value
    return raw


def parse(registry: KindRegistry, raw: object) -> Document:
    return registry.parse(raw, ORIGIN)


def test_registers_every_supported_version(registry: KindRegistry) -> None:
    assert registry.kinds() == {"TrafficSplit", "TrafficTarget", "HTTPRouteGroup", "TCPRoute"}
    assert registry.versions("TrafficSplit") == [
        "split.smi-spec.io/v1alpha2",
        "split.smi-spec.io/v1alpha3",
        "split.smi-spec.io/v1alpha4",
    ]
    assert registry.versions("TrafficTarget") == list(smi.ACCESS_API_VERSIONS)
    assert registry.versions("HTTPRouteGroup") == list(smi.SPECS_API_VERSIONS)
    assert registry.versions("TCPRoute") == list(smi.SPECS_API_VERSIONS)


# --- the bookstore demo, in every version ----------------------------------------------------


@pytest.mark.parametrize("version", smi.SPLIT_API_VERSIONS)
def test_bookstore_traffic_split(registry: KindRegistry, version: str) -> None:
    document = parse(registry, load(BOOKSTORE_SPLIT, version))
    assert str(document.key) == "TrafficSplit bookstore/bookstore-split"
    split = document.resource
    assert isinstance(split, smi.TrafficSplit)
    assert split.root_service() == model.MeshService("bookstore", "bookstore")
    assert split.weighted_services() == (
        model.WeightedService(model.MeshService("bookstore", "bookstore-v1"), 80),
        model.WeightedService(model.MeshService("bookstore", "bookstore-v2"), 20),
    )
    assert split.spec.matches == ()


@pytest.mark.parametrize("version", smi.ACCESS_API_VERSIONS)
def test_bookstore_traffic_target(registry: KindRegistry, version: str) -> None:
    target = parse(registry, load(BOOKSTORE_TARGET, version)).resource
    assert isinstance(target, smi.TrafficTarget)
    assert target.destination_account() == model.ServiceAccount("bookstore", "bookstore")
    assert target.source_accounts() == (model.ServiceAccount("bookbuyer", "bookbuyer"),)
    (rule,) = target.spec.rules
    assert (rule.kind, rule.name, rule.matches) == (
        "HTTPRouteGroup",
        "bookstore-service-routes",
        ("buy-a-book", "books-bought"),
    )


@pytest.mark.parametrize("version", smi.SPECS_API_VERSIONS)
def test_bookstore_http_route_group(registry: KindRegistry, version: str) -> None:
    group = parse(registry, load(BOOKSTORE_ROUTES, version)).resource
    assert isinstance(group, smi.HTTPRouteGroup)
    bought = group.match_by_name("books-bought")
    assert bought is not None
    assert (bought.path_regex, bought.methods) == ("/books-bought", ("GET",))
    assert bought.headers == {"user-agent": ".*-http-client/*.*", "client-app": "bookbuyer"}
    assert group.match_by_name("nothing") is None


OSM_DEMO_HEADERS = """
  - name: books-bought
    pathRegex: /books-bought
    methods:
    - GET
    headers:
    - "user-agent": ".*-http-client/*.*"
    - "client-app": "bookbuyer"
"""


@pytest.mark.parametrize("version", smi.SPECS_API_VERSIONS)
def test_headers_as_a_list_of_single_header_maps_as_osms_demo_writes_them(
    registry: KindRegistry, version: str
) -> None:
    head, _, rest = BOOKSTORE_ROUTES.partition("  - name: books-bought")
    tail = rest[rest.index("  - name: buy-a-book") :]
    text = head + OSM_DEMO_HEADERS.lstrip("\n") + tail
    group = parse(registry, load(text, version)).resource
    assert isinstance(group, smi.HTTPRouteGroup)
    bought = group.match_by_name("books-bought")
    assert bought is not None
    assert bought.headers == {"user-agent": ".*-http-client/*.*", "client-app": "bookbuyer"}


def test_source_without_namespace_is_in_the_targets_namespace(registry: KindRegistry) -> None:
    raw = changed(
        load(BOOKSTORE_TARGET, "access.smi-spec.io/v1alpha3"),
        "spec.sources",
        [{"kind": "ServiceAccount", "name": "bookthief"}],
    )
    raw = changed(raw, "spec.destination.namespace", DELETE)
    target = parse(registry, raw).resource
    assert isinstance(target, smi.TrafficTarget)
    assert target.source_accounts() == (model.ServiceAccount("bookstore", "bookthief"),)
    assert target.destination_account() == model.ServiceAccount("bookstore", "bookstore")


# --- what each version has -------------------------------------------------------------------

AB_MATCHES = [{"kind": "HTTPRouteGroup", "name": "ab-test"}]


@pytest.mark.parametrize("version", smi.SPLIT_API_VERSIONS[1:])
def test_split_matches_from_v1alpha3(registry: KindRegistry, version: str) -> None:
    raw = changed(load(BOOKSTORE_SPLIT, version), "spec.matches", AB_MATCHES)
    split = parse(registry, raw).resource
    assert isinstance(split, smi.TrafficSplit)
    assert [(m.kind, m.name) for m in split.spec.matches] == [("HTTPRouteGroup", "ab-test")]


def test_split_v1alpha2_has_no_matches(registry: KindRegistry) -> None:
    raw = changed(load(BOOKSTORE_SPLIT, "split.smi-spec.io/v1alpha2"), "spec.matches", AB_MATCHES)
    with pytest.raises(DocumentError) as caught:
        parse(registry, raw)
    assert caught.value.field == "spec.matches"
    assert "is not part of split.smi-spec.io/v1alpha2" in caught.value.reason


def test_target_destination_port_only_in_v1alpha2(registry: KindRegistry) -> None:
    raw = changed(
        load(BOOKSTORE_TARGET, "access.smi-spec.io/v1alpha2"), "spec.destination.port", 14001
    )
    target = parse(registry, raw).resource
    assert isinstance(target, smi.TrafficTarget)
    assert target.spec.destination.port == 14001
    raw["apiVersion"] = "access.smi-spec.io/v1alpha3"
    with pytest.raises(DocumentError) as caught:
        parse(registry, raw)
    assert caught.value.field == "spec.destination.port"
    assert "is not part of access.smi-spec.io/v1alpha3" in caught.value.reason


def test_tcp_route_versions(registry: KindRegistry) -> None:
    route = parse(registry, load(TCP_ROUTE, "specs.smi-spec.io/v1alpha4")).resource
    assert isinstance(route, smi.TCPRoute)
    assert route.spec.matches.ports == (3306,)
    for spec in ({}, None, DELETE):
        raw = changed(load(TCP_ROUTE, "specs.smi-spec.io/v1alpha3"), "spec", spec)
        route = parse(registry, raw).resource
        assert isinstance(route, smi.TCPRoute)
        assert route.spec.matches.ports == ()
    with pytest.raises(DocumentError) as caught:
        parse(registry, load(TCP_ROUTE, "specs.smi-spec.io/v1alpha3"))
    assert caught.value.field == "spec.matches"
    assert "came with specs.smi-spec.io/v1alpha4" in caught.value.reason


# --- invalid documents -----------------------------------------------------------------------

SPLIT = BOOKSTORE_SPLIT, "split.smi-spec.io/v1alpha4"
TARGET = BOOKSTORE_TARGET, "access.smi-spec.io/v1alpha2"
ROUTES = BOOKSTORE_ROUTES, "specs.smi-spec.io/v1alpha4"
TCP = TCP_ROUTE, "specs.smi-spec.io/v1alpha4"
SA = {"kind": "ServiceAccount", "name": "bookbuyer"}


@pytest.mark.parametrize(
    ("base", "path", "value", "field", "reason"),
    [
        (SPLIT, "spec.backends[0].weight", -1, None, "greater than or equal to 0"),
        (SPLIT, "spec.backends[0].weight", 2**32, None, "less than or equal to 4294967295"),
        (SPLIT, "spec.backends[0].weight", "50m", None, "quantities such as '50m'"),
        (SPLIT, "spec.backends[0].weight", 1.5, None, "valid integer"),
        (SPLIT, "spec.backends[0].weight", True, None, "valid integer"),
        (SPLIT, "spec.backends[0].weight", DELETE, None, "Field required"),
        (SPLIT, "spec.backends", [], None, "at least one backend"),
        (SPLIT, "spec.backends", DELETE, None, "Field required"),
        (SPLIT, "spec.backends", [{"service": "a", "weight": 0}], None, "positive weight"),
        (SPLIT, "spec.backends[1].service", "bookstore-v1", None, "also the service of"),
        (SPLIT, "spec.backends[0].service", "Bookstore_v1", None, "lower case"),
        (SPLIT, "spec.service", "bookstore.bookbuyer", None, "namespace 'bookstore'"),
        (SPLIT, "spec.service", "bookstore.bookstore.cluster", None, "service FQDN"),
        (SPLIT, "spec.service", "bookstore.bookstore.svc.cluster.local", "", ""),
        (
            SPLIT,
            "spec.matches",
            [{"kind": "TCPRoute", "name": "x"}],
            "spec.matches[0].kind",
            "'HTTPRouteGroup'",
        ),
        (
            SPLIT,
            "spec.matches",
            [{**AB_MATCHES[0], "apiGroup": "x.io"}],
            "spec.matches[0].apiGroup",
            "'specs.smi-spec.io'",
        ),
        (SPLIT, "spec.backend", [], None, "Extra inputs"),
        (TARGET, "spec.destination.kind", "Pod", None, "should be 'ServiceAccount'"),
        (TARGET, "spec.destination.namespace", "bookbuyer", None, "namespace 'bookstore'"),
        (TARGET, "spec.destination.port", 0, None, "greater than or equal to 1"),
        (TARGET, "spec.sources[0].kind", "Group", None, "should be 'ServiceAccount'"),
        (TARGET, "spec.sources[0].port", 80, None, "destination only"),
        (TARGET, "spec.sources[0].name", "Book Buyer", None, "lower case"),
        (TARGET, "spec.sources", [], None, "at least one source"),
        (
            TARGET,
            "spec.sources",
            [SA, {**SA, "namespace": "Bad"}],
            "spec.sources[1].namespace",
            "lower case",
        ),
        (TARGET, "spec.rules", [], None, "at least one rule"),
        (
            TARGET,
            "spec.rules[0].kind",
            "UDPRoute",
            None,
            "'HTTPRouteGroup', 'TCPRoute' or 'GRPCRoute'",
        ),
        (TARGET, "spec.destination", DELETE, None, "Field required"),
        (ROUTES, "spec.matches[0].pathRegex", "/books(", None, "does not compile"),
        (ROUTES, "spec.matches[0].pathRegex", r"/(a)\1", None, "backreference"),
        (ROUTES, "spec.matches[0].pathRegex", "/books(?=-bought)", None, "lookahead"),
        (ROUTES, "spec.matches[0].pathRegex", "/books(?!-bought)", None, "negative lookahead"),
        (ROUTES, "spec.matches[0].pathRegex", "(?<=/)books", None, "lookbehind"),
        (ROUTES, "spec.matches[0].pathRegex", "(?<!x)/books", None, "negative lookbehind"),
        (ROUTES, "spec.matches[0].methods", ["get"], "spec.matches[0].methods[0]", "'GET'"),
        (ROUTES, "spec.matches[0].methods", ["GET", "FETCH"], "spec.matches[0].methods[1]", "'*'"),
        (ROUTES, "spec.matches[0].headers", ["a"], "spec.matches[0].headers[0]", "one header"),
        (
            ROUTES,
            "spec.matches[0].headers",
            [{"a": "b", "c": "d"}],
            "spec.matches[0].headers[0]",
            "one header",
        ),
        (
            ROUTES,
            "spec.matches[0].headers",
            [{"a": "b"}, {"a": "c"}],
            "spec.matches[0].headers[1]",
            "listed twice",
        ),
        (ROUTES, "spec.matches[0].headers", [{"x y": "a"}], "spec.matches[0].headers.x y", "token"),
        (ROUTES, "spec.matches[0].headers", {"x": "(?=a)"}, "spec.matches[0].headers.x", "RE2"),
        (ROUTES, "spec.matches[0].headers", {"x y": "a"}, "spec.matches[0].headers.x y", "token"),
        (ROUTES, "spec.matches[1].name", "books-bought", None, "also the name of matches[0]"),
        (ROUTES, "spec.matches[0].name", DELETE, None, "Field required"),
        (ROUTES, "spec.matches[0].name", "", None, "at least 1 character"),
        (ROUTES, "spec.matches", [], None, "at least one match"),
        (ROUTES, "spec.matches[0].path", "/", None, "Extra inputs"),
        (
            TCP,
            "spec.matches.ports",
            [70000],
            "spec.matches.ports[0]",
            "less than or equal to 65535",
        ),
        (TCP, "spec.matches.ports", ["3306"], "spec.matches.ports[0]", "valid integer"),
    ],
)
def test_invalid_documents(
    registry: KindRegistry,
    base: tuple[str, str],
    path: str,
    value: object,
    field: str | None,
    reason: str,
) -> None:
    raw = changed(load(*base), path, value)
    if field == "":  # valid after all: a control case
        assert parse(registry, raw).resource is not None
        return
    with pytest.raises(DocumentError) as caught:
        parse(registry, raw)
    assert caught.value.field == (field or path)
    assert reason in caught.value.reason


# --- RE2 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern",
    [
        r"/books\.json",
        r".*a-book.*new",
        r"\\1",  # an escaped backslash, then '1'
        r"\(?=",  # an optional literal '(', then '='
        r"[(?=]",  # inside a class
        r"[]\1(?!]x",  # a leading ']' is a literal; the class runs to the second ']'
        r"[^]a(?<=]",
        r"\123",  # an octal escape, not a backreference
        r"\0",
        r"a+?b*?",  # lazy quantifiers are fine
        r"(?:a|b)+(?P<name>c)",
        r"/api/(v1|v2)/.*",
        r"[[a]",  # Python warns of a possible nested set; the check must not fail on it
    ],
)
def test_regexes_re2_accepts(pattern: str) -> None:
    assert smi.regex_problem(pattern) is None


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("/books(", "does not compile"),
        (r"(a)\1", r"backreference '\1'"),
        (r"(a)(b)\2", r"backreference '\2'"),
        (r"(?P<x>a)(?P=x)", "named backreference"),
        ("(?=a)", "lookahead '(?='"),
        ("a(?!b)", "negative lookahead"),
        ("(?<=a)b", "lookbehind '(?<='"),
        ("(?<!a)b", "negative lookbehind"),
        ("(?>ab)c", "atomic group"),
        ("a++", "possessive"),
        ("a*+b", "possessive"),
        ("a?+b", "possessive"),
        ("(a)?(?(1)b|c)", "conditional"),
        ("a{99999999999}", "does not compile: the repetition number is too large"),
        ("(" * 3000 + ")" * 3000, "does not compile: its groups are nested too deeply"),
    ],
)
def test_regexes_re2_lacks(pattern: str, reason: str) -> None:
    problem = smi.regex_problem(pattern)
    assert problem is not None
    assert reason in problem

"""Upstream's HTTPRoute conformance tests (v1.6.1) whose requests turn on routing, each
against a real Envoy serving the gateway Trellis builds from the upstream manifests
(:mod:`tests.conformance.gatewayenvoy`): the request table of the Go test, transcribed
(see README.md), and checked as upstream's ``CompareRoundTrip`` checks it: the status;
for a 200, the backend (pod name prefix) and namespace that answered, and the path,
method and headers the backend received. One test per upstream test, named after it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.httpcases import WEB, Case, run

#: each test starts an Envoy and its backends: seconds (``make test-fast`` leaves it out)
pytestmark = pytest.mark.slow


def test_httproute_exact_path_matching(tmp_path: Path) -> None:
    run(
        tmp_path,
        "httproute-exact-path-matching",
        "same-namespace",
        [
            Case("/one", backend="infra-backend-v1"),
            Case("/two", backend="infra-backend-v2"),
            Case("/", status=404),
            Case("/one/example", status=404),
            Case("/two/", status=404),
            Case("/Two", status=404),
        ],
    )


def test_httproute_matching(tmp_path: Path) -> None:
    run(
        tmp_path,
        "httproute-matching",
        "same-namespace",
        [
            Case("/", backend="infra-backend-v1"),
            Case("/example", backend="infra-backend-v1"),
            Case("/", headers={"Version": "one"}, backend="infra-backend-v1"),
            Case("/v2", backend="infra-backend-v2"),
            Case("/v2/example", backend="infra-backend-v2"),
            Case("/", headers={"Version": "two"}, backend="infra-backend-v2"),
            Case("/v2/", backend="infra-backend-v2"),
            Case("/v2example", backend="infra-backend-v1"),
            Case("/foo/v2/example", backend="infra-backend-v1"),
        ],
    )


def test_httproute_header_matching(tmp_path: Path) -> None:
    run(
        tmp_path,
        "httproute-header-matching",
        "same-namespace",
        [
            Case("/", headers={"Version": "one"}, backend="infra-backend-v1"),
            Case("/", headers={"Version": "two"}, backend="infra-backend-v2"),
            Case("/", headers={"Version": "two", "Color": "orange"}, backend="infra-backend-v1"),
            Case("/", headers={"Version": "two", "Color": "blue"}, backend="infra-backend-v2"),
            Case("/", headers={"Color": "orange"}, status=404),
            Case("/", headers={"Some-Other-Header": "one"}, status=404),
            Case("/", headers={"Color": "blue"}, backend="infra-backend-v1"),
            Case("/", headers={"Color": "green"}, backend="infra-backend-v1"),
            Case("/", headers={"Color": "red"}, backend="infra-backend-v2"),
            Case("/", headers={"Color": "yellow"}, backend="infra-backend-v2"),
            Case("/", headers={"Color": "purple"}, status=404),
        ],
    )


def test_httproute_query_param_matching(tmp_path: Path) -> None:
    run(
        tmp_path,
        "httproute-query-param-matching",
        "same-namespace",
        [
            Case("/?animal=whale", backend="infra-backend-v1"),
            Case("/?animal=dolphin", backend="infra-backend-v2"),
            Case("/?animal=dolphin&color=blue", backend="infra-backend-v3"),
            Case("/?ANIMAL=Whale", backend="infra-backend-v3"),
            Case("/?animal=whale&otherparam=irrelevant", backend="infra-backend-v1"),
            Case("/?animal=dolphin&color=yellow", backend="infra-backend-v2"),
            Case("/?color=blue", status=404),
            Case("/?animal=dog", status=404),
            Case("/?animal=whaledolphin", status=404),
            Case("/", status=404),
            Case("/path1?animal=whale", backend="infra-backend-v1"),
            Case("/?animal=whale", headers={"version": "one"}, backend="infra-backend-v2"),
            Case("/path2?animal=whale", headers={"version": "two"}, backend="infra-backend-v3"),
            Case("/path3?animal=shark", backend="infra-backend-v1"),
            Case("/path4?animal=kraken", headers={"version": "three"}, backend="infra-backend-v1"),
            Case("/?animal=shark", status=404),
            Case("/path4?animal=kraken", status=404),
            Case("/path5?animal=hydra", backend="infra-backend-v1"),
            Case("/?animal=hydra", headers={"version": "four"}, backend="infra-backend-v3"),
        ],
    )


def test_httproute_method_matching(tmp_path: Path) -> None:
    run(
        tmp_path,
        "httproute-method-matching",
        "same-namespace",
        [
            Case("/", method="POST", backend="infra-backend-v1"),
            Case("/", backend="infra-backend-v2"),
            Case("/", method="HEAD", status=404),
            Case("/path1", backend="infra-backend-v1"),
            Case("/", method="PUT", headers={"version": "one"}, backend="infra-backend-v2"),
            Case("/path2", method="POST", headers={"version": "two"}, backend="infra-backend-v3"),
            Case("/path3", method="PATCH", backend="infra-backend-v1"),
            Case(
                "/path4", method="DELETE", headers={"version": "three"}, backend="infra-backend-v1"
            ),
            Case("/", method="PUT", status=404),
            Case("/path4", method="DELETE", status=404),
            Case("/path5", method="PATCH", backend="infra-backend-v1"),
            Case("/", method="PATCH", headers={"version": "four"}, backend="infra-backend-v2"),
        ],
    )


def test_httproute_matching_across_routes(tmp_path: Path) -> None:
    run(
        tmp_path,
        "httproute-matching-across-routes",
        "same-namespace",
        [
            Case("/", host="example.com", backend="infra-backend-v1"),
            Case("/example", host="example.com", backend="infra-backend-v1"),
            Case("/example", host="example.net", backend="infra-backend-v1"),
            Case(
                "/example",
                host="example.com",
                headers={"Version": "one"},
                backend="infra-backend-v1",
            ),
            Case("/v2", host="example.com", backend="infra-backend-v2"),
            Case("/v2", host="example.net", backend="infra-backend-v1"),
            Case("/v2/example", host="example.com", backend="infra-backend-v2"),
            Case("/", host="example.com", headers={"Version": "two"}, backend="infra-backend-v2"),
        ],
    )


def test_httproute_path_match_order(tmp_path: Path) -> None:
    run(
        tmp_path,
        "httproute-path-match-order",
        "same-namespace",
        [
            Case("/match/exact/one", backend="infra-backend-v3"),
            Case("/match/exact", backend="infra-backend-v2"),
            Case("/match", backend="infra-backend-v1"),
            Case("/match/prefix/one/any", backend="infra-backend-v2"),
            Case("/match/prefix/any", backend="infra-backend-v1"),
            Case("/match/any", backend="infra-backend-v3"),
        ],
    )


def test_httproute_listener_hostname_matching(tmp_path: Path) -> None:
    run(
        tmp_path,
        "httproute-listener-hostname-matching",
        "httproute-listener-hostname-matching",
        [
            Case("/", host="bar.com", backend="infra-backend-v1"),
            Case("/", host="foo.bar.com", backend="infra-backend-v2"),
            Case("/", host="baz.bar.com", backend="infra-backend-v3"),
            Case("/", host="boo.bar.com", backend="infra-backend-v3"),
            Case("/", host="multiple.prefixes.bar.com", backend="infra-backend-v3"),
            Case("/", host="multiple.prefixes.foo.com", backend="infra-backend-v3"),
            Case("/", host="foo.com", status=404),
            Case("/", host="no.matching.host", status=404),
        ],
    )


HOSTNAME_INTERSECTION = [
    Case("/s1", host="very.specific.com", backend="infra-backend-v1"),
    Case("/s1", host="very.specific.com:1234", backend="infra-backend-v1"),
    Case("/s1", host="non.matching.com", status=404),
    Case("/s1", host="foo.nonmatchingwildcard.io", status=404),
    Case("/s1", host="foo.wildcard.io", status=404),
    Case("/non-matching-prefix", host="very.specific.com", status=404),
    Case("/s2", host="foo.wildcard.io", backend="infra-backend-v2"),
    Case("/s2", host="bar.wildcard.io", backend="infra-backend-v2"),
    Case("/s2", host="foo.bar.wildcard.io", backend="infra-backend-v2"),
    Case("/s2", host="non.matching.com", status=404),
    Case("/s2", host="wildcard.io", status=404),
    Case("/s2", host="very.specific.com", status=404),
    Case("/non-matching-prefix", host="foo.wildcard.io", status=404),
    Case("/s3", host="very.specific.com", backend="infra-backend-v3"),
    Case("/s3", host="non.matching.com", status=404),
    Case("/s3", host="foo.specific.com", status=404),
    Case("/s3", host="foo.wildcard.io", status=404),
    Case("/non-matching-prefix", host="very.specific.com", status=404),
    Case("/s4", host="foo.anotherwildcard.io", backend="infra-backend-v1"),
    Case("/s4", host="bar.anotherwildcard.io", backend="infra-backend-v1"),
    Case("/s4", host="foo.bar.anotherwildcard.io", backend="infra-backend-v1"),
    Case("/s4", host="anotherwildcard.io", status=404),
    Case("/s4", host="foo.wildcard.io", status=404),
    Case("/s4", host="very.specific.com", status=404),
    Case("/non-matching-prefix", host="foo.anotherwildcard.io", status=404),
    Case("/s5", host="specific.but.wrong.com", status=404),
    Case("/s5", host="wildcard.io", status=404),
    Case("/", host="first.com", backend="infra-backend-v2"),
    Case("/", host="sub.first.com", backend="infra-backend-v2"),
    Case("/", host="second.com", backend="infra-backend-v2"),
    Case("/", host="sub.second.com", backend="infra-backend-v2"),
    Case("/", host="third.com", status=404),
    Case("/", host="sub.third.com", status=404),
]


def test_httproute_hostname_intersection(tmp_path: Path) -> None:
    """Two gateways: httproute-hostname-intersection (every case but the last six) and
    httproute-hostname-intersection-all (the last six)."""
    run(
        tmp_path / "one",
        "httproute-hostname-intersection",
        "httproute-hostname-intersection",
        HOSTNAME_INTERSECTION[:-6],
    )
    run(
        tmp_path / "all",
        "httproute-hostname-intersection",
        "httproute-hostname-intersection-all",
        HOSTNAME_INTERSECTION[-6:],
    )


LISTENER_PORT_MATCHING = [
    Case("/", host="foo.com", backend="infra-backend-v1"),
    Case("/", host="foo.com:8080", backend="infra-backend-v2", port=8080),
    Case("/", host="bar.com:8080", backend="infra-backend-v2", port=8080),
    Case("/", host="foo.com:8090", backend="infra-backend-v3", port=8090),
    Case("/", host="bar.com:8090", status=404, port=8090),
]


def test_httproute_listener_port_matching(tmp_path: Path) -> None:
    """A Host with a port goes to the gateway's listener of that port (upstream picks the
    address by it), and without one to port 80."""
    run(
        tmp_path,
        "httproute-listener-port-matching",
        "httproute-listener-port-matching",
        LISTENER_PORT_MATCHING,
        ports=(80, 8080, 8090),
    )


def test_httproute_simple_same_namespace(tmp_path: Path) -> None:
    run(
        tmp_path,
        "httproute-simple-same-namespace",
        "same-namespace",
        [Case("/", backend="infra-backend-v1")],
    )


def test_httproute_cross_namespace(tmp_path: Path) -> None:
    run(
        tmp_path,
        "httproute-cross-namespace",
        "backend-namespaces",
        [Case("/", backend="web-backend", namespace=WEB)],
    )


def test_httproute_multiple_gateways(tmp_path: Path) -> None:
    test = "httproute-multiple-gateways"
    run(
        tmp_path / "same",
        test,
        "same-namespace",
        [Case("/shared", backend="infra-backend-v1"), Case("/", backend="infra-backend-v2")],
    )
    run(
        tmp_path / "all",
        test,
        "all-namespaces",
        [Case("/shared", backend="infra-backend-v1"), Case("/", backend="infra-backend-v3")],
    )


LISTENER_ISOLATION = [
    Case("/empty-hostname", host="bar.com", backend="infra-backend-v1"),
    Case("/wildcard-example-com", host="bar.com", status=404),
    Case("/wildcard-foo-example-com", host="bar.com", status=404),
    Case("/abc-foo-example-com", host="bar.com", status=404),
    Case("/empty-hostname", host="bar.example.com", status=404),
    Case("/wildcard-example-com", host="bar.example.com", backend="infra-backend-v1"),
    Case("/wildcard-foo-example-com", host="bar.example.com", status=404),
    Case("/abc-foo-example-com", host="bar.example.com", status=404),
    Case("/empty-hostname", host="bar.foo.example.com", status=404),
    Case("/wildcard-example-com", host="bar.foo.example.com", status=404),
    Case("/wildcard-foo-example-com", host="bar.foo.example.com", backend="infra-backend-v1"),
    Case("/abc-foo-example-com", host="bar.foo.example.com", status=404),
    Case("/empty-hostname", host="abc.foo.example.com", status=404),
    Case("/wildcard-example-com", host="abc.foo.example.com", status=404),
    Case("/wildcard-foo-example-com", host="abc.foo.example.com", status=404),
    Case("/abc-foo-example-com", host="abc.foo.example.com", backend="infra-backend-v1"),
]


def test_gateway_http_listener_isolation(tmp_path: Path) -> None:
    """Extended (SupportGatewayHTTPListenerIsolation): the same table against both of its
    gateways, hostnames in listeners only, and in listeners and routes."""
    test = (
        "gateway-http-listener-isolation",
        "gateway-http-listener-isolation-with-hostname-intersection",
    )
    for gateway in (
        "http-listener-isolation",
        "http-listener-isolation-with-hostname-intersection",
    ):
        run(tmp_path / gateway, test, gateway, LISTENER_ISOLATION)

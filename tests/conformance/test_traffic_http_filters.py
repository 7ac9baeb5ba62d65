"""Upstream's HTTPRoute conformance tests (v1.6.1) about references, filters and HTTPS, each
against a real Envoy serving the gateway Trellis builds from the upstream manifests (see
:mod:`tests.conformance.httpcases`): the Go test's request table, transcribed. One test
per upstream test, named after it (the request halves of the invalid-reference tests
share one parametrized test; their status halves are in test_status_routes.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.conformance.gatewayenvoy import Gateway, serving, settle
from tests.conformance.httpcases import APP, WEB, Case, check, run
from tests.conformance.upstream import INFRA, find, raw
from trellis_catalog.domain.model.views import Identity
from trellis_testing.waiting import eventually

#: each test starts an Envoy and its backends: seconds (``make test-fast`` leaves it out)
pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("test", "path"),
    [
        ("httproute-invalid-cross-namespace-backend-ref", "/"),
        ("httproute-invalid-backendref-unknown-kind", "/v2"),
        ("httproute-invalid-nonexistent-backendref", "/"),
        ("httproute-invalid-reference-grant", "/"),
    ],
)
def test_httproute_invalid_backend_refs_answer_500(tmp_path: Path, test: str, path: str) -> None:
    """The request half of each of these upstream tests (their status half is in
    test_status_routes.py): a GET to the rule whose only backend is invalid is 500."""
    run(tmp_path, test, "same-namespace", [Case(path, method="GET", status=500)])


def test_httproute_partially_invalid_via_invalid_reference_grant(tmp_path: Path) -> None:
    run(
        tmp_path,
        "httproute-partially-invalid-via-invalid-reference-grant",
        "same-namespace",
        [
            Case("/v2", method="GET", status=500),
            Case("/", method="GET", backend="app-backend-v1", namespace=APP),
        ],
    )


def test_httproute_reference_grant(tmp_path: Path) -> None:
    """Granted: web-backend answers; the ReferenceGrant deleted: 500."""
    documents = raw("httproute-reference-grant")
    gateway = Identity(INFRA, "same-namespace")
    with serving(documents, gateway, tmp_path / "granted") as served:
        settle(served)
        check(served, [Case("/", method="GET", backend="web-backend", namespace=WEB)])
    grant = find(documents, "ReferenceGrant", "reference-grant")
    with serving([d for d in documents if d is not grant], gateway, tmp_path / "deleted") as served:
        settle(served)
        check(served, [Case("/", method="GET", status=500)])


@pytest.mark.parametrize(
    "test", ["httproute-request-header-modifier", "httproute-request-header-modifier-backend"]
)
def test_httproute_request_header_modifier(tmp_path: Path, test: str) -> None:
    """HTTPRouteRequestHeaderModifier, and HTTPRouteBackendRequestHeaderModifier (extended:
    the same table, the filters on the backendRef): one Go test, two manifests."""
    v1 = "infra-backend-v1"
    run(
        tmp_path,
        test,
        "same-namespace",
        [
            Case(
                "/set",
                headers={"Some-Other-Header": "val"},
                backend=v1,
                received={"Some-Other-Header": "val", "X-Header-Set": "set-overwrites-values"},
            ),
            Case(
                "/set",
                headers={"Some-Other-Header": "val", "X-Header-Set": "some-other-value"},
                backend=v1,
                received={"Some-Other-Header": "val", "X-Header-Set": "set-overwrites-values"},
            ),
            Case(
                "/add",
                headers={"Some-Other-Header": "val"},
                backend=v1,
                received={"Some-Other-Header": "val", "X-Header-Add": "add-appends-values"},
            ),
            Case(
                "/add",
                headers={"Some-Other-Header": "val", "X-Header-Add": "some-other-value"},
                backend=v1,
                received={
                    "Some-Other-Header": "val",
                    "X-Header-Add": "some-other-value,add-appends-values",
                },
            ),
            Case(
                "/remove",
                headers={"X-Header-Remove": "val"},
                backend=v1,
                absent=("X-Header-Remove",),
            ),
            Case(
                "/multiple",
                headers={
                    "X-Header-Set-2": "set-val-2",
                    "X-Header-Add-2": "add-val-2",
                    "X-Header-Remove-2": "remove-val-2",
                    "Another-Header": "another-header-val",
                },
                backend=v1,
                received={
                    "X-Header-Set-1": "header-set-1",
                    "X-Header-Set-2": "header-set-2",
                    "X-Header-Add-1": "header-add-1",
                    "X-Header-Add-2": "add-val-2,header-add-2",
                    "X-Header-Add-3": "header-add-3",
                    "Another-Header": "another-header-val",
                },
                absent=("X-Header-Remove-1", "X-Header-Remove-2"),
            ),
            Case(
                "/case-insensitivity",
                headers={
                    "x-header-set": "original-val-set",
                    "x-header-add": "original-val-add",
                    "x-header-remove": "original-val-remove",
                    "Another-Header": "another-header-val",
                },
                backend=v1,
                received={
                    "X-Header-Set": "header-set",
                    "X-Header-Add": "original-val-add,header-add",
                    "Another-Header": "another-header-val",
                },
                absent=("x-header-remove", "X-Header-Remove"),
            ),
        ],
    )


def test_httproute_omitted_backendrefs(tmp_path: Path) -> None:
    run(tmp_path, "httproute-omitted-backendrefs", "same-namespace", [
        Case("/forward", backend="infra-backend-v1"),
        Case("/omitted-no-forward", status=500),
        Case("/empty-no-forward", status=500),
    ])  # fmt: skip


def test_httproute_https_listener(tmp_path: Path) -> None:
    """Over TLS with each host name as SNI, verified against the certificate the listeners
    name (upstream's suite makes tls-validity-checks-certificate; here, for the test's
    host names)."""
    secret = f"{INFRA}/tls-validity-checks-certificate"
    hosts = ("example.org", "unknown-example.org", "second-example.org")
    gateway = Identity(INFRA, "same-namespace-with-https-listener")
    with serving(raw("httproute-https-listener"), gateway, tmp_path, {secret: hosts}) as served:
        ca = tmp_path / "gateway-certs" / secret / "tls.crt"
        settle_tls(served, ca)
        check(served, [
            Case("/", "example.org", backend="infra-backend-v1", port=443, tls_ca=ca),
            Case("/", "unknown-example.org", status=404, port=443, tls_ca=ca),
            Case("/", "second-example.org", backend="infra-backend-v2", port=443, tls_ca=ca),
        ])  # fmt: skip


def settle_tls(served: Gateway, ca: Path) -> None:
    def answers() -> bool:
        try:
            served.get_tls("/", "example.org", ca)
        except OSError:
            return False
        return True

    asyncio.run(eventually(answers, timeout=10, message="the gateway's port 443"))


def test_httproute_response_header_modifier(tmp_path: Path) -> None:
    """Extended (SupportHTTPRouteResponseHeaderModification)."""
    v1 = "infra-backend-v1"
    run(tmp_path, "httproute-response-header-modifier", "same-namespace", [
        Case("/set", backend=v1, backend_sets={"Some-Other-Header": "val"},
             response={"Some-Other-Header": "val", "X-Header-Set": "set-overwrites-values"}),
        Case("/set", backend=v1,
             backend_sets={"Some-Other-Header": "val", "X-Header-Set": "some-other-value"},
             response={"Some-Other-Header": "val", "X-Header-Set": "set-overwrites-values"}),
        Case("/add", backend=v1, backend_sets={"Some-Other-Header": "val"},
             response={"Some-Other-Header": "val", "X-Header-Add": "add-appends-values"}),
        Case("/add", backend=v1,
             backend_sets={"Some-Other-Header": "val", "X-Header-Add": "some-other-value"},
             response={"Some-Other-Header": "val",
                       "X-Header-Add": "some-other-value,add-appends-values"}),
        Case("/remove", backend=v1, backend_sets={"X-Header-Remove": "val"},
             response_absent=("X-Header-Remove",)),
        Case("/multiple", backend=v1,
             backend_sets={"X-Header-Set-2": "set-val-2", "X-Header-Add-2": "add-val-2",
                           "X-Header-Remove-2": "remove-val-2",
                           "Another-Header": "another-header-val", "X-Header-Remove-1": "val"},
             response={"X-Header-Set-1": "header-set-1", "X-Header-Set-2": "header-set-2",
                       "X-Header-Add-1": "header-add-1", "X-Header-Add-2": "add-val-2,header-add-2",
                       "X-Header-Add-3": "header-add-3", "Another-Header": "another-header-val"},
             response_absent=("X-Header-Remove-1", "X-Header-Remove-2")),
        Case("/case-insensitivity", backend=v1,
             backend_sets={"x-header-set": "original-val-set", "x-header-add": "original-val-add",
                           "x-header-remove": "original-val-remove",
                           "Another-Header": "another-header-val"},
             response={"X-Header-Set": "header-set", "X-Header-Add": "original-val-add,header-add",
                       "X-Lowercase-Add": "lowercase-add", "X-Mixedcase-Add-1": "mixedcase-add-1",
                       "X-Mixedcase-Add-2": "mixedcase-add-2", "X-Uppercase-Add": "uppercase-add",
                       "Another-Header": "another-header-val"},
             response_absent=("x-header-remove", "X-Header-Remove")),
        Case("/response-and-request-header-modifiers", backend=v1,
             headers={"X-Header-Remove": "remove-val", "X-Header-Add-Append": "append-val-1",
                      "X-Header-Echo": "echo"},
             backend_sets={"X-Header-Set-2": "set-val-2", "X-Header-Add-2": "add-val-2",
                           "X-Header-Remove-2": "remove-val-2",
                           "Another-Header": "another-header-val",
                           "X-Header-Remove-1": "remove-val-1", "X-Header-Echo": "echo"},
             received={"X-Header-Add": "header-val-1", "X-Header-Set": "set-overwrites-values",
                       "X-Header-Add-Append": "append-val-1,header-val-2", "X-Header-Echo": "echo"},
             absent=("X-Header-Remove",),
             response={"X-Header-Set-1": "header-set-1", "X-Header-Set-2": "header-set-2",
                       "X-Header-Add-1": "header-add-1", "X-Header-Add-2": "add-val-2,header-add-2",
                       "Another-Header": "another-header-val", "X-Header-Echo": "echo"},
             response_absent=("X-Header-Remove-1", "X-Header-Remove-2")),
    ])  # fmt: skip


def test_httproute_rewrite_path(tmp_path: Path) -> None:
    """Extended (SupportHTTPRoutePathRewrite)."""
    v1 = "infra-backend-v1"
    modified = {
        "X-Header-Add": "header-val-1",
        "X-Header-Add-Append": "append-val-1,header-val-2",
        "X-Header-Set": "set-overwrites-values",
    }
    sent = {
        "X-Header-Remove": "remove-val",
        "X-Header-Add-Append": "append-val-1",
        "X-Header-Set": "set-val",
    }
    run(tmp_path, "httproute-rewrite-path", "same-namespace", [
        Case("/prefix/one/two", backend=v1, received_path="/one/two"),
        Case("/strip-prefix/three", backend=v1, received_path="/three"),
        Case("/strip-prefix", backend=v1, received_path="/"),
        Case("/full/one/two", backend=v1, received_path="/one"),
        Case("/full/rewrite-path-and-modify-headers/test", headers=sent, backend=v1,
             received_path="/test", received=modified, absent=("X-Header-Remove",)),
        Case("/prefix/rewrite-path-and-modify-headers/one", headers=sent, backend=v1,
             received_path="/prefix/one", received=modified, absent=("X-Header-Remove",)),
    ])  # fmt: skip


def test_httproute_rewrite_host(tmp_path: Path) -> None:
    """Extended (SupportHTTPRouteHostRewrite)."""
    run(tmp_path, "httproute-rewrite-host", "same-namespace", [
        Case("/one", "rewrite.example", backend="infra-backend-v1",
             received_host="one.example.org"),
        Case("/two", "rewrite.example", backend="infra-backend-v2", received_host="example.org"),
        Case("/rewrite-host-and-modify-headers", "rewrite.example",
             headers={"X-Header-Remove": "remove-val", "X-Header-Add-Append": "append-val-1"},
             backend="infra-backend-v2", received_host="test.example.org",
             received={"X-Header-Add": "header-val-1",
                       "X-Header-Add-Append": "append-val-1,header-val-2",
                       "X-Header-Set": "set-overwrites-values"},
             absent=("X-Header-Remove",)),
    ])  # fmt: skip

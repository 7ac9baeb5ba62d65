"""Upstream's GRPCRoute conformance tests (v1.6.1) whose calls turn on routing, each against
a real Envoy serving the gateway Trellis builds from the upstream manifests
(:mod:`tests.conformance.gatewayenvoy`), with grpcio clients over h2c. upstream's
``grpc.ExpectedResponse`` table, transcribed: the code, and for OK the backend that
answered (upstream's echo server also names its namespace; every gRPC backend of these
tests is in gateway-conformance-infra, and its name is unique there). One test per
upstream test, named after it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from tests.conformance.gatewayenvoy import serving, settle
from tests.conformance.upstream import INFRA, raw
from trellis_catalog.domain.model.views import Identity

#: each test starts an Envoy and its backends: seconds (``make test-fast`` leaves it out)
pytestmark = pytest.mark.slow

SERVICE = "/gateway_api_conformance.echo_basic.grpcecho.GrpcEcho/"
ECHO, ECHO_TWO, ECHO_THREE = SERVICE + "Echo", SERVICE + "EchoTwo", SERVICE + "EchoThree"
UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED


@dataclass(frozen=True)
class Call:
    """One of upstream's ``grpc.ExpectedResponse``."""

    method: str = ECHO
    metadata: tuple[tuple[str, str], ...] = ()
    authority: str = ""
    backend: str = ""
    code: grpc.StatusCode = grpc.StatusCode.OK


def run(tmp_path: Path, test: str, gateway: str, calls: Iterable[Call]) -> None:
    failures = []
    with serving(raw(test), Identity(INFRA, gateway), tmp_path) as served:
        settle(served)
        for call in calls:
            # grpcio sends metadata keys as given; HTTP/2 wants them lower case
            metadata = tuple((k.lower(), v) for k, v in call.metadata)
            code, body = served.grpc(call.method, call.authority, metadata)
            if code != call.code:
                failures.append(f"{call}: {code}, expected {call.code}")
            elif code == grpc.StatusCode.OK and body.get("app") != call.backend:
                failures.append(f"{call}: answered by {body.get('app')}")
    assert not failures, "\n".join(failures)


def test_grpcroute_exact_method_matching(tmp_path: Path) -> None:
    run(tmp_path, "grpcroute-exact-method-matching", "same-namespace", [
        Call(ECHO, backend="grpc-infra-backend-v1"),
        Call(ECHO_TWO, backend="grpc-infra-backend-v2"),
        Call(ECHO_THREE, code=UNIMPLEMENTED),
    ])  # fmt: skip


def test_grpcroute_header_matching(tmp_path: Path) -> None:
    v1, v2 = "grpc-infra-backend-v1", "grpc-infra-backend-v2"
    run(tmp_path, "grpcroute-header-matching", "same-namespace", [
        Call(metadata=(("Version", "one"),), backend=v1),
        Call(metadata=(("Version", "two"),), backend=v2),
        Call(metadata=(("Version", "two"), ("Color", "orange")), backend=v1),
        Call(metadata=(("Version", "two"), ("Color", "blue")), backend=v2),
        Call(metadata=(("Color", "orange"),), code=UNIMPLEMENTED),
        Call(metadata=(("Some-Other-Header", "one"),), code=UNIMPLEMENTED),
        Call(metadata=(("Color", "blue"),), backend=v1),
        Call(metadata=(("Color", "green"),), backend=v1),
        Call(metadata=(("Color", "red"),), backend=v2),
        Call(metadata=(("Color", "yellow"),), backend=v2),
        Call(metadata=(("Color", "purple"),), code=UNIMPLEMENTED),
    ])  # fmt: skip


def test_grpcroute_listener_hostname_matching(tmp_path: Path) -> None:
    v1, v2, v3 = (f"grpc-infra-backend-v{n}" for n in (1, 2, 3))
    run(tmp_path, "grpcroute-listener-hostname-matching", "grpcroute-listener-hostname-matching", [
        Call(authority="bar.com", backend=v1),
        Call(authority="foo.bar.com", backend=v2),
        Call(authority="baz.bar.com", backend=v3),
        Call(authority="boo.bar.com", backend=v3),
        Call(authority="multiple.prefixes.bar.com", backend=v3),
        Call(authority="multiple.prefixes.foo.com", backend=v3),
        Call(authority="foo.com", code=UNIMPLEMENTED),
        Call(authority="no.matching.host", code=UNIMPLEMENTED),
    ])  # fmt: skip

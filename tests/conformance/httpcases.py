"""upstream's ``http.ExpectedResponse`` and ``CompareRoundTrip`` (``conformance/utils/http``),
for the traffic tests: a :class:`Case` is one row of a Go test's table, and :func:`check`
sends each through the gateway and compares the answer as upstream does: the status; for
a 200, the backend (pod name prefix) and namespace that answered, and the path, method
and headers the backend received (``ExpectedRequest``), and the response's headers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.conformance.gatewayenvoy import Echoed, Gateway, serving, settle
from tests.conformance.upstream import INFRA, raw
from trellis_catalog.domain.model.views import Identity

WEB = "gateway-conformance-web-backend"
APP = "gateway-conformance-app-backend"


@dataclass(frozen=True)
class Case:
    """One of upstream's ``http.ExpectedResponse``: the request, and what must answer."""

    path: str
    host: str = ""
    method: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    backend: str = ""
    status: int = 200
    namespace: str = INFRA
    port: int = 80
    received: Mapping[str, str] | None = None  # ExpectedRequest's headers
    received_path: str = ""  # ExpectedRequest's path ("": the request's)
    received_host: str = ""  # ExpectedRequest's host (none given: the request's, if no
    # other ExpectedRequest field is given, as upstream defaults it; else not compared)
    absent: tuple[str, ...] = ()  # ExpectedRequest's AbsentHeaders
    backend_sets: Mapping[str, str] = field(default_factory=dict)  # BackendSetResponseHeaders
    response: Mapping[str, str] = field(default_factory=dict)  # Response.Headers
    response_absent: tuple[str, ...] = ()  # Response.AbsentHeaders
    tls_ca: Path | None = None  # over TLS, verified against this certificate


def check(gateway: Gateway, cases: Iterable[Case]) -> None:
    """Every case, and all the failures at once."""
    failures = []
    for case in cases:
        problem = _compare(case, send(gateway, case))
        if problem:
            failures.append(f"{case}: {problem}")
    assert not failures, "\n".join(failures)


def send(gateway: Gateway, case: Case) -> Echoed:
    if case.tls_ca is not None:
        return gateway.get_tls(case.path, case.host, case.tls_ca, case.port)
    headers = dict(case.headers)
    if case.backend_sets:  # upstream's round tripper asks echo-basic to set these
        headers["X-Echo-Set-Header"] = ",".join(f"{k}:{v}" for k, v in case.backend_sets.items())
    return gateway.get(case.path, case.host, case.port, case.method or "GET", headers)


def _compare(case: Case, answer: Echoed) -> str:
    status, body = answer.status, answer.body
    if status != case.status:
        return f"status {status}, expected {case.status}"
    if status != 200:
        return ""
    if not str(body["pod"]).startswith(case.backend):
        return f"answered by {body['pod']}, expected {case.backend}"
    if body["namespace"] != case.namespace:
        return f"namespace {body['namespace']}, expected {case.namespace}"
    if body["path"] != (case.received_path or case.path):
        return f"the backend got path {body['path']}"
    # upstream: ExpectedRequest defaults to the request, whose Host is then compared
    default = case.received is None and not case.received_path and not case.absent
    host = case.received_host or (case.host if default else "")
    if host and body["host"] != host:
        return f"the backend got host {body['host']}, expected {host}"
    if body["method"] != (case.method or "GET"):
        return f"the backend got method {body['method']}"
    got = body["headers"]
    assert isinstance(got, dict)
    for name, value in (case.received or {}).items():
        if got.get(name.lower()) != value:
            return f"the backend got {name}: {got.get(name.lower())!r}, expected {value!r}"
    for name in case.absent:
        if name.lower() in got:
            return f"the backend got {name}, expected none"
    for name, value in case.response.items():
        if answer.headers.get(name.lower()) != value:
            return f"response {name}: {answer.headers.get(name.lower())!r}, expected {value!r}"
    for name in case.response_absent:
        if name.lower() in answer.headers:
            return f"response has {name}, expected none"
    return ""


def run(
    tmp_path: Path,
    test: str | tuple[str, ...],
    gateway: str,
    cases: Iterable[Case],
    ports: Iterable[int] = (80,),
) -> None:
    """Serve ``gateway`` from the base and ``test``'s manifests; :func:`check` ``cases``."""
    tests = (test,) if isinstance(test, str) else test
    with serving(raw(*tests), Identity(INFRA, gateway), tmp_path) as served:
        for port in ports:
            settle(served, port)
        check(served, cases)

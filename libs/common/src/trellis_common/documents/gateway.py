"""Gateway API routes in the mesh: ``GRPCRoute`` and ``HTTPRoute`` (``gateway.networking.k8s.io``).

Trellis reads them as the GAMMA mesh pattern uses them: a route attaches to a Service
(``parentRefs: [{group: "", kind: Service, name, port}]``) and shapes the traffic of every
client of that Service. The models follow the upstream v1 API (``apis/v1/grpcroute_types.go``,
``httproute_types.go`` and ``shared_types.go``), the CRDs' validation rules included, so a
manifest the API server would refuse is an error here too, naming the field:

- ``GRPCRoute`` (v1alpha2, v1): a method match needs a service or a method (``Exact`` with
  neither is invalid); ``Exact`` names are gRPC identifiers (``service``: dotted, no ``/``);
  ``RegularExpression`` values must compile for Envoy's RE2 engine. A missing ``type`` is
  ``Exact``.
- ``HTTPRoute`` (v1beta1, v1): path ``Exact``/``PathPrefix`` values are absolute, clean paths;
  ``RegularExpression`` (paths, headers, query parameters) compiles for RE2; ``method`` is an
  HTTP method; ``timeouts`` are Gateway API durations (``1h``, ``500ms``, ``1m30s``) with
  ``backendRequest`` no longer than ``request``.
- Filters are a union: the field that ``type`` names must be set and no other; a header
  modifier names a header once; ``RequestRedirect`` and ``URLRewrite`` (HTTPRoute only)
  cannot be combined, as upstream says.
- Backend references: kind ``Service`` (core group) needs ``port``; ``weight`` is 0 to
  1,000,000, 1 when unset.

What a reference resolves to (a parent or backend Service that exists, a port it has, the
intersection of hostnames) is the catalog's business: it answers with the route's
``Accepted`` and ``ResolvedRefs`` conditions rather than refusing the document.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any, Final, Literal

from pydantic import Field, field_validator, model_validator

from trellis_common.documents.base import KindRegistry, Resource, StrictModel
from trellis_common.documents.gateway_filters import (
    GRPCBackendRef,
    GRPCRouteFilter,
    HeaderName,
    Hostname,
    HTTPBackendRef,
    HTTPRouteFilter,
    _check_filters,
    _header_name,
    _hostname,
)
from trellis_common.documents.smi import (
    Namespace,
    ObjectName,
    Port,
    _invalid,
    regex_problem,
)

GROUP: Final = "gateway.networking.k8s.io"
GRPC_ROUTE_API_VERSIONS: Final = (f"{GROUP}/v1alpha2", f"{GROUP}/v1")
HTTP_ROUTE_API_VERSIONS: Final = (f"{GROUP}/v1beta1", f"{GROUP}/v1")

_GRPC_SERVICE: Final = re.compile(r"(?i)\.?[a-z_][a-z_0-9]*(\.[a-z_][a-z_0-9]*)*")
_GRPC_METHOD: Final = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_DURATION: Final = re.compile(r"([0-9]{1,5}(h|m|s|ms)){1,4}")
_DURATION_PART: Final = re.compile(r"([0-9]{1,5})(h|ms|m|s)")
_UNITS: Final = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_BAD_PATH: Final = ("//", "/./", "/../", "%2f", "%2F", "#")


def parse_duration(value: str) -> timedelta:
    """A Gateway API duration (GEP-2257): 1 to 4 parts of up to 5 digits and h, m, s or ms."""
    if not _DURATION.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a Gateway API duration: up to four parts such as '1h', '30m', "
            "'10s', '500ms' (e.g. '1m30s')"
        )
    seconds = sum(int(n) * _UNITS[u] for n, u in _DURATION_PART.findall(value))
    return timedelta(seconds=seconds)


HttpMethod = Literal["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"]


class ParentReference(StrictModel):
    """Where a route attaches. Trellis serves parents of kind ``Service`` in the core group
    (GAMMA); a route's other parents (Gateways) belong to other controllers."""

    group: str = GROUP
    kind: str = "Gateway"
    namespace: Namespace | None = None
    name: ObjectName
    section_name: str | None = Field(default=None, alias="sectionName")
    port: Port | None = None

    @property
    def is_service(self) -> bool:
        return self.group in ("", "core") and self.kind == "Service"

    def describe(self, route_namespace: str) -> str:
        namespace = self.namespace or route_namespace
        port = f":{self.port}" if self.port is not None else ""
        return f"{self.kind} {namespace}/{self.name}{port}"


class HeaderMatch(StrictModel):
    """A header (or query parameter) match; among equivalent names the first one wins."""

    type: Literal["Exact", "RegularExpression"] = "Exact"
    name: HeaderName
    value: Annotated[str, Field(min_length=1, max_length=4096)]

    @model_validator(mode="after")
    def _regex(self) -> HeaderMatch:
        if self.type == "RegularExpression":
            problem = regex_problem(self.value)
            if problem is not None:
                _invalid(("value",), problem, self.value)
        return self


class GRPCHeaderMatch(HeaderMatch):
    _name = field_validator("name")(lambda cls, v: _header_name(v))


class HTTPHeaderMatch(GRPCHeaderMatch):
    pass


class QueryParamMatch(HeaderMatch):
    pass


class GRPCMethodMatch(StrictModel):
    type: Literal["Exact", "RegularExpression"] = "Exact"
    service: Annotated[str, Field(max_length=1024)] | None = None
    method: Annotated[str, Field(max_length=1024)] | None = None

    @model_validator(mode="after")
    def _valid(self) -> GRPCMethodMatch:
        if not self.service and not self.method:
            _invalid((), "one or both of 'service' or 'method' must be specified", None)
        for field, value, pattern in (
            ("service", self.service, _GRPC_SERVICE),
            ("method", self.method, _GRPC_METHOD),
        ):
            if not value:
                continue
            if self.type == "Exact" and not pattern.fullmatch(value):
                what = "a dotted gRPC service name" if field == "service" else "a gRPC method name"
                _invalid(
                    (field,), f"{value!r} is not {what} (Exact takes no '/' or pattern)", value
                )
            if self.type == "RegularExpression":
                problem = regex_problem(value)
                if problem is not None:
                    _invalid((field,), problem, value)
        return self


def _first_headers(headers: tuple[Any, ...]) -> tuple[Any, ...]:
    """Headers with only the first of each (case-insensitive) name, as the API says."""
    seen: set[str] = set()
    found = []
    for header in headers:
        if header.name.lower() not in seen:
            seen.add(header.name.lower())
            found.append(header)
    return tuple(found)


class GRPCRouteMatch(StrictModel):
    method: GRPCMethodMatch | None = None
    headers: tuple[GRPCHeaderMatch, ...] = Field(default=(), max_length=16)

    def effective_headers(self) -> tuple[GRPCHeaderMatch, ...]:
        return _first_headers(self.headers)


class GRPCRouteRule(StrictModel):
    name: str | None = None
    matches: tuple[GRPCRouteMatch, ...] = Field(default=(), max_length=8)
    filters: tuple[GRPCRouteFilter, ...] = Field(default=(), max_length=16)
    backend_refs: tuple[GRPCBackendRef, ...] = Field(default=(), alias="backendRefs", max_length=16)

    @model_validator(mode="after")
    def _filters(self) -> GRPCRouteRule:
        _check_filters(self.filters)
        return self


class PathMatch(StrictModel):
    type: Literal["Exact", "PathPrefix", "RegularExpression"] = "PathPrefix"
    value: Annotated[str, Field(max_length=1024)] = "/"

    @model_validator(mode="after")
    def _valid(self) -> PathMatch:
        if self.type == "RegularExpression":
            problem = regex_problem(self.value)
            if problem is not None:
                _invalid(("value",), problem, self.value)
            return self
        if not self.value.startswith("/"):
            reason = f"must be an absolute path (start with '/'), got {self.value!r}"
            _invalid(("value",), reason, self.value)
        bad = [b for b in _BAD_PATH if b in self.value]
        if bad or self.value.endswith(("/.", "/..")):
            what = bad[0] if bad else "a trailing '/.' or '/..'"
            _invalid(("value",), f"must be a clean path: {what!r} is not allowed", self.value)
        return self


class HTTPRouteMatch(StrictModel):
    path: PathMatch = Field(default_factory=PathMatch)
    headers: tuple[HTTPHeaderMatch, ...] = Field(default=(), max_length=16)
    query_params: tuple[QueryParamMatch, ...] = Field(
        default=(), alias="queryParams", max_length=16
    )
    method: HttpMethod | None = None

    def effective_headers(self) -> tuple[HTTPHeaderMatch, ...]:
        return _first_headers(self.headers)

    def effective_query_params(self) -> tuple[QueryParamMatch, ...]:
        """Query parameter names are case-sensitive: the first of each exact name wins."""
        seen: set[str] = set()
        found = []
        for param in self.query_params:
            if param.name not in seen:
                seen.add(param.name)
                found.append(param)
        return tuple(found)


class HTTPRouteTimeouts(StrictModel):
    request: str | None = None
    backend_request: str | None = Field(default=None, alias="backendRequest")

    @model_validator(mode="after")
    def _valid(self) -> HTTPRouteTimeouts:
        request = self.request_timeout()
        backend = self.backend_timeout()
        if request and backend and backend > request:
            _invalid(("backendRequest",), "must not be longer than request", self.backend_request)
        return self

    @field_validator("request", "backend_request")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value)
        return value

    def request_timeout(self) -> timedelta | None:
        """The whole request's deadline; ``0s`` (or unset) disables it."""
        found = parse_duration(self.request) if self.request else None
        return found if found else None

    def backend_timeout(self) -> timedelta | None:
        found = parse_duration(self.backend_request) if self.backend_request else None
        return found if found else None


class HTTPRouteRule(StrictModel):
    name: str | None = None
    matches: tuple[HTTPRouteMatch, ...] = Field(default=(HTTPRouteMatch(),), max_length=64)
    filters: tuple[HTTPRouteFilter, ...] = Field(default=(), max_length=16)
    backend_refs: tuple[HTTPBackendRef, ...] = Field(default=(), alias="backendRefs", max_length=16)
    timeouts: HTTPRouteTimeouts | None = None

    @model_validator(mode="after")
    def _filters(self) -> HTTPRouteRule:
        _check_filters(self.filters)
        if not self.matches:
            object.__setattr__(self, "matches", (HTTPRouteMatch(),))  # an empty list: all
        return self


class _RouteSpec(StrictModel):
    parent_refs: tuple[ParentReference, ...] = Field(default=(), alias="parentRefs", max_length=32)
    hostnames: tuple[Hostname, ...] = Field(default=(), max_length=16)

    _hosts = field_validator("hostnames")(lambda cls, values: tuple(_hostname(v) for v in values))


class GRPCRouteSpec(_RouteSpec):
    rules: tuple[GRPCRouteRule, ...] = Field(default=(), max_length=16)


class HTTPRouteSpec(_RouteSpec):
    rules: tuple[HTTPRouteRule, ...] = Field(default=(HTTPRouteRule(),), max_length=16)


class GRPCRoute(Resource[GRPCRouteSpec]):
    """A GRPCRoute: gRPC requests to its parent Services, matched by service, method and
    headers, filtered and sent to weighted backends."""


class HTTPRoute(Resource[HTTPRouteSpec]):
    """An HTTPRoute: HTTP requests to its parent Services, matched by path, headers, query
    parameters and method, filtered and sent to weighted backends."""


def register(registry: KindRegistry) -> None:
    registry.register("GRPCRoute", GRPC_ROUTE_API_VERSIONS, GRPCRoute)
    registry.register("HTTPRoute", HTTP_ROUTE_API_VERSIONS, HTTPRoute)

"""Gateway API filters and backend references, shared by GRPCRoute and HTTPRoute
(:mod:`.gateway`): header modifiers, mirrors, redirects, rewrites, extension references,
and weighted backends with their own filters. Filters are unions: the field that ``type``
names must be set and no other; RequestRedirect and URLRewrite cannot be combined.
"""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal

from pydantic import Field, Strict, field_validator, model_validator

from trellis_common.documents.base import StrictModel
from trellis_common.documents.smi import _HEADER_NAME, Namespace, ObjectName, Port, _invalid

MAX_WEIGHT: Final = 1_000_000
_HOSTNAME: Final = re.compile(
    r"(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)


def _header_name(value: str) -> str:
    if not 1 <= len(value) <= 256 or not _HEADER_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a valid header name (an RFC 9110 token)")
    return value


def _hostname(value: str) -> str:
    if len(value) > 253 or not _HOSTNAME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a valid hostname: lower-case DNS labels, optionally prefixed "
            "with a '*.' wildcard label (no IP address, no port)"
        )
    return value


HeaderName = Annotated[str, Field(min_length=1), Field(max_length=256)]
Hostname = Annotated[str, Field(min_length=1)]
Weight = Annotated[int, Strict(), Field(ge=0, le=MAX_WEIGHT)]


class BackendObjectReference(StrictModel):
    group: str = ""
    kind: str = "Service"
    name: ObjectName
    namespace: Namespace | None = None
    port: Port | None = None

    @model_validator(mode="after")
    def _port(self) -> BackendObjectReference:
        if self.group in ("", "core") and self.kind == "Service" and self.port is None:
            _invalid(("port",), "is required when referring to a Service", None)
        return self

    @property
    def is_service(self) -> bool:
        return self.group in ("", "core") and self.kind == "Service"


class HTTPHeader(StrictModel):
    name: HeaderName
    value: Annotated[str, Field(max_length=4096)]

    _name = field_validator("name")(lambda cls, v: _header_name(v))


class HeaderModifier(StrictModel):
    """``RequestHeaderModifier``/``ResponseHeaderModifier``: set, add and remove headers."""

    set: tuple[HTTPHeader, ...] = Field(default=(), max_length=16)
    add: tuple[HTTPHeader, ...] = Field(default=(), max_length=16)
    remove: tuple[HeaderName, ...] = Field(default=(), max_length=16)

    @model_validator(mode="after")
    def _once(self) -> HeaderModifier:
        for field, names in (
            ("set", [h.name for h in self.set]),
            ("add", [h.name for h in self.add]),
            ("remove", list(self.remove)),
        ):
            seen: dict[str, int] = {}
            for index, name in enumerate(names):
                _header_name(name)
                if name.lower() in seen:
                    reason = (
                        f"header {name!r} is also {field}[{seen[name.lower()]}] "
                        "(names are case-insensitive)"
                    )
                    _invalid((field, index), reason, name)
                seen[name.lower()] = index
        return self


class Fraction(StrictModel):
    numerator: Annotated[int, Strict(), Field(ge=0)]
    denominator: Annotated[int, Strict(), Field(ge=1)] = 100

    @model_validator(mode="after")
    def _proper(self) -> Fraction:
        if self.numerator > self.denominator:
            _invalid(("numerator",), "must not exceed the denominator", self.numerator)
        return self


class RequestMirror(StrictModel):
    backend_ref: BackendObjectReference = Field(alias="backendRef")
    percent: Annotated[int, Strict(), Field(ge=0, le=100)] | None = None
    fraction: Fraction | None = None

    @model_validator(mode="after")
    def _one_share(self) -> RequestMirror:
        if self.percent is not None and self.fraction is not None:
            _invalid(("fraction",), "set percent or fraction, not both", None)
        return self

    def share(self) -> tuple[int, int]:
        """The mirrored share as numerator/denominator (everything when unset)."""
        if self.percent is not None:
            return self.percent, 100
        if self.fraction is not None:
            return self.fraction.numerator, self.fraction.denominator
        return 100, 100


class LocalObjectReference(StrictModel):
    group: str
    kind: str
    name: ObjectName


class PathModifier(StrictModel):
    type: Literal["ReplaceFullPath", "ReplacePrefixMatch"]
    replace_full_path: str | None = Field(default=None, alias="replaceFullPath")
    replace_prefix_match: str | None = Field(default=None, alias="replacePrefixMatch")

    @model_validator(mode="after")
    def _union(self) -> PathModifier:
        wanted = "replace_full_path" if self.type == "ReplaceFullPath" else "replace_prefix_match"
        other = "replace_prefix_match" if wanted == "replace_full_path" else "replace_full_path"
        alias = {
            "replace_full_path": "replaceFullPath",
            "replace_prefix_match": "replacePrefixMatch",
        }
        if getattr(self, wanted) is None:
            _invalid((alias[wanted],), f"is required when type is {self.type}", None)
        if getattr(self, other) is not None:
            _invalid((alias[other],), f"must not be set when type is {self.type}", None)
        return self


class RequestRedirect(StrictModel):
    scheme: Literal["http", "https"] | None = None
    hostname: Hostname | None = None
    path: PathModifier | None = None
    port: Port | None = None
    status_code: Literal[301, 302, 303, 307, 308] = Field(default=302, alias="statusCode")

    _host = field_validator("hostname")(lambda cls, v: v if v is None else _hostname(v))


class URLRewrite(StrictModel):
    hostname: Hostname | None = None
    path: PathModifier | None = None

    _host = field_validator("hostname")(lambda cls, v: v if v is None else _hostname(v))


_FILTER_FIELDS: Final = {
    "RequestHeaderModifier": "request_header_modifier",
    "ResponseHeaderModifier": "response_header_modifier",
    "RequestMirror": "request_mirror",
    "RequestRedirect": "request_redirect",
    "URLRewrite": "url_rewrite",
    "ExtensionRef": "extension_ref",
}
_ALIASES: Final = {
    "request_header_modifier": "requestHeaderModifier",
    "response_header_modifier": "responseHeaderModifier",
    "request_mirror": "requestMirror",
    "request_redirect": "requestRedirect",
    "url_rewrite": "urlRewrite",
    "extension_ref": "extensionRef",
}


class HTTPRouteFilter(StrictModel):
    """One filter: ``type`` says which of the other fields holds its configuration."""

    type: Literal[
        "RequestHeaderModifier",
        "ResponseHeaderModifier",
        "RequestMirror",
        "RequestRedirect",
        "URLRewrite",
        "ExtensionRef",
    ]
    request_header_modifier: HeaderModifier | None = Field(
        default=None, alias="requestHeaderModifier"
    )
    response_header_modifier: HeaderModifier | None = Field(
        default=None, alias="responseHeaderModifier"
    )
    request_mirror: RequestMirror | None = Field(default=None, alias="requestMirror")
    request_redirect: RequestRedirect | None = Field(default=None, alias="requestRedirect")
    url_rewrite: URLRewrite | None = Field(default=None, alias="urlRewrite")
    extension_ref: LocalObjectReference | None = Field(default=None, alias="extensionRef")

    @model_validator(mode="after")
    def _union(self) -> HTTPRouteFilter:
        wanted = _FILTER_FIELDS[self.type]
        if getattr(self, wanted) is None:
            _invalid((_ALIASES[wanted],), f"is required when type is {self.type}", None)
        for field in _FILTER_FIELDS.values():
            if field != wanted and getattr(self, field) is not None:
                reason = f"must not be set when type is {self.type}"
                _invalid((_ALIASES[field],), reason, None)
        return self


class GRPCRouteFilter(HTTPRouteFilter):
    type: Literal[
        "RequestHeaderModifier", "ResponseHeaderModifier", "RequestMirror", "ExtensionRef"
    ]


def _check_filters(filters: tuple[HTTPRouteFilter, ...]) -> None:
    types = [f.type for f in filters]
    if "RequestRedirect" in types and "URLRewrite" in types:
        index = types.index("URLRewrite")
        _invalid(("filters", index), "RequestRedirect and URLRewrite cannot be combined", None)
    for kind in (
        "RequestHeaderModifier",
        "ResponseHeaderModifier",
        "RequestRedirect",
        "URLRewrite",
    ):
        if types.count(kind) > 1:
            index = types.index(kind, types.index(kind) + 1)
            _invalid(("filters", index), f"{kind} may appear only once per rule", None)


class HTTPBackendRef(BackendObjectReference):
    weight: Weight = 1
    filters: tuple[HTTPRouteFilter, ...] = Field(default=(), max_length=16)

    @model_validator(mode="after")
    def _filters(self) -> HTTPBackendRef:
        _check_filters(self.filters)
        return self


class GRPCBackendRef(BackendObjectReference):
    weight: Weight = 1
    filters: tuple[GRPCRouteFilter, ...] = Field(default=(), max_length=16)

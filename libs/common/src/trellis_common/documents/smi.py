"""SMI documents: ``TrafficSplit``, ``TrafficTarget``, ``HTTPRouteGroup`` and ``TCPRoute``.

Each kind has one model for all the apiVersions Trellis reads, so consumers never ask which
version a user wrote; a field that a version lacks (``matches`` of a v1alpha2 TrafficSplit,
the destination ``port`` of a v1alpha3 TrafficTarget, ``matches`` of a v1alpha3 TCPRoute)
is an error naming that version rather than a silently different meaning.

Beyond the SMI schemas, the rules OSM applies are checked here, where the error can name
the file and field: weights are whole numbers with a positive total; a TrafficTarget's
destination is a ServiceAccount in its own namespace; rules name HTTPRouteGroups or
TCPRoutes; methods are HTTP methods or ``*``; path and header regexes compile and avoid what
Envoy's RE2 engine lacks (backreferences, lookaround, atomic groups, possessive quantifiers,
conditionals), see :func:`regex_problem`.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Final, Literal, NoReturn

from pydantic import (
    AfterValidator,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from trellis_common import ids, model
from trellis_common.documents.base import KindRegistry, Resource, StrictModel

SPLIT_API_VERSIONS: Final = tuple(f"split.smi-spec.io/v1alpha{n}" for n in (2, 3, 4))
ACCESS_API_VERSIONS: Final = ("access.smi-spec.io/v1alpha2", "access.smi-spec.io/v1alpha3")
SPECS_API_VERSIONS: Final = ("specs.smi-spec.io/v1alpha3", "specs.smi-spec.io/v1alpha4")

_RE2_LACKS: Final = (
    ("(?=", "lookahead '(?='"),
    ("(?!", "negative lookahead '(?!'"),
    ("(?<=", "lookbehind '(?<='"),
    ("(?<!", "negative lookbehind '(?<!'"),
    ("(?P=", "named backreference '(?P='"),
    ("(?>", "atomic group '(?>'"),
    ("(?(", "conditional '(?('"),
)
_OCTAL: Final = frozenset("01234567")
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 token


def _invalid(loc: tuple[str | int, ...], reason: str, value: object) -> NoReturn:
    """Fail validation at ``loc`` (relative to the model being validated) with ``reason``."""
    error = PydanticCustomError("invalid", "{reason}", {"reason": reason})
    details = InitErrorDetails(type=error, loc=loc, input=value)
    raise ValidationError.from_exception_data("document", [details])


def _reject_absent(data: Any, absent: Mapping[str, tuple[tuple[str, ...], str]]) -> Any:
    """Fail if ``data`` (a raw document) sets a field its apiVersion does not have."""
    if not isinstance(data, Mapping) or data.get("apiVersion") not in absent:
        return data
    path, reason = absent[data["apiVersion"]]
    value: Any = data
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            return data
        value = value[part]
    _invalid(path, f"is not part of {data['apiVersion']}: {reason}", value)


def _unique(items: Iterable[Any], key: Callable[[Any], str], loc: tuple[str, str]) -> None:
    """Fail at ``<loc[0]>[i].<loc[1]>`` if item ``i``'s key is also an earlier item's."""
    seen: dict[str, int] = {}
    for index, item in enumerate(items):
        value = key(item)
        if value in seen:
            reason = f"{value!r} is also the {loc[1]} of {loc[0]}[{seen[value]}]"
            _invalid((loc[0], index, loc[1]), reason, value)
        seen[value] = index


def regex_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be an Envoy (RE2) regex, or ``None`` if it looks fine.

    Checks that Python's ``re`` compiles it, then scans for the constructs RE2 lacks that
    ``re`` accepts. Octal escapes (``\\123``) are fine in both; ``\\1`` is a backreference.
    """
    try:
        with warnings.catch_warnings():  # FutureWarning "possible nested set" for '[['
            warnings.simplefilter("ignore")
            re.compile(pattern)
    except (re.error, OverflowError) as exc:  # OverflowError: a repeat count such as a{9**20}
        return f"does not compile: {exc}"
    except RecursionError:  # re's parser recurses once per nested group
        return "does not compile: its groups are nested too deeply"
    index, in_class = 0, False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            digits = pattern[index + 1 : index + 4]
            octal = digits[:1] == "0" or (len(digits) == 3 and set(digits) <= _OCTAL)
            if not in_class and digits[:1].isdigit() and not octal:
                return f"uses a backreference '\\{digits[:1]}', which Envoy's RE2 engine lacks"
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            index += 1
            index += pattern[index : index + 1] == "^"
            index += pattern[index : index + 1] == "]"  # a leading ']' is a literal
            continue
        elif char == "(":
            for prefix, what in _RE2_LACKS:
                if pattern.startswith(prefix, index):
                    return f"uses a {what}, which Envoy's RE2 engine lacks"
        elif char in "*+?" and pattern[index + 1 : index + 2] == "+" and pattern[index - 1] != "(":
            return "uses a possessive quantifier, which Envoy's RE2 engine lacks"
        index += 1
    return None


def _check_regex(value: str) -> str:
    problem = regex_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# InvalidIdentifier is a ValueError: pydantic reports its message as the reason.
ServiceName = Annotated[str, AfterValidator(lambda v: ids.validate_dns_label(v, "service name"))]
Namespace = Annotated[str, AfterValidator(lambda v: ids.validate_dns_label(v, "namespace"))]
ObjectName = Annotated[str, AfterValidator(lambda v: ids.validate_dns_subdomain(v, "name"))]
Port = Annotated[int, Strict(), Field(ge=1, le=65535)]
Regex = Annotated[str, AfterValidator(_check_regex)]


class TrafficSplitBackend(StrictModel):
    service: ServiceName
    weight: Annotated[int, Strict(), Field(ge=0, le=model.MAX_WEIGHT)]  # Envoy: uint32

    @field_validator("weight", mode="before")
    @classmethod
    def _not_a_quantity(cls, value: object) -> object:
        if isinstance(value, str):
            hint = "quantities such as '50m' were SMI v1alpha1 weights"
            raise ValueError(f"must be a whole number, not {value!r} ({hint})")
        return value


class RouteGroupRef(StrictModel):
    """A TrafficSplit's ``matches`` entry: an HTTPRouteGroup in the same namespace."""

    kind: Literal["HTTPRouteGroup"]
    name: ObjectName
    api_group: Literal["specs.smi-spec.io", ""] | None = Field(default=None, alias="apiGroup")


class TrafficSplitSpec(StrictModel):
    service: str
    backends: tuple[TrafficSplitBackend, ...]
    matches: tuple[RouteGroupRef, ...] = ()

    @field_validator("service")
    @classmethod
    def _service(cls, value: str) -> str:
        """``<name>``, ``<name>.<namespace>`` or the FQDN ``<name>.<namespace>.svc.<domain>``."""
        parts = value.split(".")
        ids.validate_dns_label(parts[0], "service name")
        if len(parts) > 1:
            ids.validate_dns_label(parts[1], "namespace")
        if len(parts) > 2 and parts[2] != "svc":
            raise ValueError(f"must be <name>, <name>.<namespace> or a service FQDN, got {value!r}")
        if len(parts) > 3:
            ids.validate_dns_subdomain(".".join(parts[3:]), "cluster domain")
        return value

    @model_validator(mode="after")
    def _backends(self) -> TrafficSplitSpec:
        if not self.backends:
            _invalid(("backends",), "must list at least one backend service", [])
        _unique(self.backends, lambda backend: backend.service, ("backends", "service"))
        if not any(backend.weight for backend in self.backends):
            _invalid(("backends",), "at least one backend needs a positive weight", 0)
        return self


class TrafficSplit(Resource[TrafficSplitSpec]):
    """An SMI TrafficSplit: the root service's traffic weighted between backend services."""

    @model_validator(mode="before")
    @classmethod
    def _version(cls, data: Any) -> Any:
        reason = "route group matches came with split.smi-spec.io/v1alpha3"
        return _reject_absent(data, {SPLIT_API_VERSIONS[0]: (("spec", "matches"), reason)})

    @model_validator(mode="after")
    def _root_namespace(self) -> TrafficSplit:
        parts = self.spec.service.split(".")
        if len(parts) > 1 and parts[1] != self.metadata.namespace:
            reason = f"must be in the TrafficSplit's namespace {self.metadata.namespace!r}"
            _invalid(("spec", "service"), reason, self.spec.service)
        return self

    def root_service(self) -> model.MeshService:
        return model.MeshService(self.metadata.namespace, self.spec.service.split(".")[0])

    def weighted_services(self) -> tuple[model.WeightedService, ...]:
        namespace = self.metadata.namespace
        return tuple(
            model.WeightedService(model.MeshService(namespace, b.service), b.weight)
            for b in self.spec.backends
        )


class IdentityBindingSubject(StrictModel):
    """A TrafficTarget's destination or source: a ServiceAccount (``port``: destination only)."""

    kind: Literal["ServiceAccount"]  # SMI allows "Group" too; OSM and Trellis do not
    name: ObjectName
    namespace: Namespace | None = None
    port: Port | None = None


class TrafficTargetRule(StrictModel):
    """Routes a TrafficTarget allows: all of ``kind``/``name``, or the ``matches`` named.

    Beyond SMI, a rule may name a Gateway API ``GRPCRoute`` (``apiGroup``
    ``gateway.networking.k8s.io``): it allows the gRPC methods (and headers) the route's
    matches take; ``matches`` then names the route's rules (their ``name``)."""

    kind: Literal["HTTPRouteGroup", "TCPRoute", "GRPCRoute"]
    name: ObjectName
    matches: tuple[str, ...] = ()


class TrafficTargetSpec(StrictModel):
    destination: IdentityBindingSubject
    sources: tuple[IdentityBindingSubject, ...]
    rules: tuple[TrafficTargetRule, ...]

    @model_validator(mode="after")
    def _lists(self) -> TrafficTargetSpec:
        if not self.sources:
            _invalid(("sources",), "must list at least one source service account", [])
        if not self.rules:
            _invalid(("rules",), "must list at least one rule (HTTPRouteGroup or TCPRoute)", [])
        for index, source in enumerate(self.sources):
            if source.port is not None:
                reason = "applies to the destination only; a source has no port"
                _invalid(("sources", index, "port"), reason, source.port)
        return self


class TrafficTarget(Resource[TrafficTargetSpec]):
    """An SMI TrafficTarget: which service accounts may call the destination, on which routes."""

    @model_validator(mode="before")
    @classmethod
    def _version(cls, data: Any) -> Any:
        reason = "restrict ports with a TCPRoute rule (specs.smi-spec.io/v1alpha4) instead"
        path = ("spec", "destination", "port")
        return _reject_absent(data, {ACCESS_API_VERSIONS[1]: (path, reason)})

    @model_validator(mode="after")
    def _destination_namespace(self) -> TrafficTarget:
        namespace = self.spec.destination.namespace
        if namespace is not None and namespace != self.metadata.namespace:
            reason = f"must be the TrafficTarget's namespace {self.metadata.namespace!r}"
            _invalid(("spec", "destination", "namespace"), reason, namespace)
        return self

    def destination_account(self) -> model.ServiceAccount:
        return model.ServiceAccount(self.metadata.namespace, self.spec.destination.name)

    def source_accounts(self) -> tuple[model.ServiceAccount, ...]:
        """The sources; one without a namespace is in the TrafficTarget's namespace."""
        return tuple(
            model.ServiceAccount(s.namespace or self.metadata.namespace, s.name)
            for s in self.spec.sources
        )


class HTTPMatch(StrictModel):
    """One named route; an unset ``pathRegex`` or empty ``methods`` match any."""

    name: str = Field(min_length=1)  # TrafficTarget rules name the matches they allow
    path_regex: Regex | None = Field(default=None, alias="pathRegex")
    methods: tuple[str, ...] = ()
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("methods")
    @classmethod
    def _methods(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for index, method in enumerate(value):
            if method != model.ANY_METHOD and method not in model.HTTP_METHODS:
                if method.upper() in model.HTTP_METHODS:
                    reason = f"methods are upper case: use {method.upper()!r}, not {method!r}"
                else:
                    known = ", ".join(sorted(model.HTTP_METHODS))
                    reason = f"must be '*' or one of {known}, got {method!r}"
                _invalid((index,), reason, method)
        return value

    @field_validator("headers", mode="before")
    @classmethod
    def _headers_shape(cls, value: object) -> object:
        """A mapping, or a list of one-entry mappings: the form of smi-sdk-go's v1alpha3
        and of OSM's demo manifests (``- user-agent: '.*'``), merged into one."""
        if not isinstance(value, list):
            return value
        merged: dict[object, object] = {}
        for index, item in enumerate(value):
            if not isinstance(item, dict) or len(item) != 1:
                _invalid(
                    (index,),
                    "each list entry must be one header, e.g. {user-agent: '.*Firefox.*'}",
                    item,
                )
            ((name, regex),) = item.items()
            if name in merged:
                _invalid((index,), f"header {name!r} is listed twice", item)
            merged[name] = regex
        return merged

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, regex in value.items():
            if _HEADER_NAME.fullmatch(name) is None:
                _invalid((name,), f"header name {name!r} is not an HTTP token", name)
            problem = regex_problem(regex)
            if problem is not None:
                _invalid((name,), problem, regex)
        return value


class HTTPRouteGroupSpec(StrictModel):
    matches: tuple[HTTPMatch, ...]

    @model_validator(mode="after")
    def _matches(self) -> HTTPRouteGroupSpec:
        if not self.matches:
            _invalid(("matches",), "must list at least one match", [])
        _unique(self.matches, lambda match: match.name, ("matches", "name"))
        return self


class HTTPRouteGroup(Resource[HTTPRouteGroupSpec]):
    """An SMI HTTPRouteGroup: named HTTP routes that TrafficTargets and TrafficSplits use."""

    def match_by_name(self, name: str) -> HTTPMatch | None:
        return next((match for match in self.spec.matches if match.name == name), None)


class TCPMatch(StrictModel):
    """The ports a TCPRoute allows; none means every port of the destination."""

    name: str | None = None
    ports: tuple[Port, ...] = ()


class TCPRouteSpec(StrictModel):
    matches: TCPMatch = Field(default_factory=TCPMatch)


class TCPRoute(Resource[TCPRouteSpec]):
    """An SMI TCPRoute: raw TCP traffic, on some ports (v1alpha4) or all of them."""

    spec: TCPRouteSpec = Field(default_factory=TCPRouteSpec)

    @model_validator(mode="before")
    @classmethod
    def _version(cls, data: Any) -> Any:
        reason = "TCPRoute port matches came with specs.smi-spec.io/v1alpha4"
        return _reject_absent(data, {SPECS_API_VERSIONS[0]: (("spec", "matches"), reason)})

    @field_validator("spec", mode="before")
    @classmethod
    def _empty_spec(cls, value: object) -> object:
        return {} if value is None else value


def register(registry: KindRegistry) -> None:
    registry.register("TrafficSplit", SPLIT_API_VERSIONS, TrafficSplit)
    registry.register("TrafficTarget", ACCESS_API_VERSIONS, TrafficTarget)
    registry.register("HTTPRouteGroup", SPECS_API_VERSIONS, HTTPRouteGroup)
    registry.register("TCPRoute", SPECS_API_VERSIONS, TCPRoute)

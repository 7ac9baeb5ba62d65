"""``MeshConfig``: the mesh-wide settings, in OSM's spelling or Trellis' own.

Two apiVersions, one meaning (ARCHITECTURE.md, "Conventions users will rely on"):

- ``config.openservicemesh.io/v1alpha2`` is OSM's MeshConfig, read as OSM users have it. It
  has many fields Trellis has no use for (sidecar images, feature flags, ...); unknown fields
  are ignored at every level, as OSM's own CRD would prune them. Fields Trellis reads must
  still have valid values.
- ``config.trellis.io/v1alpha1`` has the same field names plus what OSM lacks
  (``spec.trustDomain``); being Trellis' own, unknown fields are errors (usually typos).

Both give a :class:`MeshConfigSettings` through ``settings()``, so consumers do not care
which apiVersion a user wrote. Permissive mode and egress are off unless a MeshConfig turns
them on. Durations are Go duration strings (``"24h"``, ``"1h30m"``), see
:func:`parse_go_duration`.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, Final, Literal, NoReturn

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from trellis_common import ids
from trellis_common.documents.base import KindRegistry, Resource, StrictModel

OSM_API_VERSION: Final = "config.openservicemesh.io/v1alpha2"
TRELLIS_API_VERSION: Final = "config.trellis.io/v1alpha1"
DEFAULT_TRACING_PORT: Final = 9411  # Zipkin
DEFAULT_TRACING_ENDPOINT: Final = "/api/v2/spans"  # Zipkin v2 API

LogLevel = Literal["trace", "debug", "info", "warning", "error", "critical", "off"]
Bool = Annotated[bool, Strict()]

_NANOS: Final = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 micro sign
    "μs": 1_000,  # U+03BC Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_MAX_NANOS: Final = 2**63 - 1  # Go's time.Duration is an int64 of nanoseconds
_PART: Final = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]*)")
_LENIENT: Final = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


def parse_go_duration(text: str) -> timedelta:
    """Parse a Go ``time.ParseDuration`` string such as ``"24h"``, ``"1h30m"`` or ``"1.5s"``.

    Accepted as Go accepts it: an optional sign, then one or more ``<number><unit>`` with
    units ``ns``, ``us`` (or ``µs``), ``ms``, ``s``, ``m``, ``h`` and decimal fractions; a
    bare ``"0"``. Go's range applies (about 292 years). Python's ``timedelta`` counts
    microseconds, so nanoseconds are truncated toward zero. Raises ``ValueError`` saying
    what is wrong.
    """
    if not isinstance(text, str):
        raise ValueError(f"a duration must be a string such as '24h', got {text!r}")
    body = text[1:] if text[:1] in "+-" else text
    if body == "0":
        return timedelta(0)
    if not body:
        raise ValueError(f"invalid duration {text!r}: empty (use e.g. '24h', '1h30m', '90s')")
    nanos, index = 0, 0
    while index < len(body):
        part = _PART.match(body, index)
        assert part is not None  # every group may be empty
        whole, fraction, unit = part.group(1), part.group(2), part.group(3)
        if not whole and not fraction:
            raise ValueError(f"invalid duration {text!r}: expected a number at {body[index:]!r}")
        if not unit:
            raise ValueError(f"invalid duration {text!r}: missing unit after {part.group(0)!r}")
        if unit not in _NANOS:
            units = "ns, us, ms, s, m or h"
            raise ValueError(f"invalid duration {text!r}: unknown unit {unit!r} (use {units})")
        scale = _NANOS[unit]
        nanos += int(whole or "0") * scale
        if fraction:
            nanos += int(fraction) * scale // 10 ** len(fraction)
        if nanos > _MAX_NANOS:
            raise ValueError(f"invalid duration {text!r}: longer than Go allows (about 292 years)")
        index = part.end()
    sign = -1 if text[0] == "-" else 1
    return timedelta(microseconds=sign * (nanos // 1_000))


def _invalid(loc: tuple[str | int, ...], reason: str, value: object) -> NoReturn:
    """Fail validation at ``loc`` (relative to the model being validated) with ``reason``."""
    error = PydanticCustomError("invalid", "{reason}", {"reason": reason})
    details = InitErrorDetails(type=error, loc=loc, input=value)
    raise ValidationError.from_exception_data("document", [details])


# --- the spec, strict (Trellis) ---------------------------------------------------------------


Port = Annotated[int, Strict(), Field(ge=1, le=65535)]


class TrafficConfig(StrictModel):
    enable_permissive_traffic_policy_mode: Bool = Field(
        default=False, alias="enablePermissiveTrafficPolicyMode"
    )
    enable_egress: Bool = Field(default=False, alias="enableEgress")
    # a Trellis extension (OSM has no locality): proxies that report their locality prefer
    # their own locality's endpoints, and fail over outward, on services with outlier
    # detection (proxy-cp's translate/locality.py)
    enable_locality_failover: Bool = Field(default=False, alias="enableLocalityFailover")
    # left out of every injected pod's traffic redirection (OSM's global exclusion lists)
    inbound_port_exclusion_list: tuple[Port, ...] = Field(
        default=(), alias="inboundPortExclusionList"
    )
    outbound_port_exclusion_list: tuple[Port, ...] = Field(
        default=(), alias="outboundPortExclusionList"
    )
    outbound_ip_range_exclusion_list: tuple[str, ...] = Field(
        default=(), alias="outboundIPRangeExclusionList"
    )

    @field_validator("outbound_ip_range_exclusion_list")
    @classmethod
    def _ranges(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """IPv4 CIDRs (the init container writes IPv4 rules only), normalised."""
        found: list[str] = []
        for index, text in enumerate(value):
            try:
                network = ipaddress.ip_network(text, strict=False)
            except ValueError:
                _invalid((index,), f"must be an IPv4 CIDR such as '10.0.0.0/8', got {text!r}", text)
            if network.version != 4:
                _invalid((index,), f"{text!r} is IPv6: only IPv4 traffic is redirected", text)
            if str(network) not in found:
                found.append(str(network))
        return tuple(found)


class CertificateConfig(StrictModel):
    service_cert_validity_duration: timedelta | None = Field(
        default=None, alias="serviceCertValidityDuration"
    )

    @field_validator("service_cert_validity_duration", mode="plain")
    @classmethod
    def _duration(cls, value: object) -> timedelta | None:
        if value is None:
            return None
        if isinstance(value, timedelta):
            duration = value
        elif isinstance(value, str):
            duration = parse_go_duration(value)
        else:
            raise ValueError(f"must be a Go duration string such as '24h', got {value!r}")
        if duration <= timedelta(0):
            raise ValueError(f"must be positive, got {value!r}")
        return duration


class SidecarConfig(StrictModel):
    log_level: LogLevel | None = Field(default=None, alias="logLevel")

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.lower()
            return "warning" if value == "warn" else value or None
        return value


class TracingConfig(StrictModel):
    enable: Bool = False
    address: str | None = None
    port: Annotated[int, Strict()] = Field(default=DEFAULT_TRACING_PORT, ge=1, le=65535)
    endpoint: str = DEFAULT_TRACING_ENDPOINT

    @model_validator(mode="before")
    @classmethod
    def _zero_values_are_unset(cls, data: Any) -> Any:
        """OSM writes unset fields as Go zero values (``port: 0``, ``address: ""``)."""
        if isinstance(data, dict):
            unset = {key for key in ("address", "port", "endpoint") if data.get(key) in ("", 0)}
            return {key: value for key, value in data.items() if key not in unset}
        return data

    @model_validator(mode="after")
    def _address(self) -> TracingConfig:
        if self.enable and not self.address:
            _invalid(("address",), "is required when tracing is enabled", self.address)
        if not self.endpoint.startswith("/"):
            _invalid(("endpoint",), "must be a path starting with '/'", self.endpoint)
        return self


class ObservabilityConfig(StrictModel):
    tracing: TracingConfig = Field(default_factory=TracingConfig)


class FeatureFlags(StrictModel):
    enable_retry_policy: Bool = Field(default=False, alias="enableRetryPolicy")


class _SpecFields(StrictModel):
    feature_flags: FeatureFlags = Field(default_factory=FeatureFlags, alias="featureFlags")
    traffic: TrafficConfig = Field(default_factory=TrafficConfig)
    certificate: CertificateConfig = Field(default_factory=CertificateConfig)
    sidecar: SidecarConfig = Field(default_factory=SidecarConfig)
    observability: ObservabilityConfig = Field(default_factory=ObservabilityConfig)


class MeshConfigSpec(_SpecFields):
    """``config.trellis.io/v1alpha1``: OSM's field names plus ``trustDomain``."""

    trust_domain: str | None = Field(default=None, alias="trustDomain")

    @field_validator("trust_domain")
    @classmethod
    def _trust_domain(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return ids.validate_trust_domain(value)
        except ids.InvalidIdentifier as exc:
            raise ValueError(exc.reason) from None


# --- the same, lenient (OSM) ------------------------------------------------------------------


class _OsmTraffic(TrafficConfig):
    model_config = _LENIENT


class _OsmCertificate(CertificateConfig):
    model_config = _LENIENT


class _OsmSidecar(SidecarConfig):
    model_config = _LENIENT


class _OsmTracing(TracingConfig):
    model_config = _LENIENT


class _OsmFeatureFlags(FeatureFlags):
    model_config = _LENIENT


class _OsmObservability(ObservabilityConfig):
    model_config = _LENIENT
    tracing: _OsmTracing = Field(default_factory=_OsmTracing)


def unread_paths(raw: object, model: type[BaseModel], prefix: str) -> list[str]:
    """The paths of ``raw``'s keys that no field of ``model`` reads (into sub-models)."""
    if not isinstance(raw, dict):
        return []
    fields = {(f.alias or name): f for name, f in model.model_fields.items()}
    found = []
    for key, value in raw.items():
        field = fields.get(key)
        if field is None:
            found.append(f"{prefix}.{key}")
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            found += unread_paths(value, field.annotation, f"{prefix}.{key}")
    return found


class OsmMeshConfigSpec(_SpecFields):
    """``config.openservicemesh.io/v1alpha2``: the fields Trellis uses; the rest is accepted
    and listed as not applied (:meth:`OsmMeshConfig.not_applied`)."""

    model_config = _LENIENT
    feature_flags: _OsmFeatureFlags = Field(default_factory=_OsmFeatureFlags, alias="featureFlags")
    traffic: _OsmTraffic = Field(default_factory=_OsmTraffic)
    certificate: _OsmCertificate = Field(default_factory=_OsmCertificate)
    sidecar: _OsmSidecar = Field(default_factory=_OsmSidecar)
    observability: _OsmObservability = Field(default_factory=_OsmObservability)
    _unread: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_unread(cls, data: Any, handler: Any) -> Any:
        spec = handler(data)
        spec._unread = tuple(unread_paths(data, cls, "spec"))
        return spec


# --- what consumers read ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TracingSettings:
    address: str
    port: int = DEFAULT_TRACING_PORT
    endpoint: str = DEFAULT_TRACING_ENDPOINT


@dataclass(frozen=True, slots=True)
class MeshConfigSettings:
    """Mesh-wide settings, whichever apiVersion they came from; the defaults apply without any.

    ``None`` means "not configured": the consumer applies its own default.
    """

    permissive: bool = False
    egress: bool = False
    service_cert_validity: timedelta | None = None
    trust_domain: str | None = None
    sidecar_log_level: LogLevel | None = None
    tracing: TracingSettings | None = None
    retry_policy: bool = False  # featureFlags.enableRetryPolicy: OSM Retry policies apply
    locality_failover: bool = False  # traffic.enableLocalityFailover
    # traffic.*ExclusionList: the injector leaves these out of every pod's redirection
    inbound_port_exclusions: tuple[int, ...] = ()
    outbound_port_exclusions: tuple[int, ...] = ()
    outbound_ip_range_exclusions: tuple[str, ...] = ()


def _settings(spec: _SpecFields, trust_domain: str | None) -> MeshConfigSettings:
    tracing = spec.observability.tracing
    return MeshConfigSettings(
        permissive=spec.traffic.enable_permissive_traffic_policy_mode,
        egress=spec.traffic.enable_egress,
        service_cert_validity=spec.certificate.service_cert_validity_duration,
        trust_domain=trust_domain,
        sidecar_log_level=spec.sidecar.log_level,
        tracing=(
            TracingSettings(tracing.address, tracing.port, tracing.endpoint)
            if tracing.enable and tracing.address
            else None
        ),
        retry_policy=spec.feature_flags.enable_retry_policy,
        locality_failover=spec.traffic.enable_locality_failover,
        inbound_port_exclusions=spec.traffic.inbound_port_exclusion_list,
        outbound_port_exclusions=spec.traffic.outbound_port_exclusion_list,
        outbound_ip_range_exclusions=spec.traffic.outbound_ip_range_exclusion_list,
    )


class MeshConfig(Resource[MeshConfigSpec]):
    """Trellis' MeshConfig (``config.trellis.io/v1alpha1``)."""

    spec: MeshConfigSpec = Field(default_factory=MeshConfigSpec)

    def settings(self) -> MeshConfigSettings:
        return _settings(self.spec, self.spec.trust_domain)


class OsmMeshConfig(Resource[OsmMeshConfigSpec]):
    """OSM's MeshConfig (``config.openservicemesh.io/v1alpha2``); OSM has no trust domain."""

    spec: OsmMeshConfigSpec = Field(default_factory=OsmMeshConfigSpec)

    def settings(self) -> MeshConfigSettings:
        return _settings(self.spec, None)

    def not_applied(self) -> tuple[str, ...]:
        """The fields this MeshConfig sets that Trellis accepts but does not apply: OSM's
        that Trellis has no use for (sidecar images, ...)."""
        return tuple(sorted(self.spec._unread))


def register(registry: KindRegistry) -> None:
    registry.register("MeshConfig", (TRELLIS_API_VERSION,), MeshConfig)
    registry.register("MeshConfig", (OSM_API_VERSION,), OsmMeshConfig)

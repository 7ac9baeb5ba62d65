"""OSM's policy API (``policy.openservicemesh.io/v1alpha1``): ``Retry`` and
``UpstreamTrafficSetting``.

Field names, requirements and meanings are OSM v1.2's (``pkg/apis/policy/v1alpha1``, its CRD
``retries.policy.openservicemesh.io`` and ``pkg/catalog/retry.go``):

- ``spec.source`` is a ServiceAccount (kind, name and namespace are all required);
- ``spec.destinations`` are Services; OSM's code skips a destination of another kind with an
  error log, so it is reported here as the document's warning and skipped, not fatal;
- ``spec.retryPolicy.retryOn`` (required) is Envoy's ``retry_on`` list, comma-separated;
  ``numRetries`` counts retries (a request runs at most numRetries + 1 times; Envoy's default,
  1, when unset), ``perTryTimeout`` and ``retryBackoffBaseInterval`` are Go durations.

A policy applies only while MeshConfig ``spec.featureFlags.enableRetryPolicy`` is on (the
catalog checks that, as OSM does).

An ``UpstreamTrafficSetting`` (``pkg/apis/policy/v1alpha1/upstreamtrafficsetting.go``) names
its service by ``spec.host``; OSM's code (``GetUpstreamTrafficSettingByService``) matches only
``<service>.<namespace>.svc.<domain>`` of a service in the setting's own namespace, although
its doc comment also allows the bare name: the code is followed. Its ``connectionSettings``
become circuit breakers and timeouts on every client's cluster of that service.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Final, Literal

from pydantic import Field, Strict, field_validator, model_validator

from trellis_common import model
from trellis_common.documents.base import KindRegistry, Resource, StrictModel
from trellis_common.documents.meshconfig import parse_go_duration
from trellis_common.documents.smi import Namespace, ObjectName, _invalid

POLICY_API_VERSIONS: Final = ("policy.openservicemesh.io/v1alpha1",)
#: Envoy's retry_on conditions for HTTP (router filter docs, x-envoy-retry-on and
#: x-envoy-retry-grpc-on).
RETRY_ON: Final = frozenset(
    {
        "5xx",
        "gateway-error",
        "reset",
        "reset-before-request",
        "connect-failure",
        "envoy-ratelimited",
        "retriable-4xx",
        "refused-stream",
        "retriable-status-codes",
        "retriable-headers",
        "http3-post-connect-failure",
        "cancelled",
        "deadline-exceeded",
        "internal",
        "resource-exhausted",
        "unavailable",
    }
)


class RetrySource(StrictModel):
    kind: str
    name: ObjectName
    namespace: Namespace

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if value != "ServiceAccount":
            raise ValueError(f"must be 'ServiceAccount' (a Retry's source is one), got {value!r}")
        return value


class RetryDestination(StrictModel):
    kind: str
    name: ObjectName
    namespace: Namespace


def _duration(value: object) -> timedelta | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"must be a Go duration string such as '1s', got {value!r}")
    duration = parse_go_duration(value)
    if duration < timedelta(0):
        raise ValueError(f"must not be negative, got {value!r}")
    return duration


class RetryPolicySpec(StrictModel):
    retry_on: str = Field(alias="retryOn")
    num_retries: Annotated[int, Strict()] | None = Field(
        default=None, alias="numRetries", ge=0, le=2**32 - 1
    )
    per_try_timeout: timedelta | None = Field(default=None, alias="perTryTimeout")
    retry_backoff_base_interval: timedelta | None = Field(
        default=None, alias="retryBackoffBaseInterval"
    )

    @field_validator("retry_on")
    @classmethod
    def _retry_on(cls, value: str) -> str:
        conditions = [c.strip() for c in value.split(",")]
        if not value.strip() or any(not c for c in conditions):
            raise ValueError(f"must list Envoy retry conditions separated by commas, got {value!r}")
        unknown = [c for c in conditions if c not in RETRY_ON]
        if unknown:
            raise ValueError(
                f"unknown retry condition(s) {', '.join(map(repr, unknown))}; Envoy knows "
                + ", ".join(sorted(RETRY_ON))
            )
        return ",".join(conditions)

    @field_validator("per_try_timeout", "retry_backoff_base_interval", mode="plain")
    @classmethod
    def _durations(cls, value: object) -> timedelta | None:
        return _duration(value)


class RetrySpec(StrictModel):
    source: RetrySource
    destinations: tuple[RetryDestination, ...] = Field(min_length=1)
    retry_policy: RetryPolicySpec = Field(alias="retryPolicy")


class Retry(Resource[RetrySpec]):
    """An OSM Retry policy: retries of outbound requests from one service account to some
    services."""

    def source_account(self) -> model.ServiceAccount:
        return model.ServiceAccount(self.spec.source.namespace, self.spec.source.name)

    def destination_services(self) -> tuple[model.MeshService, ...]:
        """The destinations of kind Service (OSM skips the others)."""
        return tuple(
            model.MeshService(d.namespace, d.name)
            for d in self.spec.destinations
            if d.kind == "Service"
        )

    def skipped(self) -> tuple[str, ...]:
        """Why some destinations are skipped (not Services), for the document's status."""
        return tuple(
            f"spec.destinations[{i}]: kind {d.kind!r} is not 'Service'; skipped, as OSM does"
            for i, d in enumerate(self.spec.destinations)
            if d.kind != "Service"
        )


UInt32 = Annotated[int, Strict(), Field(ge=0, le=2**32 - 1)]


class TCPConnectionSettings(StrictModel):
    max_connections: UInt32 | None = Field(default=None, alias="maxConnections")
    connect_timeout: timedelta | None = Field(default=None, alias="connectTimeout")

    @field_validator("connect_timeout", mode="plain")
    @classmethod
    def _timeout(cls, value: object) -> timedelta | None:
        duration = _duration(value)
        if duration is not None and duration <= timedelta(0):
            raise ValueError(f"must be positive, got {value!r}")
        return duration


class HTTPConnectionSettings(StrictModel):
    max_requests: UInt32 | None = Field(default=None, alias="maxRequests")
    max_requests_per_connection: UInt32 | None = Field(
        default=None, alias="maxRequestsPerConnection"
    )
    max_pending_requests: UInt32 | None = Field(default=None, alias="maxPendingRequests")
    max_retries: UInt32 | None = Field(default=None, alias="maxRetries")


class ConnectionSettings(StrictModel):
    tcp: TCPConnectionSettings | None = None
    http: HTTPConnectionSettings | None = None


class HeaderValue(StrictModel):
    name: str = Field(min_length=1)
    value: str


class LocalRateLimit(StrictModel):
    """A local rate limit as OSM writes it: ``requests`` (HTTP) or ``connections`` (TCP) per
    ``unit``, plus ``burst``; a limited request gets ``responseStatusCode`` (429 by default)
    and ``responseHeadersToAdd``. The destination's own sidecars enforce it (inbound)."""

    requests: UInt32 | None = None
    connections: UInt32 | None = None
    unit: Literal["second", "minute", "hour"]
    burst: UInt32 = 0
    response_status_code: Annotated[int, Strict(), Field(ge=400, le=599)] | None = Field(
        default=None, alias="responseStatusCode"
    )
    response_headers_to_add: tuple[HeaderValue, ...] = Field(
        default=(), alias="responseHeadersToAdd"
    )


def _needs(limit: LocalRateLimit | None, field: str, where: tuple[str, ...]) -> None:
    if limit is not None and getattr(limit, field) is None:
        _invalid((*where, field), "is required", None)


class LocalRateLimits(StrictModel):
    tcp: LocalRateLimit | None = None
    http: LocalRateLimit | None = None

    @model_validator(mode="after")
    def _counted(self) -> LocalRateLimits:
        _needs(self.tcp, "connections", ("tcp",))  # OSM's CRD requires them
        _needs(self.http, "requests", ("http",))
        return self


class RateLimit(StrictModel):
    local: LocalRateLimits | None = None
    global_: dict[str, object] | None = Field(default=None, alias="global")


class RouteRateLimit(StrictModel):
    local: LocalRateLimit | None = None
    global_: dict[str, object] | None = Field(default=None, alias="global")

    @model_validator(mode="after")
    def _counted(self) -> RouteRateLimit:
        _needs(self.local, "requests", ("local",))
        return self


class HTTPRouteSetting(StrictModel):
    path: str = Field(min_length=1)
    rate_limit: RouteRateLimit | None = Field(default=None, alias="rateLimit")


Percent = Annotated[int, Strict(), Field(ge=0, le=100)]


class OutlierDetection(StrictModel):
    """Passive health checking of the service's endpoints, by each client's sidecar.

    OSM v1.2 has no such field; Trellis takes Istio's ``DestinationRule`` names for it
    (``consecutive5xxErrors``, ``consecutiveGatewayErrors``, ``interval``,
    ``baseEjectionTime``, ``maxEjectionPercent``), so a field an Istio user knows means
    what it means there. An endpoint that answers that many 5xx (or 502/503/504, or fails
    to connect) in a row is ejected for ``baseEjectionTime`` times the number of its
    ejections; at most ``maxEjectionPercent`` of the endpoints are out at once."""

    consecutive_5xx_errors: UInt32 | None = Field(default=None, alias="consecutive5xxErrors")
    consecutive_gateway_errors: UInt32 | None = Field(
        default=None, alias="consecutiveGatewayErrors"
    )
    interval: timedelta | None = None
    base_ejection_time: timedelta | None = Field(default=None, alias="baseEjectionTime")
    max_ejection_percent: Percent | None = Field(default=None, alias="maxEjectionPercent")

    @field_validator("interval", "base_ejection_time", mode="plain")
    @classmethod
    def _positive(cls, value: object) -> timedelta | None:
        duration = _duration(value)
        if duration is not None and duration <= timedelta(0):
            raise ValueError(f"must be positive, got {value!r}")
        return duration

    @model_validator(mode="after")
    def _something(self) -> OutlierDetection:
        if self.consecutive_5xx_errors is None and self.consecutive_gateway_errors is None:
            _invalid(
                ("consecutive5xxErrors",),
                "set consecutive5xxErrors or consecutiveGatewayErrors: nothing would eject",
                None,
            )
        return self


class UpstreamTrafficSettingSpec(StrictModel):
    host: str = Field(min_length=1)
    connection_settings: ConnectionSettings | None = Field(default=None, alias="connectionSettings")
    outlier_detection: OutlierDetection | None = Field(default=None, alias="outlierDetection")
    rate_limit: RateLimit | None = Field(default=None, alias="rateLimit")
    http_routes: tuple[HTTPRouteSetting, ...] = Field(default=(), alias="httpRoutes")


class UpstreamTrafficSetting(Resource[UpstreamTrafficSettingSpec]):
    """Settings of the traffic to one service, applied by its clients' sidecars."""

    def service(self) -> model.MeshService | None:
        """The service ``spec.host`` names (OSM: ``<service>.<namespace>.svc.<domain>`` in
        this setting's namespace), or None."""
        labels = self.spec.host.lower().rstrip(".").split(".")
        if len(labels) < 4 or labels[2] != "svc" or labels[1] != self.metadata.namespace:
            return None
        try:
            return model.MeshService(labels[1], labels[0])
        except ValueError:
            return None

    def not_applied(self) -> tuple[str, ...]:
        """What this setting has that Trellis reads but does not apply: global rate limits
        (an external rate limit service; OSM v1.2 had none either)."""
        found = []
        if self.spec.rate_limit is not None and self.spec.rate_limit.global_ is not None:
            found.append("spec.rateLimit.global")
        for index, route in enumerate(self.spec.http_routes):
            if route.rate_limit is not None and route.rate_limit.global_ is not None:
                found.append(f"spec.httpRoutes[{index}].rateLimit.global")
        return tuple(found)


def register(registry: KindRegistry) -> None:
    registry.register("Retry", POLICY_API_VERSIONS, Retry)
    registry.register("UpstreamTrafficSetting", POLICY_API_VERSIONS, UpstreamTrafficSetting)

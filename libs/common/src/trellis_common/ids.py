"""Identifiers of the mesh, and the one place that decides which spellings are valid.

Every service speaks about the same few names: a proxy's id, a service's name and
namespace, a service account's SPIFFE ID, the common names put in certificates. When each
service checks them its own way, one accepts what another refuses, and the failure surfaces
far from its cause (an Envoy refusing a certificate, a TrafficTarget matching nothing). So
the rules live here, checked once, with errors that say which field is wrong and why:

- names are DNS-1123 labels or subdomains, as in Kubernetes;
- a proxy certificate's CN is ``<proxy-uuid>.<service>.<namespace>`` (OSM design, "Proxy TLS
  certificate") and must fit the 64 characters X.509 allows a common name (ub-common-name),
  which leaves 26 characters for service and namespace together;
- a service account's identity is ``spiffe://<trust-domain>/ns/<ns>/sa/<sa>``;
- a service certificate's CN is ``<service>.<namespace>.svc.<trust-domain>`` and its DNS SANs
  are the names a client may use for the service.

Everything here is pure: no I/O, no settings. ``model`` builds on it, not the other way
round: functions that need a service take anything with ``namespace`` and ``name``.
"""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, NewType, Protocol

ProxyId = NewType("ProxyId", str)
"""A proxy's id: a UUID in canonical form (lower case, hyphenated)."""

TypeUrl = NewType("TypeUrl", str)
"""An xDS resource type URL, e.g. ``type.googleapis.com/envoy.config.cluster.v3.Cluster``."""

MAX_COMMON_NAME_LENGTH: Final = 64  # X.509 ub-common-name (RFC 5280)
DNS_LABEL_MAX_LENGTH: Final = 63
DNS_SUBDOMAIN_MAX_LENGTH: Final = 253
TRUST_DOMAIN_MAX_LENGTH: Final = 255  # SPIFFE ID spec, section 2.1
DEFAULT_CLUSTER_DOMAIN: Final = "cluster.local"

_LABEL_PATTERN: Final = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL: Final = re.compile(_LABEL_PATTERN)
_DNS_SUBDOMAIN: Final = re.compile(rf"{_LABEL_PATTERN}(\.{_LABEL_PATTERN})*")
_TRUST_DOMAIN: Final = re.compile(r"[a-z0-9._-]+")
_UUID_LENGTH: Final = 36
_SPIFFE_SCHEME: Final = "spiffe://"

_PROXY_CN_FIELD: Final = "proxy common name"
_PROXY_CN_KIND: Final = "'<proxy-uuid>.<service>.<namespace>' common name"
_SERVICE_CN_FIELD: Final = "service common name"
_SERVICE_CN_KIND: Final = "'<service>.<namespace>.svc.<trust-domain>' common name"
_SPIFFE_FIELD: Final = "SPIFFE ID"
_SPIFFE_KIND: Final = "'spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>' URI"


class InvalidIdentifier(ValueError):
    """An identifier is not spelled as it must be.

    ``field`` names what was being checked ("service name"), ``value`` is the bad text and
    ``reason`` says what rule it breaks.
    """

    def __init__(self, field: str, value: str, reason: str, kind: str = "identifier") -> None:
        self.field = field
        self.value = value
        self.reason = reason
        self.kind = kind
        super().__init__(f"{field} {value!r} is not a valid {kind}: {reason}")

    def __reduce__(self) -> tuple[type[InvalidIdentifier], tuple[str, str, str, str]]:
        return type(self), (self.field, self.value, self.reason, self.kind)


class NamespacedName(Protocol):
    """Anything named within a namespace, such as ``model.MeshService``."""

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...


def validate_dns_label(value: str, field: str) -> str:
    """Return ``value`` if it is an RFC 1123 label, else raise ``InvalidIdentifier``."""
    reason = _label_problem(value)
    if reason is not None:
        raise InvalidIdentifier(field, value, reason, "DNS-1123 label")
    return value


def validate_dns_subdomain(value: str, field: str) -> str:
    """Return ``value`` if it is an RFC 1123 subdomain (dot-separated labels), else raise."""
    reason = _subdomain_problem(value)
    if reason is not None:
        raise InvalidIdentifier(field, value, reason, "DNS-1123 subdomain")
    return value


# Every model object checks its names when it is made, and a catalog build makes tens of
# thousands from a few thousand distinct names: the verdicts are cached (bounded).
@functools.lru_cache(maxsize=16384)
def _label_problem(value: str) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > DNS_LABEL_MAX_LENGTH:
        return f"must be no more than {DNS_LABEL_MAX_LENGTH} characters, got {len(value)}"
    if _DNS_LABEL.fullmatch(value) is None:
        return (
            "must consist of lower case alphanumeric characters or '-', "
            "and must start and end with an alphanumeric character"
        )
    return None


@functools.lru_cache(maxsize=16384)
def _subdomain_problem(value: str) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > DNS_SUBDOMAIN_MAX_LENGTH:
        return f"must be no more than {DNS_SUBDOMAIN_MAX_LENGTH} characters, got {len(value)}"
    if _DNS_SUBDOMAIN.fullmatch(value) is None:
        return (
            "must consist of lower case alphanumeric characters, '-' or '.', "
            "and each dot-separated label must start and end with an alphanumeric character"
        )
    if any(len(label) > DNS_LABEL_MAX_LENGTH for label in value.split(".")):
        return f"each dot-separated label must be no more than {DNS_LABEL_MAX_LENGTH} characters"
    return None


def validate_trust_domain(value: str, field: str = "trust domain") -> str:
    """Return ``value`` if it is a SPIFFE trust domain name, else raise ``InvalidIdentifier``."""
    kind = "SPIFFE trust domain"
    if not value:
        raise InvalidIdentifier(field, value, "must not be empty", kind)
    if len(value) > TRUST_DOMAIN_MAX_LENGTH:
        reason = f"must be no more than {TRUST_DOMAIN_MAX_LENGTH} characters, got {len(value)}"
        raise InvalidIdentifier(field, value, reason, kind)
    if _TRUST_DOMAIN.fullmatch(value) is None:
        reason = "must consist of lower case letters, digits, '.', '-' or '_'"
        raise InvalidIdentifier(field, value, reason, kind)
    return value


def validate_proxy_id(value: str, field: str = "proxy id") -> ProxyId:
    """Return ``value`` as a ``ProxyId`` if it is a UUID in canonical form, else raise."""
    kind = "UUID"
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        reason = "must be a UUID such as '123e4567-e89b-42d3-a456-426614174000'"
        raise InvalidIdentifier(field, value, reason, kind) from None
    if str(parsed) != value:
        reason = f"must be in canonical form (lower case, hyphenated): {str(parsed)!r}"
        raise InvalidIdentifier(field, value, reason, kind)
    return ProxyId(value)


@contextmanager
def _reported_as(field: str, value: str, kind: str) -> Iterator[None]:
    """Re-raise a part's ``InvalidIdentifier`` as one about the whole ``value``."""
    try:
        yield
    except InvalidIdentifier as err:
        if err.field == field:
            raise
        raise InvalidIdentifier(field, value, str(err), kind) from err


def _check_common_name_length(text: str, field: str, kind: str, room: str) -> None:
    if len(text) > MAX_COMMON_NAME_LENGTH:
        reason = (
            f"must be no more than {MAX_COMMON_NAME_LENGTH} characters (X.509 ub-common-name), "
            f"got {len(text)}; {room}"
        )
        raise InvalidIdentifier(field, text, reason, kind)


@dataclass(frozen=True, slots=True)
class ProxyCommonName:
    """The CN of a proxy certificate: ``<proxy-uuid>.<service>.<namespace>``."""

    proxy_id: ProxyId
    service: str
    namespace: str

    def __post_init__(self) -> None:
        validate_proxy_id(self.proxy_id)
        validate_dns_label(self.service, "service name")
        validate_dns_label(self.namespace, "namespace")
        room = MAX_COMMON_NAME_LENGTH - _UUID_LENGTH - 2
        _check_common_name_length(
            self.format(),
            _PROXY_CN_FIELD,
            _PROXY_CN_KIND,
            f"service name and namespace together may use at most {room} characters",
        )

    @classmethod
    def new(cls, service: str, namespace: str) -> ProxyCommonName:
        """A common name for a new proxy of ``service`` in ``namespace``, with a fresh uuid4."""
        return cls(ProxyId(str(uuid.uuid4())), service, namespace)

    @classmethod
    def parse(cls, text: str) -> ProxyCommonName:
        parts = text.split(".")
        if len(parts) != 3:
            reason = f"must have 3 dot-separated parts, got {len(parts)}"
            raise InvalidIdentifier(_PROXY_CN_FIELD, text, reason, _PROXY_CN_KIND)
        with _reported_as(_PROXY_CN_FIELD, text, _PROXY_CN_KIND):
            return cls(ProxyId(parts[0]), parts[1], parts[2])

    def format(self) -> str:
        return f"{self.proxy_id}.{self.service}.{self.namespace}"

    def __str__(self) -> str:
        return self.format()


@dataclass(frozen=True, slots=True)
class SpiffeId:
    """A service account's identity: ``spiffe://<trust-domain>/ns/<ns>/sa/<sa>``."""

    trust_domain: str
    namespace: str
    service_account: str

    def __post_init__(self) -> None:
        validate_trust_domain(self.trust_domain)
        validate_dns_label(self.namespace, "namespace")
        validate_dns_subdomain(self.service_account, "service account")

    @classmethod
    def parse(cls, text: str) -> SpiffeId:
        if not text.startswith(_SPIFFE_SCHEME):
            reason = f"must start with {_SPIFFE_SCHEME!r} (lower case)"
            raise InvalidIdentifier(_SPIFFE_FIELD, text, reason, _SPIFFE_KIND)
        trust_domain, slash, path = text[len(_SPIFFE_SCHEME) :].partition("/")
        segments = path.split("/")
        with _reported_as(_SPIFFE_FIELD, text, _SPIFFE_KIND):
            validate_trust_domain(trust_domain)
            if len(segments) != 4 or segments[0] != "ns" or segments[2] != "sa":
                got = f"'/{path}'" if slash else "no path"
                reason = f"path must be '/ns/<namespace>/sa/<service-account>', got {got}"
                raise InvalidIdentifier(_SPIFFE_FIELD, text, reason, _SPIFFE_KIND)
            return cls(trust_domain, segments[1], segments[3])

    @property
    def uri(self) -> str:
        return f"{_SPIFFE_SCHEME}{self.trust_domain}/ns/{self.namespace}/sa/{self.service_account}"

    def __str__(self) -> str:
        return self.uri


@dataclass(frozen=True, slots=True)
class ServiceCommonName:
    """The CN of a service certificate: ``<service>.<namespace>.svc.<trust-domain>``."""

    service: str
    namespace: str
    trust_domain: str

    def __post_init__(self) -> None:
        validate_dns_label(self.service, "service name")
        validate_dns_label(self.namespace, "namespace")
        validate_trust_domain(self.trust_domain)
        _check_common_name_length(
            self.format(),
            _SERVICE_CN_FIELD,
            _SERVICE_CN_KIND,
            "use shorter service, namespace or trust domain names",
        )

    @classmethod
    def for_service(cls, service: NamespacedName, trust_domain: str) -> ServiceCommonName:
        return cls(service.name, service.namespace, trust_domain)

    @classmethod
    def parse(cls, text: str) -> ServiceCommonName:
        """The inverse of :meth:`format`; the trust domain is everything after ``.svc.``."""
        parts = text.split(".")
        if len(parts) < 4 or parts[2] != "svc":
            reason = "must have the form '<service>.<namespace>.svc.<trust-domain>'"
            raise InvalidIdentifier(_SERVICE_CN_FIELD, text, reason, _SERVICE_CN_KIND)
        with _reported_as(_SERVICE_CN_FIELD, text, _SERVICE_CN_KIND):
            return cls(parts[0], parts[1], ".".join(parts[3:]))

    def format(self) -> str:
        return f"{self.service}.{self.namespace}.svc.{self.trust_domain}"

    def __str__(self) -> str:
        return self.format()


def service_dns_names(
    service: NamespacedName, cluster_domain: str = DEFAULT_CLUSTER_DOMAIN
) -> tuple[str, ...]:
    """The DNS names clients may use for ``service``: the SANs of its certificate."""
    validate_dns_subdomain(cluster_domain, "cluster domain")
    name = validate_dns_label(service.name, "service name")
    namespace = validate_dns_label(service.namespace, "namespace")
    return (
        name,
        f"{name}.{namespace}",
        f"{name}.{namespace}.svc",
        f"{name}.{namespace}.svc.{cluster_domain}",
    )

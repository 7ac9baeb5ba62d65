"""Typed errors of the certificate domain; transports map them to status codes."""

from __future__ import annotations


class CertificateError(Exception):
    """Base class of every error the certmanager domain raises."""


class InvalidRequest(CertificateError, ValueError):
    """A request field is wrong; ``field`` names it (gRPC INVALID_ARGUMENT, HTTP 422)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class NotFound(CertificateError, LookupError):
    """No certificate on record under that common name."""

    def __init__(self, common_name: str) -> None:
        super().__init__(f"no certificate with common name {common_name!r}")
        self.common_name = common_name


class CAError(CertificateError):
    """The CA cannot be loaded or would be replaced without the operator saying so."""


class PlantedCA(CAError):
    """The store holds a CA that is not this mesh's: refused, never adopted."""


class ControlPlaneNamespace(CertificateError):
    """No service certificate is issued in the control plane's namespace: a name there
    (``<component>.trellis-system.svc``, ``spiffe://<td>/ns/trellis-system/sa/<component>``)
    is a component's identity, which only the component's own join or renewal gives it
    (gRPC PERMISSION_DENIED). ``reason`` is the counted label."""

    reason = "control_plane_namespace"

    def __init__(self, namespace: str, service: str) -> None:
        super().__init__(
            f"no service certificate is issued in {namespace!r}, the control plane's "
            f"namespace (asked for {namespace}/{service}): its names are the components' "
            "identities, which each component gets by joining (its component certificate "
            "is also what it serves)"
        )
        self.namespace = namespace
        self.service = service


class StoreUnavailable(CertificateError):
    """The durable store (Redis) did not take a write; nothing was changed. Retry later."""


class ClaimLost(StoreUnavailable):
    """Another replica took over a common name while this one held it (it stalled past the
    claim's lifetime): this replica's write was refused and nothing was changed; asked
    again, the request finds the other replica's certificate (:mod:`..claims`)."""


class Deposed(StoreUnavailable):
    """A rotation pass's write refused: a newer leader took the rotation fence since this
    replica took it (:mod:`..claims`). Nothing was changed; the pass stops."""


class NotRevocable(CertificateError):
    """Only proxy certificates are revoked; a service certificate is rotated instead."""

    def __init__(self, common_name: str) -> None:
        super().__init__(
            f"{common_name!r} is a service certificate: only proxy certificates are revoked "
            "(rotate a service certificate instead: `trellis certs rotate`)"
        )
        self.common_name = common_name


class StaleCertificate(CertificateError):
    """A renewal named a serial that is no longer the common name's current certificate
    (it was rotated or renewed meanwhile): gRPC FAILED_PRECONDITION."""

    def __init__(self, common_name: str, serial: int, current: int) -> None:
        super().__init__(
            f"the certificate of {common_name} with serial {serial:x} is not its current one "
            f"(serial {current:x}): renew with the current certificate"
        )
        self.common_name = common_name

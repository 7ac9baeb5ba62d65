"""What each ``EndpointsProvider`` RPC accepts: checked values, or ``InvalidField``.

A service is named by its namespace (a DNS label) and a name that is either a registered
service's (a DNS label) or one of a ServiceEntry's hosts: a DNS name, possibly a wildcard
``*.example.com``. A name that can be neither is refused, not looked up.
"""

from __future__ import annotations

from typing import Final

from trellis_api import endpoints_pb2 as pb
from trellis_common import ids
from trellis_endpoints_vm.domain.views import ServiceKey
from trellis_runtime import grpcrequests as check

_WILDCARD: Final = "*."


def _service_name(field: str, value: str) -> str:
    host = value.removeprefix(_WILDCARD) if value != _WILDCARD else value
    try:
        ids.validate_dns_subdomain(check.required(field, value) and host, field)
    except ids.InvalidIdentifier as exc:
        what = "a service name or host (a DNS-1123 subdomain, optionally after '*.')"
        raise check.InvalidField(
            field, f"{check.quoted(value)} is not {what}: {exc.reason}"
        ) from None
    return value


def namespace_filter(request: pb.ListServicesRequest) -> str:
    return check.dns_label("namespace", request.namespace, optional=True)


def service_key(request: pb.GetServiceRequest) -> ServiceKey:
    if not request.HasField("service"):
        raise check.InvalidField("service", "is required")
    namespace = check.dns_label("service.namespace", request.service.namespace)
    return ServiceKey(namespace, _service_name("service.name", request.service.name))

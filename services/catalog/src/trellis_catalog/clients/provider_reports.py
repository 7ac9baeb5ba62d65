"""Validating what an endpoints provider reports, record by record, where it enters.

A provider is another service, possibly older or broken, so the catalog checks each
service it reports (:func:`from_proto`) before the service index sees it: a service whose
name or ports fail is refused whole (:class:`InvalidReport`, with the reason), an endpoint
that fails is left out and reported, and the rest flows.

A provider keys a ServiceEntry's services by host (``shop/payments.example.com``); the
catalog names services by DNS label, so a host that is not one is mapped to its
ServiceEntry (``shop/payments``), whose hosts it joins.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

from trellis_api import endpoints_pb2 as pb
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_common import ids
from trellis_common.memo import Members

_LOCATION = {pb.MESH_INTERNAL: "MESH_INTERNAL", pb.MESH_EXTERNAL: "MESH_EXTERNAL"}
_RESOLUTION = {
    pb.STATIC: "STATIC",
    pb.DNS: "DNS",
    pb.DNS_ROUND_ROBIN: "DNS_ROUND_ROBIN",
    pb.NONE: "NONE",
}
_ENTRY = "ServiceEntry "


class InvalidReport(ValueError):
    """A provider's report of one service that the catalog cannot take; says why."""


def service_name(namespace: str, key: str, source: str) -> str:
    """The catalog's name for a provider's service key (a DNS label, or a host)."""
    ids.validate_dns_label(namespace, "service.namespace")
    try:
        return ids.validate_dns_label(key, "service.name")
    except ids.InvalidIdentifier as exc:
        if not source.startswith(_ENTRY):
            raise InvalidReport(str(exc)) from None
    entry_namespace, _, entry = source.removeprefix(_ENTRY).partition("/")
    if entry_namespace != namespace:
        raise InvalidReport(
            f"service {namespace}/{key}: its ServiceEntry {entry_namespace}/{entry} is in "
            "another namespace"
        )
    try:
        return ids.validate_dns_label(entry, "ServiceEntry name")
    except ids.InvalidIdentifier as exc:
        raise InvalidReport(f"service {namespace}/{key}: {exc}") from None


def _endpoint(message: pb.Endpoint, where: str, provider: str) -> ProvidedEndpoint:
    if message.service_account:
        try:
            ids.validate_dns_subdomain(message.service_account, "endpoint.service_account")
        except ids.InvalidIdentifier as exc:
            raise InvalidReport(f"{where}, endpoint {message.address}: {exc}") from None
    if not message.address:
        raise InvalidReport(f"{where}: an endpoint has no address")
    for name, number in message.ports.items():
        if not 0 < number < 65536:
            raise InvalidReport(
                f"{where}, endpoint {message.address}: port {name!r} is {number}, not in 1-65535"
            )
    return ProvidedEndpoint(
        address=message.address,
        ports=tuple(sorted(message.ports.items())),
        labels=tuple(sorted(message.labels.items())),
        locality=message.locality,
        weight=message.weight,
        service_account=message.service_account,
        workload=message.workload,
        provider=provider,
    )


def _endpoint_or_reason(message: pb.Endpoint, context: tuple[str, str]) -> ProvidedEndpoint | str:
    where, provider = context
    try:
        return _endpoint(message, where, provider)
    except InvalidReport as exc:
        return str(exc)


#: an endpoint's bytes, its memo key (C calls it: no Python frame per endpoint)
_serialized: Callable[[pb.Endpoint], bytes] = operator.methodcaller(
    "SerializeToString", deterministic=True
)


#: Endpoints by (provider, namespace, service key), kept while their bytes are the same
#: (:class:`~trellis_common.memo.Members`): a report after one endpoint of 200 moved
#: validates and converts one, and the endpoints kept are the same objects as before.
Converted = Members[tuple[str, str, str], pb.Endpoint, ProvidedEndpoint | str]


def converted() -> Converted:
    """A memo for :func:`from_proto`, one per follower of providers."""
    return Members(_endpoint_or_reason, key=_serialized)


def from_proto(
    provider: str,
    message: pb.ServiceEndpoints,
    on_bad_endpoint: Callable[[str], None],
    memo: Converted | None = None,
) -> ProvidedService:
    """Validate and convert one service's report; raises :class:`InvalidReport`.

    An endpoint that fails is left out (``on_bad_endpoint`` gets the reason); a service
    whose name or ports fail is refused whole.
    """
    info = message.info
    namespace, key = info.service.namespace, info.service.name
    where = f"service {namespace}/{key}"
    try:
        name = service_name(namespace, key, info.source)
    except ids.InvalidIdentifier as exc:
        raise InvalidReport(f"{where}: {exc}") from None
    for port in info.ports:
        if not 0 < port.number < 65536:
            raise InvalidReport(f"{where}: port {port.name!r} is {port.number}, not in 1-65535")
    context = (where, provider)
    converted = (
        memo.convert((provider, namespace, key), message.endpoints, context)
        if memo is not None
        else [_endpoint_or_reason(m, context) for m in message.endpoints]
    )
    if str in set(map(type, converted)):  # an endpoint refused: it is left out, and said
        endpoints = []
        for found in converted:
            if isinstance(found, str):
                on_bad_endpoint(found)
            else:
                endpoints.append(found)
    else:
        endpoints = converted  # type: ignore[assignment]  # no reason among them
    return ProvidedService(
        provider=provider,
        namespace=namespace,
        name=name,
        key=key,
        ports=tuple((p.name, p.number, p.protocol, p.target_port) for p in info.ports),
        endpoints=tuple(endpoints),
        hosts=tuple(info.hosts),
        addresses=tuple(info.addresses),
        location=_LOCATION.get(info.location, "MESH_INTERNAL"),
        resolution=_RESOLUTION.get(info.resolution, "STATIC"),
        export_to=tuple(info.export_to),
        subject_alt_names=tuple(info.subject_alt_names),
        source=info.source,
    )

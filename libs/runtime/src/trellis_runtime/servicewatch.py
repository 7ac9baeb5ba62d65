"""The answers of an endpoints provider's ``WatchServices`` stream, as both providers give them.

The first answer lists every service (``full``); each later one carries the services whose
keys the provider's :class:`~trellis_common.changefeed.Watch` took, as they are when the
answer is written, and those gone (``removed``), with the provider's revision. A key outside
the caller's namespace (when it asked for one) is left out, and an answer with nothing in it
is not sent. The provider says how a key reads: its namespace and name, and its service now
(None: gone), as a message or already serialized. A later answer is sent serialized, joined
from its services' bytes: a service of 200 endpoints is not copied into it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from trellis_api import endpoints_pb2 as pb
from trellis_common import messages
from trellis_common.changefeed import Watch

K = TypeVar("K")


async def service_changes(
    watch: Watch[K],
    listed: pb.ListServicesResponse,
    *,
    provider: str,
    namespace: str,
    name_of: Callable[[K], tuple[str, str]],
    service_of: Callable[[K], pb.ServiceEndpoints | bytes | None],
    revision: Callable[[], int],
) -> AsyncIterator[pb.ServiceChanges | bytes]:
    """The stream's answers: ``listed`` (taken after ``watch`` began, so nothing falls
    between), then one per batch of changed keys (a serialized ``ServiceChanges``), for as
    long as the caller reads."""
    yield pb.ServiceChanges(
        full=True, services=listed.services, revision=listed.revision, provider=provider
    )
    while True:
        services: list[bytes] = []
        removed: list[pb.ServiceRef] = []
        for key in await watch.next():
            key_namespace, name = name_of(key)
            if namespace and key_namespace != namespace:
                continue
            found = service_of(key)
            if found is None:
                removed.append(pb.ServiceRef(namespace=key_namespace, name=name))
            else:
                services.append(found if isinstance(found, bytes) else found.SerializeToString())
        if services or removed:
            head = pb.ServiceChanges(provider=provider, removed=removed, revision=revision())
            joined = (messages.field(_SERVICES, service) for service in services)
            yield head.SerializeToString() + b"".join(joined)


#: ``ServiceChanges.services``' field number
_SERVICES = pb.ServiceChanges.DESCRIPTOR.fields_by_name["services"].number

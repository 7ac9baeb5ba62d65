"""The answers of an endpoints provider's ``WatchServices`` stream, as both providers give them.

The first answer lists every service (``full``); each later one carries the services whose
keys the provider's :class:`~trellis_common.changefeed.Watch` took, as they are when the
answer is written, and those gone (``removed``), with the provider's revision. A key outside
the caller's namespace (when it asked for one) is left out, and an answer with nothing in it
is not sent. The provider says how a key reads: its namespace and name, and its service now
(None: gone).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from trellis_api import endpoints_pb2 as pb
from trellis_common.changefeed import Watch

K = TypeVar("K")


async def service_changes(
    watch: Watch[K],
    listed: pb.ListServicesResponse,
    *,
    provider: str,
    namespace: str,
    name_of: Callable[[K], tuple[str, str]],
    service_of: Callable[[K], pb.ServiceEndpoints | None],
    revision: Callable[[], int],
) -> AsyncIterator[pb.ServiceChanges]:
    """The stream's answers: ``listed`` (taken after ``watch`` began, so nothing falls
    between), then one per batch of changed keys, for as long as the caller reads."""
    yield pb.ServiceChanges(
        full=True, services=listed.services, revision=listed.revision, provider=provider
    )
    while True:
        answer = pb.ServiceChanges(provider=provider)
        for key in await watch.next():
            key_namespace, name = name_of(key)
            if namespace and key_namespace != namespace:
                continue
            found = service_of(key)
            if found is None:
                answer.removed.add(namespace=key_namespace, name=name)
            else:
                answer.services.append(found)
        answer.revision = revision()
        if answer.services or answer.removed:
            yield answer

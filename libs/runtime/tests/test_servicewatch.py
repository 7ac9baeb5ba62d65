"""An endpoints provider's watch answers (``servicewatch``): the listing, then each batch of
changed keys as one serialized answer, whether a provider gives a service as a message or
as its bytes."""

from __future__ import annotations

from trellis_api import endpoints_pb2 as pb
from trellis_common.changefeed import ChangeFeed
from trellis_runtime.servicewatch import service_changes


def service(namespace: str, name: str, *addresses: str) -> pb.ServiceEndpoints:
    return pb.ServiceEndpoints(
        info=pb.ServiceInfo(service=pb.ServiceRef(namespace=namespace, name=name)),
        endpoints=[pb.Endpoint(address=a, ports={"": 80}) for a in addresses],
        revision=7,
    )


async def test_each_batch_is_one_answer_with_services_as_messages_or_bytes() -> None:
    known = {
        ("shop", "api"): service("shop", "api", "10.0.0.1", "10.0.0.2"),
        ("shop", "web"): service("shop", "web", "10.0.0.3"),
        ("other", "db"): service("other", "db", "10.0.0.4"),
    }

    def service_of(key: tuple[str, str]) -> pb.ServiceEndpoints | bytes | None:
        found = known.get(key)
        if found is None:
            return None
        return found.SerializeToString() if key[1] == "api" else found  # both kinds

    feed: ChangeFeed[tuple[str, str]] = ChangeFeed()
    with feed.watch() as watch:
        listed = pb.ListServicesResponse(services=list(known.values()), revision=7)
        answers = service_changes(
            watch,
            listed,
            provider="vm",
            namespace="shop",
            name_of=lambda key: key,
            service_of=service_of,
            revision=lambda: 8,
        )
        first = await anext(answers)
        assert isinstance(first, pb.ServiceChanges)
        assert first.full
        assert len(first.services) == 3

        del known["shop", "web"]
        feed.changed([("shop", "api"), ("shop", "web"), ("other", "db")])
        later = await anext(answers)
        assert isinstance(later, bytes)
        parsed = pb.ServiceChanges.FromString(later)
        assert parsed == pb.ServiceChanges(
            provider="vm",
            services=[known["shop", "api"]],  # "other" is outside the namespace asked for
            removed=[pb.ServiceRef(namespace="shop", name="web")],
            revision=8,
        )

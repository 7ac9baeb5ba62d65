"""A provider's report, validated where it enters; endpoints converted once while unchanged."""

from __future__ import annotations

import pytest

from trellis_api import endpoints_pb2 as pb
from trellis_catalog.clients.provider_reports import InvalidReport, converted, from_proto


def report(*endpoints: pb.Endpoint) -> pb.ServiceEndpoints:
    return pb.ServiceEndpoints(
        info=pb.ServiceInfo(
            service=pb.ServiceRef(namespace="shop", name="api"),
            ports=[pb.ServicePort(name="http", number=80)],
        ),
        endpoints=endpoints,
    )


def at(address: str, port: int = 8080) -> pb.Endpoint:
    return pb.Endpoint(address=address, ports={"http": port}, service_account="api")


def test_a_report_after_one_endpoint_moved_converts_that_one() -> None:
    memo = converted()
    first = from_proto("vm", report(*(at(f"10.0.0.{i}") for i in range(50))), print, memo)
    moved = [at(f"10.0.0.{i}") for i in range(49)] + [at("10.0.0.49", 9090)]
    second = from_proto("vm", report(*moved), print, memo)
    assert all(a is b for a, b in zip(first.endpoints[:49], second.endpoints[:49], strict=True))
    assert second.endpoints[49] is not first.endpoints[49]
    assert second.endpoints[49].ports == (("http", 9090),)
    assert (memo.misses, memo.hits) == (51, 49)
    # what it converts is what a conversion from nothing gives
    assert second == from_proto("vm", report(*moved), print)


def test_a_bad_endpoint_is_reported_at_every_report_not_only_the_first() -> None:
    memo = converted()
    bad = at("10.0.0.2", 70000)
    seen: list[str] = []
    for _ in range(3):
        found = from_proto("vm", report(at("10.0.0.1"), bad), seen.append, memo)
        assert [e.address for e in found.endpoints] == ["10.0.0.1"]
    assert len(seen) == 3
    assert all("port 'http' is 70000, not in 1-65535" in reason for reason in seen)


def test_the_same_endpoint_of_two_providers_is_converted_for_each() -> None:
    memo = converted()
    one = from_proto("vm", report(at("10.0.0.1")), print, memo)
    other = from_proto("k8s", report(at("10.0.0.1")), print, memo)
    assert (one.endpoints[0].provider, other.endpoints[0].provider) == ("vm", "k8s")


def test_a_service_refused_whole_still_raises() -> None:
    bad_port = report(at("10.0.0.1"))
    bad_port.info.ports[0].number = 0
    with pytest.raises(InvalidReport, match="port 'http' is 0"):
        from_proto("vm", bad_port, print, converted())

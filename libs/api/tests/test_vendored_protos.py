"""The vendored Linkerd protos are upstream's, byte for byte, and generate the upstream API.

``proto/vendor/linkerd2-proxy-api`` holds linkerd2-proxy-api v0.18.0's ``proto/*.proto``
(tag v0.18.0, commit 1f239e11f92bd1d42d6ac99cf100c936a3348341): each file's git blob id is
the one upstream has, so not a byte differs. The generated modules carry upstream's
packages and services, which is what makes the wire the same.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from trellis_api.conduit.proxy.destination import destination_pb2 as conduit_pb2
from trellis_api.linkerd import destination_pb2, destination_pb2_grpc

VENDOR = Path(__file__).resolve().parents[3] / "proto" / "vendor" / "linkerd2-proxy-api"
CONDUIT = VENDOR.parent / "linkerd2-conduit"
UPSTREAM_BLOBS = {
    "net.proto": "0f1d3743879ea08d8b129ab728c447833e51cc0a",
    "meta.proto": "396f58663290fa4f25e627c99a16eadb4bcc3a0a",
    "http_types.proto": "a86ab8798522bf1f02ecbeae1e4215dbdd4ab0e3",
    "destination.proto": "5947b7b5d8e3924963fd780d75b80f8675e9ca2e",
}


CONDUIT_BLOBS = {
    "common/common.proto": "52bd0876da2bc23622dc3ea9753d7a9d4312f4f7",
    "proxy/destination/destination.proto": "36df1a5a312f707b5f567214222305c1576ba960",
}


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\x00" % len(data) + data, usedforsecurity=False).hexdigest()


@pytest.mark.parametrize(("name", "blob"), sorted(UPSTREAM_BLOBS.items()))
def test_each_file_is_upstreams(name: str, blob: str) -> None:
    assert git_blob_id((VENDOR / name).read_bytes()) == blob


@pytest.mark.parametrize(("name", "blob"), sorted(CONDUIT_BLOBS.items()))
def test_each_conduit_file_is_upstreams(name: str, blob: str) -> None:
    assert git_blob_id((CONDUIT / name).read_bytes()) == blob


def test_nothing_else_is_vendored() -> None:
    assert sorted(p.name for p in VENDOR.iterdir()) == sorted(UPSTREAM_BLOBS)
    conduit = sorted(str(p.relative_to(CONDUIT)) for p in CONDUIT.rglob("*") if p.is_file())
    assert conduit == sorted(CONDUIT_BLOBS)
    assert sorted(p.name for p in VENDOR.parent.iterdir()) == [CONDUIT.name, VENDOR.name]


def test_the_generated_api_has_upstreams_names() -> None:
    service = destination_pb2.DESCRIPTOR.services_by_name["Destination"]
    assert service.full_name == "io.linkerd.proxy.destination.Destination"
    assert [m.name for m in service.methods] == ["Get", "GetProfile"]
    update = destination_pb2.Update.DESCRIPTOR
    assert {f.name: f.number for f in update.fields} == {"add": 1, "remove": 2, "no_endpoints": 3}
    assert hasattr(destination_pb2_grpc, "add_DestinationServicer_to_server")


def test_the_conduit_api_keeps_its_names() -> None:
    service = conduit_pb2.DESCRIPTOR.services_by_name["Destination"]
    assert service.full_name == "conduit.proxy.destination.Destination"
    assert service.methods_by_name["Get"].input_type.full_name == "conduit.common.Destination"
    weighted = conduit_pb2.WeightedAddr.DESCRIPTOR
    assert {f.name: f.number for f in weighted.fields} == {
        "addr": 1,
        "weight": 3,
        "metric_labels": 4,
    }

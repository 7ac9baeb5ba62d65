"""Slices and destinations encoded once per version (``transport.encoded``): what the bytes
say, that they are reused while the resource stands, and never after it moved."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from trellis_api import catalog_pb2 as pb
from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.sources import kinds
from trellis_catalog.transport.encoded import EncodedResources
from trellis_common.model import MeshService
from trellis_common.specdir import load_paths

ROOT = Path(__file__).resolve().parents[3]
SLICE = "slice/bookstore/bookstore-v1|14001"
DESTINATION = "destination/bookstore/bookstore-v1"
BUYER_PROXY = "00000000-0000-4000-8000-000000000001.bookbuyer.bookbuyer"


def v1(*addresses: str) -> ProvidedService:
    return ProvidedService(
        provider="vm",
        namespace="bookstore",
        name="bookstore-v1",
        ports=(("http", 8080, "", 0),),
        endpoints=tuple(
            ProvidedEndpoint(
                a, (("http", 8081),), labels=(("version", "v1"),), service_account="bookstore"
            )
            for a in addresses
        ),
    )


@pytest.fixture
def catalog() -> Catalog:
    documents, errors = load_paths([ROOT / "examples" / "bookstore"], kinds())
    catalog = Catalog()
    catalog.set_documents(documents, errors)
    catalog.set_provider_services("vm", [v1("10.0.0.1", "10.0.0.2")])
    catalog.expect_proxy(BUYER_PROXY, "bookbuyer")  # its policy references the slice
    catalog.flush()
    return catalog


def parsed(encoded: bytes | None) -> pb.Resource:
    assert encoded is not None
    return pb.Resource.FromString(encoded)


def moved(catalog: Catalog, *addresses: str) -> None:
    catalog.update_provider_service("vm", "bookstore", "bookstore-v1", v1(*addresses))
    catalog.flush()


def test_a_slice_says_what_its_message_would(catalog: Catalog) -> None:
    resource = parsed(EncodedResources(catalog).get(SLICE))
    version = catalog.resources.versions[SLICE]
    expected = pb.Resource(
        name=SLICE,
        version=version,
        slice=pb.ClusterSlice(
            cluster="bookstore/bookstore-v1|14001",
            spiffe_ids=["spiffe://cluster.local/ns/bookstore/sa/bookstore"],
            version=version,
            endpoints=[
                pb.ClusterEndpoint(
                    address=a,
                    port=8081,
                    labels={"version": "v1"},
                    service_account="bookstore",
                    weight=e.weight,
                    locality=e.locality,
                    workload=e.workload,
                    provider="vm",
                )
                for a, e in zip(
                    ("10.0.0.1", "10.0.0.2"),
                    catalog.clusters["bookstore/bookstore-v1|14001"].endpoints,
                    strict=True,
                )
            ],
        ),
    )
    assert resource == expected


def test_the_same_bytes_are_sent_while_the_resource_stands(catalog: Catalog) -> None:
    encoded = EncodedResources(catalog)
    first = encoded.get(SLICE), encoded.get(DESTINATION)
    catalog.flush()  # nothing moved
    again = encoded.get(SLICE), encoded.get(DESTINATION)
    assert again[0] is first[0]
    assert again[1] is first[1]
    assert parsed(first[1]).version == catalog.resources.versions[DESTINATION]


def test_a_moved_resource_is_encoded_again_at_its_new_version(catalog: Catalog) -> None:
    encoded = EncodedResources(catalog)
    before = parsed(encoded.get(SLICE)), parsed(encoded.get(DESTINATION))
    moved(catalog, "10.0.0.1", "10.0.0.3")
    after = parsed(encoded.get(SLICE)), parsed(encoded.get(DESTINATION))
    versions = catalog.resources.versions
    assert [r.version for r in after] == [versions[SLICE], versions[DESTINATION]]
    assert [r.version for r in before] != [r.version for r in after]
    assert [e.address for e in after[0].slice.endpoints] == ["10.0.0.1", "10.0.0.3"]
    [port] = after[1].destination.ports
    assert [e.address for e in port.endpoints] == ["10.0.0.1", "10.0.0.3"]
    assert port.version == catalog.clusters["bookstore/bookstore-v1|14001"].version
    # and back: the first content, at the first versions
    moved(catalog, "10.0.0.1", "10.0.0.2")
    assert (parsed(encoded.get(SLICE)), parsed(encoded.get(DESTINATION))) == before


def test_a_limited_slice_keeps_only_the_accounts_it_names(catalog: Catalog) -> None:
    other = replace(v1("10.0.0.2").endpoints[0], service_account="other")
    catalog.update_provider_service(
        "vm",
        "bookstore",
        "bookstore-v1",
        replace(v1("10.0.0.1"), endpoints=(*v1("10.0.0.1").endpoints, other)),
    )
    catalog.flush()
    encoded = EncodedResources(catalog)
    whole = parsed(encoded.get(SLICE)).slice
    limited = parsed(encoded.get(SLICE + "@bookstore")).slice
    assert sorted(e.service_account for e in whole.endpoints) == ["bookstore", "other"]
    assert [e.service_account for e in limited.endpoints] == ["bookstore"]
    assert list(limited.accounts) == ["bookstore"]


def test_what_is_gone_is_not_answered_and_is_forgotten(catalog: Catalog) -> None:
    encoded = EncodedResources(catalog)
    assert encoded.get(DESTINATION) is not None
    assert encoded.get("slice/nowhere/nothing|1") is None
    assert encoded.get("destination/nowhere/nothing") is None
    assert encoded.get("policy/bookstore/bookstore-v1") is None  # policies are not kept
    catalog.remove_provider_service("vm", "bookstore", "bookstore-v1")
    catalog.flush()
    gone = MeshService("bookstore", "bookstore-v1") not in catalog.destinations.records
    assert (encoded.get(DESTINATION) is None) == gone
    for index in range(200):  # many resources come and go: what is gone is dropped
        encoded._keep(f"slice/x/{index}|1", "", "", "slice", b"")
    encoded.prune()
    assert len(encoded) <= 2 * len(catalog.resources.versions) + 64

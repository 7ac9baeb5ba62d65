"""Two catalog replicas, the same inputs: the same version for every published resource
(policy, slice, destination), view and cluster, whatever the order and batching the inputs
came in, and after a restart.

The replicas are two :class:`Catalog` objects in this process, fed the examples' specs
(bookstore and greeter), two providers' reports and the proxies' records: one in a single
flush, the other in pieces, in shuffled orders, with flushes in between. A restart is a
new process with another ``PYTHONHASHSEED`` (a set iterated into a tuple would show
there), building the same inputs.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict

from trellis_api import catalog_pb2 as pb
from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.sources import kinds
from trellis_catalog.transport.grpc_api import CatalogServicer
from trellis_common.documents.base import Document
from trellis_common.specdir import load_paths
from trellis_testing.servicer import invoke

ROOT = Path(__file__).resolve().parents[3]
SPECS = [ROOT / "examples" / "bookstore", ROOT / "examples" / "grpc"]
PROXIES = [  # common name, service account
    ("6b1f3c1e-0000-4000-8000-000000000001.bookbuyer.bookbuyer", "bookbuyer"),
    ("6b1f3c1e-0000-4000-8000-000000000002.bookthief.bookthief", "bookthief"),
    ("6b1f3c1e-0000-4000-8000-000000000003.bookstore-v1.bookstore", "bookstore"),
    ("6b1f3c1e-0000-4000-8000-000000000004.bookstore-v2.bookstore", "bookstore"),
    ("6b1f3c1e-0000-4000-8000-000000000005.bookstore-v2.bookstore", "bookstore"),
    ("6b1f3c1e-0000-4000-8000-000000000006.hello-v1.shop", "hello-v1"),
    ("6b1f3c1e-0000-4000-8000-000000000007.client.shop", "client"),
]
SEEDS = range(6)


def _service(
    provider: str, namespace: str, name: str, port: tuple[str, int], *endpoints: tuple[str, str]
) -> ProvidedService:
    """``endpoints``: (address, service account), each serving ``port``'s name on 8000 +
    the address's last byte."""
    return ProvidedService(
        provider=provider,
        namespace=namespace,
        name=name,
        ports=((port[0], port[1], "", 0),),
        endpoints=tuple(
            ProvidedEndpoint(
                address,
                ((port[0], 8000 + int(address.rpartition(".")[2])),),
                service_account=account,
                labels=(("zone", f"z{len(address) % 3}"), ("app", name)),
            )
            for address, account in endpoints
        ),
    )


def reports() -> dict[str, list[ProvidedService]]:
    """Each provider's full list."""
    http, api = ("http", 14001), ("api", 9000)
    return {
        "vm": [
            _service("vm", "bookstore", "bookstore-v1", http, ("10.0.0.1", "bookstore")),
            _service("vm", "bookstore", "bookstore-v2", http, ("10.0.0.3", "bookstore")),
            _service("vm", "shop", "hello-v2", api, ("10.0.2.2", "hello-v2")),
        ],
        "k8s": [
            _service(
                "k8s",
                "bookstore",
                "bookstore-v1",
                http,
                ("10.0.1.1", "bookstore"),
                ("10.0.1.2", "bookstore"),
            ),
            _service("k8s", "bookbuyer", "bookbuyer", ("http", 80), ("10.0.1.9", "bookbuyer")),
            _service("k8s", "shop", "hello-v1", api, ("10.0.2.1", "hello-v1")),
            _service("k8s", "shop", "client", ("http", 80), ("10.0.2.9", "client")),
        ],
    }


def documents() -> list[Document]:
    found, errors = load_paths(SPECS, kinds())
    assert errors == []
    return found


def replica_in_one_go() -> Catalog:
    """Every input, then one flush."""
    catalog = Catalog()
    catalog.set_documents(documents(), [])
    listed = reports()
    for provider in ("k8s", "vm"):  # the other replica hears vm first
        catalog.set_provider_services(provider, listed[provider])
    for common_name, account in PROXIES:
        catalog.expect_proxy(common_name, account)
    assert catalog.flush() is not None
    return catalog


def replica_in_pieces(seed: int) -> Catalog:
    """The same inputs in another order, in pieces, with flushes in between: half of the
    documents first, the proxies spread out, one provider's services one at a time (some
    reported in an older state first) and the other's in one list."""
    shuffle = random.Random(seed)
    catalog = Catalog()
    proxies, docs = list(PROXIES), documents()
    shuffle.shuffle(proxies)
    shuffle.shuffle(docs)
    half = len(proxies) // 2
    for common_name, account in proxies[:half]:
        catalog.expect_proxy(common_name, account)
    catalog.set_documents(docs[: len(docs) // 2], [])
    catalog.flush()
    listed = reports()
    one_by_one = list(listed["vm"])
    shuffle.shuffle(one_by_one)
    for service in one_by_one:
        older = _service("vm", service.namespace, service.name, ("http", 14001), ("10.9.9.9", ""))
        catalog.update_provider_service("vm", service.namespace, service.name, older)
        if shuffle.random() < 0.5:
            catalog.flush()
        catalog.update_provider_service("vm", service.namespace, service.name, service)
        if shuffle.random() < 0.5:
            catalog.flush()
    shuffle.shuffle(docs)
    catalog.set_documents(docs, [])
    catalog.flush()
    catalog.set_provider_services("k8s", reversed(listed["k8s"]))
    for common_name, account in proxies[half:]:
        catalog.expect_proxy(common_name, account)
        if shuffle.random() < 0.5:
            catalog.flush()
    catalog.flush()
    return catalog


def versions(catalog: Catalog) -> dict[str, dict[str, str]]:
    """Every version a consumer compares."""
    return {
        "resources": dict(sorted(catalog.resources.versions.items())),
        "views": {str(i): v for i, v in sorted(catalog.view_versions().items())},
        "clusters": {name: state.version for name, state in sorted(catalog.clusters.items())},
        "destinations": {
            str(s): v for s, v in sorted(catalog.destinations.versions.items(), key=str)
        },
    }


async def _served(catalog: Catalog) -> dict[str, Any]:
    """What ``GetView`` sends for each identity and ``GetResources`` for every resource a
    full ``ListChanges`` lists, less the replica's own revision."""
    servicer = CatalogServicer(catalog)
    found: dict[str, Any] = {}
    for identity in sorted(catalog.policies):
        view, _ = await invoke(servicer.GetView, pb.GetViewRequest(identity=str(identity)))
        shown = MessageToDict(view, preserving_proto_field_name=True)
        shown.pop("revision", None)
        found[f"view {identity}"] = shown
    listed, _ = await invoke(servicer.ListChanges, pb.ListChangesRequest())
    names = [c.name for c in listed.changes]
    answer, _ = await invoke(servicer.GetResources, pb.GetResourcesRequest(names=names))
    assert list(answer.missing) == []
    for resource in answer.resources:
        shown = MessageToDict(resource, preserving_proto_field_name=True)
        shown.get("policy", {}).pop("revision", None)
        found[resource.name] = shown
    assert len(found) == len(catalog.policies) + len(names)
    return found


@pytest.fixture(scope="module")
def reference() -> Catalog:
    return replica_in_one_go()


def test_the_inputs_make_a_mesh_worth_comparing(reference: Catalog) -> None:
    found = versions(reference)
    assert len(found["views"]) >= 8
    assert len([n for n in found["resources"] if n.startswith("slice/")]) >= 4
    assert len(found["clusters"]) >= 6
    assert len(found["destinations"]) >= 7
    # endpoints of both providers met in one cluster
    assert len(reference.clusters["bookstore/bookstore-v1|14001"].endpoints) == 3
    assert all(s.state == "valid" for s in reference.spec.statuses.values())


@pytest.mark.parametrize("seed", SEEDS)
async def test_a_replica_fed_in_another_order_ends_with_the_same_versions(
    reference: Catalog, seed: int
) -> None:
    other = replica_in_pieces(seed)
    assert versions(other) == versions(reference)
    assert await _served(other) == await _served(reference)  # the same content, as sent
    assert other.revision > reference.revision  # its cursor is its own


def test_a_change_applied_to_both_replicas_moves_the_same_versions(reference: Catalog) -> None:
    first, second = replica_in_one_go(), replica_in_pieces(seed=99)
    before = versions(first)
    moved = _service("vm", "bookstore", "bookstore-v2", ("http", 14001), ("10.0.0.4", "bookstore"))
    first.update_provider_service("vm", "bookstore", "bookstore-v2", moved)
    first.flush()
    second.update_provider_service("vm", "bookstore", "bookstore-v2", moved)
    second.update_provider_service("vm", "bookstore", "bookstore-v2", moved)  # heard twice
    second.flush()
    assert versions(first) == versions(second)
    after = versions(first)
    changed = {
        kind: sorted(k for k, v in after[kind].items() if before[kind].get(k) != v)
        for kind in after
    }
    assert changed == {
        # the cluster's slice and the service's destination; no policy moves
        "resources": ["destination/bookstore/bookstore-v2", "slice/bookstore/bookstore-v2|14001"],
        "views": ["bookbuyer/bookbuyer"],  # the one that may reach v2
        "clusters": ["bookstore/bookstore-v2|14001"],
        "destinations": ["bookstore/bookstore-v2"],
    }
    # and back: the versions it had
    back = _service("vm", "bookstore", "bookstore-v2", ("http", 14001), ("10.0.0.3", "bookstore"))
    first.update_provider_service("vm", "bookstore", "bookstore-v2", back)
    first.flush()
    assert versions(first) == before


RESTARTED = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("replicas", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps(module.versions(module.replica_in_one_go())))
"""


@pytest.mark.slow
@pytest.mark.parametrize("hash_seed", ["0", "4242"])
def test_versions_are_stable_across_a_restart(reference: Catalog, hash_seed: str) -> None:
    """Another process (a restarted or a second replica), with another string hash seed."""
    done = subprocess.run(
        [sys.executable, "-c", RESTARTED, __file__],
        env={**os.environ, "PYTHONHASHSEED": hash_seed},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(done.stdout) == versions(reference)

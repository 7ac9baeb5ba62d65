"""Golden views of the bookstore example, as proxy-cp receives them (``View`` as JSON).

The catalog is built from ``examples/bookstore`` with two providers' endpoints and the
proxies of every identity, then each view is serialized as ``GetView`` would send it and
compared with ``golden/<namespace>__<service>.json``. The catalog's revision (a replica's
own count of flushes) is left out; the view's version is a digest of its policy's version
and its slices' (:meth:`Catalog.view_version`), each a digest of content, the same on every
replica and in every run, so it is kept: a golden version that moves says that consumers
will fetch the policy or a slice again after an upgrade.

To regenerate after an intended change: ``TRELLIS_UPDATE_GOLDEN=1 uv run pytest
services/catalog/tests/test_views_golden.py``, then read the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict

from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.domain.model.views import Identity
from trellis_catalog.sources import kinds
from trellis_catalog.transport.protos import to_proto
from trellis_common.documents.base import Origin
from trellis_common.specdir import load_paths

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("TRELLIS_UPDATE_GOLDEN") == "1"
VARYING = ("revision",)

PROXIES = [  # common name, service account
    ("6b1f3c1e-0000-4000-8000-000000000001.bookbuyer.bookbuyer", "bookbuyer"),
    ("6b1f3c1e-0000-4000-8000-000000000002.bookthief.bookthief", "bookthief"),
    ("6b1f3c1e-0000-4000-8000-000000000003.bookstore-v1.bookstore", "bookstore"),
    ("6b1f3c1e-0000-4000-8000-000000000004.bookstore-v2.bookstore", "bookstore"),
]
IDENTITIES = [
    Identity("bookbuyer", "bookbuyer"),
    Identity("bookstore", "bookstore"),  # the split's root: declared, no proxy of its own
    Identity("bookstore", "bookstore-v1"),
    Identity("bookstore", "bookstore-v2"),
    Identity("bookthief", "bookthief"),
]
PERMISSIVE = {
    "apiVersion": "config.openservicemesh.io/v1alpha2",
    "kind": "MeshConfig",
    "metadata": {"name": "osm-mesh-config", "namespace": "trellis-system"},
    "spec": {"traffic": {"enablePermissiveTrafficPolicyMode": True}},
}


def _bookstore(name: str, port: int, service_account: str = "") -> ProvidedService:
    return ProvidedService(
        provider="endpoints-vm",
        namespace="bookstore",
        name=name,
        ports=(("http", 14001, "HTTP", 0),),
        endpoints=(
            ProvidedEndpoint("127.0.0.1", (("http", port),), service_account=service_account),
        ),
    )


def _catalog(permissive: bool = False) -> Catalog:
    documents, errors = load_paths([ROOT / "examples" / "bookstore"], kinds())
    assert errors == []
    if permissive:  # only one MeshConfig is read: this one replaces the example's
        documents = [d for d in documents if d.key.kind != "MeshConfig"]
        documents.append(kinds().parse(PERMISSIVE, Origin("permissive.yaml")))
    catalog = Catalog()
    catalog.set_documents(documents, errors)
    catalog.set_provider_services(
        "endpoints-vm",
        [_bookstore("bookstore-v1", 8081, "bookstore"), _bookstore("bookstore-v2", 8082)],
    )
    for common_name, account in PROXIES:
        catalog.expect_proxy(common_name, account)
    assert catalog.flush() is not None
    assert all(s.state == "valid" for s in catalog.spec.statuses.values())
    return catalog


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return _catalog()


@pytest.fixture(scope="module")
def permissive_catalog() -> Catalog:
    return _catalog(permissive=True)


def _view(catalog: Catalog, identity: Identity) -> dict[str, Any]:
    assembled = to_proto(
        catalog.policies[identity], catalog.clusters, catalog.view_version(identity)
    )
    view = MessageToDict(assembled, preserving_proto_field_name=True)
    for name in VARYING:
        view.pop(name, None)
    return view


def _check(path: Path, view: dict[str, Any]) -> None:
    text = json.dumps(view, indent=2, sort_keys=True) + "\n"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"{path} is missing: run with TRELLIS_UPDATE_GOLDEN=1 to write it"
    assert json.loads(path.read_text()) == view, f"{path.name} differs from the view"


def _golden(identity: Identity, folder: Path = GOLDEN) -> Path:
    return folder / f"{identity.namespace}__{identity.service}.json"


def test_every_identity_has_a_view(catalog: Catalog) -> None:
    assert catalog.identities() == IDENTITIES
    assert sorted(catalog.policies) == IDENTITIES
    if not UPDATE:  # no stale golden file is left behind
        assert sorted(GOLDEN.glob("*.json")) == sorted(_golden(i) for i in IDENTITIES)


@pytest.mark.parametrize("identity", IDENTITIES, ids=str)
def test_bookstore_views(catalog: Catalog, identity: Identity) -> None:
    _check(_golden(identity), _view(catalog, identity))


def test_bookthief_in_permissive_mode(permissive_catalog: Catalog) -> None:
    thief = Identity("bookthief", "bookthief")
    view = _view(permissive_catalog, thief)
    _check(_golden(thief, GOLDEN / "permissive"), view)
    assert view["mesh"]["permissive"] is True

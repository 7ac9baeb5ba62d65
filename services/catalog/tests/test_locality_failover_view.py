"""MeshConfig ``traffic.enableLocalityFailover`` reaches proxy-cp in every view's
``mesh.locality_failover`` (off by default), and turning it on changes the views' versions
and its policy's (so proxy-cp rebuilds its snapshots)."""

from __future__ import annotations

from pathlib import Path

from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.model.views import Identity
from trellis_catalog.sources import kinds
from trellis_catalog.transport.protos import to_proto
from trellis_common.documents.base import Origin
from trellis_common.specdir import load_paths

ROOT = Path(__file__).resolve().parents[3]
BUYER = Identity("bookbuyer", "bookbuyer")


def _catalog(failover: bool | None) -> Catalog:
    """The bookstore example's catalog, its MeshConfig replaced by one that sets
    ``enableLocalityFailover`` to ``failover`` (None: leaves it out)."""
    documents, errors = load_paths([ROOT / "examples" / "bookstore"], kinds())
    assert errors == []
    traffic = {} if failover is None else {"enableLocalityFailover": failover}
    mesh_config = {
        "apiVersion": "config.trellis.io/v1alpha1",
        "kind": "MeshConfig",
        "metadata": {"name": "mesh", "namespace": "trellis-system"},
        "spec": {"traffic": traffic},
    }
    documents = [d for d in documents if d.key.kind != "MeshConfig"]  # only one is read
    documents.append(kinds().parse(mesh_config, Origin("mesh.yaml")))
    catalog = Catalog()
    catalog.set_documents(documents, errors)
    catalog.expect_proxy("6b1f3c1e-0000-4000-8000-000000000001.bookbuyer.bookbuyer", "bookbuyer")
    assert catalog.flush() is not None
    return catalog


def test_the_view_says_whether_the_mesh_fails_over_by_locality() -> None:
    unset, off, on = _catalog(None), _catalog(failover=False), _catalog(failover=True)

    unset_view, off_view, on_view = (
        to_proto(c.policies[BUYER], c.clusters, c.view_version(BUYER)) for c in (unset, off, on)
    )

    assert unset_view.mesh.locality_failover is False
    assert off_view.mesh.locality_failover is False
    assert on_view.mesh.locality_failover is True
    assert off_view.version == unset_view.version  # the same content
    assert on_view.version != off_view.version  # only the switch differs
    policy = f"policy/{BUYER}"
    assert off.resources.versions[policy] == unset.resources.versions[policy]
    assert on.resources.versions[policy] != off.resources.versions[policy]

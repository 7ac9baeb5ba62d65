"""MeshConfig ``spec.traffic.enableLocalityFailover``: off unless set, read in both
apiVersions (a Trellis extension, as UpstreamTrafficSetting's ``outlierDetection`` is),
and a strict boolean."""

from __future__ import annotations

from typing import Any

import pytest

from trellis_common.documents import meshconfig
from trellis_common.documents.base import DocumentError, KindRegistry, Origin

ORIGIN = Origin("file.yaml", 0)


def parsed(api_version: str, traffic: dict[str, Any]) -> meshconfig.MeshConfigSettings:
    registry = KindRegistry()
    meshconfig.register(registry)
    raw = {
        "apiVersion": api_version,
        "kind": "MeshConfig",
        "metadata": {"name": "mesh"},
        "spec": {"traffic": traffic},
    }
    resource = registry.parse(raw, ORIGIN).resource
    assert isinstance(resource, meshconfig.MeshConfig | meshconfig.OsmMeshConfig)
    return resource.settings()


@pytest.mark.parametrize(
    "api_version", [meshconfig.TRELLIS_API_VERSION, meshconfig.OSM_API_VERSION]
)
def test_off_by_default_and_on_when_set(api_version: str) -> None:
    assert parsed(api_version, {}).locality_failover is False
    assert meshconfig.MeshConfigSettings().locality_failover is False
    assert parsed(api_version, {"enableLocalityFailover": True}).locality_failover is True


def test_not_a_boolean_is_an_error_naming_the_field() -> None:
    with pytest.raises(DocumentError, match="enableLocalityFailover"):
        parsed(meshconfig.TRELLIS_API_VERSION, {"enableLocalityFailover": "yes"})

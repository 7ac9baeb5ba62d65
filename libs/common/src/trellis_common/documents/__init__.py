"""Kubernetes-style documents (YAML) that operators write: models, parsing and errors.

Each kind lives in its own module (``istio``, ``smi``, ``core``, ``meshconfig``) as pydantic
models; :mod:`.base` turns raw YAML mappings into validated :class:`~.base.Document` values
or :class:`~.base.DocumentError` naming the file, the document, the field and the reason.
The endpoints providers and the catalog read the same directory and take the kinds they own.
"""

from trellis_common.documents.base import KindRegistry


def all_kinds() -> KindRegistry:
    """A registry of every kind Trellis reads (core, SMI, Istio, MeshConfig, OSM policy,
    Gateway API routes, Gateways and their classes, ReferenceGrants)."""
    from trellis_common.documents import (
        core,
        gateway,
        gateway_api,
        istio,
        meshconfig,
        osm,
        osm_access,
        smi,
    )

    registry = KindRegistry()
    for module in (core, smi, istio, meshconfig, osm, osm_access, gateway, gateway_api):
        module.register(registry)
    return registry

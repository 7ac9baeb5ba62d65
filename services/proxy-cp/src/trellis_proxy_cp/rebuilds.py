"""Which kinds of resource a group's snapshot is translated again for, from what it was
built from (:class:`Built`) and what moved since.

Where only the identity's policy or its certificate material moved, the kinds the change
concerns (:func:`~.translate.scope.kinds_concerned`; new material: the secrets, which alone
read it); every kind otherwise: no snapshot yet, a slice that moved under the policy (its
SPIFFE ids: an endpoints-only move has its own path in :mod:`.core`), or a proxy whose
resources are always built whole (:attr:`~.translate.settings.ProxySettings.built_whole`).
"""

from __future__ import annotations

from dataclasses import dataclass

from trellis_api import catalog_pb2
from trellis_proxy_cp import types
from trellis_proxy_cp.translate import scope
from trellis_proxy_cp.translate.proxy import KINDS
from trellis_proxy_cp.translate.settings import ProxySettings

#: Each kind of resource (:data:`~.translate.proxy.KINDS`) by its type URL.
TYPE_OF_KIND: dict[str, types.TypeUrl] = {
    "listeners": types.LISTENER,
    "routes": types.ROUTE,
    "clusters": types.CLUSTER,
    "endpoints": types.ENDPOINT,
    "secrets": types.SECRET,
}


@dataclass(frozen=True, slots=True)
class Built:
    """What a group's snapshot was made of: the policy, the material's serial, and the
    policy's slices (None: none held), as they were."""

    policy: catalog_pb2.View
    serial: str
    slices: tuple[catalog_pb2.ClusterSlice | None, ...]


def kinds_to_build(
    built: Built | None,
    policy: catalog_pb2.View,
    serial: str,
    settings: ProxySettings,
    slices_now: tuple[catalog_pb2.ClusterSlice | None, ...],
) -> frozenset[str]:
    """The kinds to translate for a group of ``settings`` whose snapshot was ``built``
    (None: it has none) now that its policy is ``policy`` and its material ``serial``;
    ``slices_now``: the slices ``built.policy`` names, as they are now."""
    if (
        built is None
        or settings.built_whole
        or not all(a is b for a, b in zip(built.slices, slices_now, strict=True))
    ):
        return KINDS
    kinds = (
        frozenset()
        if built.policy is policy
        else scope.kinds_concerned(built.policy, policy, settings)
    )
    if built.serial != serial:
        kinds |= {"secrets"}
    return kinds if kinds else KINDS  # nothing moved: a whole build, as asked

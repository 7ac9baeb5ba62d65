"""Fixtures of proxy-cp's tests (test modules cannot import each other)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trellis_common.bootstrap import KEY_FILE, WORKLOAD_CERT_FILE
from trellis_proxy_cp import testing as t
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.testing.static import self_signed_material
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.translate.settings import ProxySettings


@pytest.fixture
def real_material() -> SecretMaterial:
    """A self-signed certificate and key Envoy accepts (``envoy --mode validate``)."""
    return self_signed_material()


@pytest.fixture
def sidecar(real_material: SecretMaterial, tmp_path: Path) -> Callable[..., ProxySettings]:
    """Settings of a sidecar whose own workload certificate and key are real files (as
    its host keeps them), which ``envoy --mode validate`` loads; keywords as
    :class:`ProxySettings`'s."""
    folder = tmp_path / "proxy"
    folder.mkdir()
    (folder / WORKLOAD_CERT_FILE).write_bytes(real_material.cert_chain_pem)
    (folder / KEY_FILE).write_bytes(real_material.key_pem)

    def settings(**values: Any) -> ProxySettings:
        return ProxySettings(workload_dir=str(folder), **values)

    return settings


@pytest.fixture
def sources() -> t.FakeSources:
    """The catalog and certmanager behind a control plane (views and material on demand)."""
    return t.FakeSources()


@pytest.fixture
def cache() -> SnapshotCache:
    return SnapshotCache()


@pytest.fixture
def control_plane(sources: t.FakeSources, cache: SnapshotCache) -> ProxyControlPlane:
    return sources.control_plane(cache)

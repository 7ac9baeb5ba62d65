"""Fixtures of proxy-cp's tests (test modules cannot import each other)."""

from __future__ import annotations

import pytest

from trellis_proxy_cp.testing.static import self_signed_material
from trellis_proxy_cp.translate.secrets import SecretMaterial


@pytest.fixture
def real_material() -> SecretMaterial:
    """A self-signed certificate and key Envoy accepts (``envoy --mode validate``)."""
    return self_signed_material()

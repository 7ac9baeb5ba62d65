"""The demo's Gateway: ``trellis up`` serves bookstore through a Trellis gateway Envoy.

``examples/gateway`` declares the GatewayClass ``trellis``, the Gateway
``bookstore/bookstore-gateway`` (HTTP on 14080) and an HTTPRoute to bookstore; ``trellis
up`` runs ``trellis gateway run`` for it and prints its URL. A request there reaches a
bookstore version, over mesh mTLS, as the gateway's identity.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from trellis_cli import demo
from trellis_testing import up
from trellis_testing.waiting import eventually

# `trellis up` binds the default ports: never beside another test that does (xdist group)
pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("fixed-ports"),
]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[up.Up]:
    running = up.Up(tmp_path)
    spec = tmp_path / "spec"
    shutil.copytree(ROOT / "examples", spec)
    try:
        running.start("--spec-dir", str(spec), "--quiet", "--no-dashboard")
        yield running
    finally:
        running.stop()


async def test_a_request_to_the_demo_gateway_reaches_bookstore(mesh: up.Up) -> None:
    assert f"curl {demo.gateway_url()}" in mesh.output()

    def answered() -> dict[str, str] | None:
        try:
            response = httpx.get(demo.gateway_url(), timeout=2)
        except httpx.HTTPError:
            return None
        return response.json() if response.status_code == 200 else None

    await eventually(answered, timeout=90, interval=0.5, message="the gateway serves /books")
    body = answered()
    assert body is not None
    assert body["app"] in ("bookstore-v1", "bookstore-v2")
    assert body["path"] == "/books"
    # mesh mTLS from the gateway's own identity (the sidecar's x-forwarded-client-cert)
    assert "/ns/bookstore/sa/bookstore-gateway" in body["caller"]

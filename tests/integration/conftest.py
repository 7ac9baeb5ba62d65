"""Fixtures for tests that run Trellis services as real processes beside a real Redis."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from trellis_testing import RedisServer
from trellis_testing.mesh import Mesh
from trellis_testing.services import ServiceProcess

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    return path


@pytest.fixture
def certmanager(state_dir: Path, redis_server: RedisServer) -> Iterator[ServiceProcess]:
    process = ServiceProcess(
        "certmanager",
        "trellis_certmanager.main",
        state_dir,
        redis_server,
        env={"TRELLIS_CERTMANAGER_ROTATION_INTERVAL": "0.2"},
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def mesh(tmp_path: Path, state_dir: Path, redis_server: RedisServer) -> Iterator[Mesh]:
    """The four control-plane services on the bookstore example's documents (tests that
    need another mesh define their own ``mesh``)."""
    spec_dir = tmp_path / "spec"
    shutil.copytree(ROOT / "examples" / "bookstore", spec_dir)
    mesh = Mesh(tmp_path, state_dir, redis_server, spec_dir)
    mesh.start()
    try:
        yield mesh
    finally:
        mesh.stop()

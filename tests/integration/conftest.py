"""Fixtures for tests that run Trellis services as real processes beside a real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from trellis_common.testing import RedisServer
from trellis_common.testing.services import ServiceProcess


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
        redis_server.url,
        env={"TRELLIS_CERTMANAGER_ROTATION_INTERVAL": "0.2"},
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()

"""Service endpoint files: written atomically, removed only by their owner, read leniently."""

import json
import os
from pathlib import Path

import pytest

from trellis_common import statefile
from trellis_common.statefile import ServiceEndpoint


def endpoint(name: str = "catalog", pid: int | None = None) -> ServiceEndpoint:
    return ServiceEndpoint(
        name=name,
        admin_url="http://127.0.0.1:15011",
        grpc_address="127.0.0.1:15010",
        pid=os.getpid() if pid is None else pid,
    )


def test_write_read_remove_round_trip(tmp_path: Path) -> None:
    written = endpoint()

    path = statefile.write_endpoint(tmp_path, written)

    assert path == tmp_path / "services" / "catalog.json"
    assert json.loads(path.read_text()) == {
        "name": "catalog",
        "admin_url": "http://127.0.0.1:15011",
        "grpc_address": "127.0.0.1:15010",
        "pid": os.getpid(),
    }
    assert [p.name for p in path.parent.iterdir()] == ["catalog.json"]  # no temp file left
    assert statefile.read_endpoint(tmp_path, "catalog") == written
    assert statefile.read_endpoints(tmp_path) == {"catalog": written}

    statefile.remove_endpoint(tmp_path, "catalog", os.getpid())

    assert not path.exists()
    assert statefile.read_endpoint(tmp_path, "catalog") is None
    assert statefile.read_endpoints(tmp_path) == {}


def test_a_second_write_replaces_the_first(tmp_path: Path) -> None:
    statefile.write_endpoint(tmp_path, endpoint(pid=100))
    statefile.write_endpoint(tmp_path, endpoint(pid=200))

    current = statefile.read_endpoint(tmp_path, "catalog")
    assert current is not None
    assert current.pid == 200


def test_remove_keeps_a_file_written_by_another_process(tmp_path: Path) -> None:
    restarted = endpoint(pid=os.getpid() + 1)
    statefile.write_endpoint(tmp_path, restarted)

    statefile.remove_endpoint(tmp_path, "catalog", os.getpid())

    assert statefile.read_endpoint(tmp_path, "catalog") == restarted


def test_remove_of_a_missing_file_is_a_no_op(tmp_path: Path) -> None:
    statefile.remove_endpoint(tmp_path, "catalog", os.getpid())

    assert not (tmp_path / "services").exists()


def test_reading_a_state_dir_without_services(tmp_path: Path) -> None:
    assert statefile.read_endpoints(tmp_path / "nowhere") == {}
    assert statefile.read_endpoint(tmp_path / "nowhere", "catalog") is None


@pytest.mark.parametrize(
    "body",
    [
        "{not json",
        "[]",
        "null",
        '"catalog"',
        '{"name": "broken"}',
        '{"name": "x", "admin_url": "", "grpc_address": "", "pid": 1, "extra": 2}',
    ],
)
def test_read_endpoints_skips_malformed_files(tmp_path: Path, body: str) -> None:
    good = endpoint("certmanager")
    statefile.write_endpoint(tmp_path, good)
    (tmp_path / "services" / "broken.json").write_text(body)
    (tmp_path / "services" / "binary.json").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "services" / "folder.json").mkdir()

    assert statefile.read_endpoint(tmp_path, "broken") is None
    assert statefile.read_endpoints(tmp_path) == {"certmanager": good}

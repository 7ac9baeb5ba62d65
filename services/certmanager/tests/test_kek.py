"""The KEK file: made 0600 in a 0700 directory, then refused when loose or not a KEK."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from trellis_certmanager import kek
from trellis_certmanager.domain.sealed import Kek


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_first_start_makes_it_0600_in_a_0700_directory(tmp_path: Path) -> None:
    path = tmp_path / "state" / "certmanager" / "kek"
    made = kek.load_or_create(path)
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700
    assert path.read_bytes() == made.key
    assert kek.load_or_create(path) == made  # the next start reads the same KEK
    assert [p.name for p in path.parent.iterdir()] == ["kek"]  # no temporary file left


def test_a_directory_an_older_version_made_0755_is_narrowed(tmp_path: Path) -> None:
    directory = tmp_path / "certmanager"
    directory.mkdir(mode=0o755)
    (directory / "root-fingerprint").write_text("abc\n")
    kek.load_or_create(directory / "kek")
    assert mode(directory) == 0o700


def test_one_made_by_another_certmanager_meanwhile_wins(tmp_path: Path) -> None:
    path = tmp_path / "kek"
    theirs = Kek.generate()
    path.write_bytes(theirs.key)
    path.chmod(0o600)
    assert kek._create(path) == theirs  # it lost the race: it reads theirs


@pytest.mark.parametrize("loose", [0o640, 0o604, 0o660, 0o644])
def test_a_file_group_or_others_may_read_is_refused(tmp_path: Path, loose: int) -> None:
    path = tmp_path / "kek"
    path.write_bytes(os.urandom(32))
    path.chmod(loose)
    with pytest.raises(kek.KekFileError) as caught:
        kek.load_or_create(path)
    message = str(caught.value)
    assert f"has mode {loose:04o}" in message
    assert f"chmod 600 {path}" in message
    assert "\n" not in message


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the file to another user needs root")
def test_a_secret_mounted_with_the_pods_fsgroup_is_accepted(tmp_path: Path) -> None:
    """The kubelet's shape for a non-root pod: root's file, 0440, group = the fsGroup."""
    path = tmp_path / "kek"
    key = os.urandom(32)
    path.write_bytes(key)
    os.chown(path, 65532, os.getegid())
    path.chmod(0o440)
    assert kek.load_or_create(path).key == key
    path.chmod(0o444)  # others too: refused
    with pytest.raises(kek.KekFileError, match="has mode 0444"):
        kek.load_or_create(path)


def test_a_read_only_secret_mount_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "kek"
    path.write_bytes(os.urandom(32))
    path.chmod(0o400)
    assert kek.load_or_create(path).key == path.read_bytes()


@pytest.mark.parametrize("size", [0, 31, 33, 44])
def test_a_file_of_another_length_is_refused_and_kept(tmp_path: Path, size: int) -> None:
    path = tmp_path / "kek"
    path.write_bytes(b"a" * size)
    path.chmod(0o600)
    with pytest.raises(kek.KekFileError, match=f"holds {size} bytes, a KEK is exactly 32"):
        kek.load_or_create(path)
    assert path.read_bytes() == b"a" * size  # never replaced: it may be what sealed the keys


def test_a_directory_in_its_place_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "kek"
    path.mkdir(mode=0o700)
    with pytest.raises(kek.KekFileError, match="is not a regular file"):
        kek.load_or_create(path)

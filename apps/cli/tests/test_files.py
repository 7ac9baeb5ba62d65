"""The CLI's file writes never follow a link planted where a file of the mesh goes."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from trellis_cli.proxyfolder import write_file, write_private


def test_a_planted_link_is_not_followed_and_the_target_is_untouched(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    for write in (write_file, write_private):
        planted = tmp_path / f"{write.__name__}.pem"
        planted.symlink_to(target)
        with pytest.raises(OSError, match="link"):
            write(planted, "attacker-chosen\n")
        assert target.read_text() == "precious\n"


def test_files_get_their_mode_even_when_they_were_there(tmp_path: Path) -> None:
    existing = tmp_path / "key.pem"
    existing.write_text("old")
    existing.chmod(0o644)
    write_private(existing, "new")
    assert stat.S_IMODE(existing.stat().st_mode) == 0o600
    public = tmp_path / "cert.pem"
    write_file(public, "cert")
    assert (stat.S_IMODE(public.stat().st_mode), public.read_text()) == (0o644, "cert")

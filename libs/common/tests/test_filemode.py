"""Which secret files are private enough: the owner's alone, or a Secret mounted with fsGroup."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from trellis_common.filemode import loose_bits

ME, MY_GROUP = os.geteuid(), os.getegid()
SOMEONE = ME + 1000  # the kubelet (root) writes Secret files; here: anyone but us
NOT_MY_GROUP = max({MY_GROUP, *os.getgroups()}) + 1000


def info(mode: int, uid: int, gid: int) -> os.stat_result:
    return os.stat_result((stat.S_IFREG | mode, 0, 0, 1, uid, gid, 32, 0, 0, 0))


@pytest.mark.parametrize(
    ("mode", "uid", "gid", "loose"),
    [
        (0o600, ME, MY_GROUP, 0),  # the local shape
        (0o400, ME, MY_GROUP, 0),
        (0o440, SOMEONE, MY_GROUP, 0),  # a Secret mounted with the pod's fsGroup
        (0o440, ME, MY_GROUP, 0o040),  # ours: the group bit only widens it
        (0o440, SOMEONE, NOT_MY_GROUP, 0o040),  # someone else's group
        (0o460, SOMEONE, MY_GROUP, 0o060),  # group may write
        (0o444, SOMEONE, MY_GROUP, 0o044),  # others may read
        (0o644, ME, MY_GROUP, 0o044),
    ],
)
def test_only_the_owner_or_a_secret_read_through_our_group(
    mode: int, uid: int, gid: int, loose: int
) -> None:
    assert loose_bits(info(mode, uid, gid)) == loose


def test_a_state_directory_is_made_private_and_an_open_one_of_ours_is_closed(
    tmp_path: Path,
) -> None:
    from trellis_common.filemode import private_dir

    made = tmp_path / "a" / "state"
    private_dir(made)
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    opened = tmp_path / "old-state"
    opened.mkdir(mode=0o755)
    opened.chmod(0o755)
    private_dir(opened)
    assert stat.S_IMODE(opened.stat().st_mode) == 0o700

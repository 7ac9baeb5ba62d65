"""Whether a file holding a secret (a key, a password) is private enough to use.

Locally a secret file must be its owner's alone: no bit for group or others (``0600`` or
``0400``). A Kubernetes Secret mounted into a pod that runs as a non-root user cannot be
that: the kubelet writes the files as root, so the pod reads them through its ``fsGroup``,
and the kubelet adds group read to make that possible (``0440``, group = the fsGroup). That
one shape is also accepted: **group read only** (no group write or execute, nothing for
others), on a file **not owned by this process's user** and whose **group is one of this
process's groups**, so the group bit is the only way this process reads it.

:func:`loose_bits` returns the permission bits that make a file too open (0 when it is
private enough); the callers refuse the file, or warn, naming the mode.
"""

from __future__ import annotations

import os
import stat

GROUP_READ_ONLY = stat.S_IRGRP


def _our_groups() -> set[int]:
    return {os.getegid(), *os.getgroups()}


def loose_bits(info: os.stat_result) -> int:
    """The group and other permission bits of ``info`` that are not acceptable."""
    mode = stat.S_IMODE(info.st_mode)
    loose = mode & 0o077
    if loose == GROUP_READ_ONLY and mounted_through_group(info):
        return 0
    return loose


def mounted_through_group(info: os.stat_result) -> bool:
    """The fsGroup shape: someone else's file whose group is ours."""
    return info.st_uid != os.geteuid() and info.st_gid in _our_groups()


def private_dir(path: os.PathLike[str] | str) -> None:
    """Make ``path`` (and missing parents) a folder only its owner may enter: a local state
    directory holds the admin token, join tokens, keys and Redis passwords. One that exists
    with group or other bits, and is ours, loses them; someone else's is left as it is (its
    files are checked one by one where they are read)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.stat(path)
    if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, stat.S_IMODE(info.st_mode) & 0o700)

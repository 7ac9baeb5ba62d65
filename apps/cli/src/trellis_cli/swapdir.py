"""A proxy's folder, written the way the kubelet writes a Secret volume.

Every file of one version goes into a fresh ``..<time>`` folder, the ``..data`` link is
swapped to it with one ``rename``, and each visible name is a link through ``..data``; then
the previous version's folder is removed. Envoy, watching the folder, sees one move and
reloads key and certificates together, never half. The pod agent (``trellis-agent``),
``trellis vm bootstrap`` and ``trellis proxy renew`` write a proxy's folder this way.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path

from trellis_common.bootstrap import KEY_FILE

DATA_LINK = "..data"


def install(
    folder: Path, files: Mapping[str, bytes], private: Collection[str] = (KEY_FILE,)
) -> None:
    """Write ``files`` (name -> content) as one version of ``folder`` (see the module).
    The keys (``private``) are 0600 (Envoy runs as the writer's uid); a name that was a
    plain file (a folder written before this layout), or a link elsewhere, becomes the
    link through ``..data``."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
    fresh = folder / stamp
    fresh.mkdir(mode=0o755)
    for name, data in files.items():
        path = fresh / name
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if name in private else 0o644
        )
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    link = folder / DATA_LINK
    previous = os.readlink(link) if link.is_symlink() else None
    temporary = folder / "..data_tmp"
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(stamp)
    os.replace(temporary, link)
    for name in files:
        visible, target = folder / name, f"{DATA_LINK}/{name}"
        if not (visible.is_symlink() and os.readlink(visible) == target):
            # a plain file, or a link to anywhere else, is replaced in one rename
            staged = folder / f"..{name}.tmp"
            staged.unlink(missing_ok=True)
            staged.symlink_to(target)
            os.replace(staged, visible)
    if previous is not None and previous != stamp:
        shutil.rmtree(folder / previous, ignore_errors=True)

"""The key-encryption key file: made on first start, then held to strict permissions.

The KEK is what keeps the keys in Redis sealed (:mod:`trellis_certmanager.domain.sealed`),
so it must never be in Redis: it is a file (``kek_file``, by default
``<state dir>/certmanager/kek``), locally on the machine's disk, in Kubernetes a Secret
mounted with ``defaultMode: 0400``. It holds exactly 32 random bytes.

On first start (no file) certmanager makes it: mode 0600, in a directory it makes or
narrows to 0700, written to a temporary file and linked into place, so two certmanagers
starting together end up with the same KEK and neither ever reads a half-written one.

A file that exists is checked, never repaired: readable or writable by group or others
(:mod:`trellis_common.filemode`: group read alone is accepted on a Secret mounted with the
pod's fsGroup, the only way a non-root pod can read one),
not a regular file, or of another length, certmanager refuses to start with a
:class:`KekFileError` that names the file, what is wrong and the command that fixes it.
Loosening the mode is how a key leaks; a wrong length is a file that is not a KEK, and
making a new one would leave every sealed key unreadable.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

from trellis_certmanager.domain.sealed import KEK_BYTES, Kek
from trellis_common import filemode

log = logging.getLogger(__name__)

FILE_MODE = 0o600
DIR_MODE = 0o700


class KekFileError(Exception):
    """The KEK file cannot be used; the message is the one line the operator needs."""


def load_or_create(path: Path) -> Kek:
    """The KEK in ``path``, made first if there is none."""
    if not path.exists():
        return _create(path)
    return load(path)


def load(path: Path) -> Kek:
    try:
        info = path.stat()
    except OSError as exc:
        raise KekFileError(f"KEK file {path} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise KekFileError(f"KEK file {path} is not a regular file")
    if filemode.loose_bits(info):
        raise KekFileError(
            f"KEK file {path} has mode {stat.S_IMODE(info.st_mode):04o}: group or others "
            f"may read or write it; run `chmod 600 {path}` (or mount the Secret with "
            f"defaultMode 0400), then start certmanager again"
        )
    try:
        key = path.read_bytes()
    except OSError as exc:
        raise KekFileError(f"KEK file {path} cannot be read: {exc.strerror}") from None
    if len(key) != KEK_BYTES:
        raise KekFileError(
            f"KEK file {path} holds {len(key)} bytes, a KEK is exactly {KEK_BYTES} random "
            f"bytes; give the file that sealed the keys in Redis (a new one cannot unseal "
            f"them)"
        )
    return Kek(key)


def _create(path: Path) -> Kek:
    directory = path.parent
    directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if stat.S_IMODE(directory.stat().st_mode) & 0o077:
        directory.chmod(DIR_MODE)  # an older version made it 0755
        log.info("kek.directory_narrowed path=%s mode=%04o", directory, DIR_MODE)
    kek = Kek.generate()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(kek.key)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp, path)  # fails if another certmanager made it first: theirs wins
        except FileExistsError:
            return load(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    log.warning(
        "kek.created path=%s kek_id=%s action='back this file up: without it the keys in "
        "Redis cannot be read'",
        path,
        kek.id,
    )
    return kek

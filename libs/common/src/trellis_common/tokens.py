"""The admin token: one random secret per mesh, kept in the state directory.

Mutating admin routes need it as a bearer token. A service takes it from its settings
(``TRELLIS_ADMIN_TOKEN``, e.g. from a Kubernetes Secret) or from ``<state-dir>/admin-token``,
which the first service to start creates (mode 0600) and the CLI reads.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from trellis_common import filemode

TOKEN_FILE = "admin-token"


def token_path(state_dir: Path) -> Path:
    return state_dir / TOKEN_FILE


def load_or_create_admin_token(state_dir: Path, configured: str | None = None) -> str:
    """Return the configured token, else the one on disk, else a new one written 0600."""
    if configured:
        return configured
    path = token_path(state_dir)
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token
    filemode.private_dir(state_dir)
    token = secrets.token_urlsafe(32)
    # One temporary file per call: threads of one process share the pid.
    tmp = path.with_suffix(f".{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    try:
        # Another process may have won the race: keep theirs so every service agrees.
        os.link(tmp, path)
    except FileExistsError:
        existing = path.read_text().strip()
        if existing:
            token = existing
        else:  # an empty file (truncated by hand) is no token: replace it
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return token

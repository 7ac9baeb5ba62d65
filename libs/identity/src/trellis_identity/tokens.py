"""The admin token: one random secret per mesh, kept in the state directory.

Mutating admin routes need it as a bearer token. A service that checks it keeps only its
SHA-256 (:class:`AdminToken`), taken from its settings: ``TRELLIS_ADMIN_TOKEN_SHA256`` (what
the chart gives the services whose routes check it: the token itself is in no pod), else
``TRELLIS_ADMIN_TOKEN``, else ``<state-dir>/admin-token``, which the first service to start
creates (mode 0600) and the CLI reads. A service whose routes never check it never loads it.
"""

from __future__ import annotations

import hashlib
import hmac
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


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class AdminToken:
    """The admin token as a service keeps it: its SHA-256 only."""

    def __init__(self, sha256: str) -> None:
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ValueError("the admin token's SHA-256 must be 64 lowercase hex digits")
        self._digest = bytes.fromhex(sha256)

    @classmethod
    def of(cls, token: str) -> AdminToken:
        return cls(digest(token))

    def matches(self, presented: str) -> bool:
        """Whether ``presented`` is the admin token (compared in constant time)."""
        return hmac.compare_digest(hashlib.sha256(presented.encode()).digest(), self._digest)


def admin_token(state_dir: Path, configured: str | None, sha256: str | None) -> AdminToken:
    """The admin token a service checks bearers against (see the module docstring)."""
    if sha256:
        return AdminToken(sha256.strip().lower())
    return AdminToken.of(load_or_create_admin_token(state_dir, configured))

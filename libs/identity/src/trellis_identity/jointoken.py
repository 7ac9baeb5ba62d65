"""Join tokens: how a component gets its first certificate on a machine without Kubernetes.

``trellis up`` (and the test harness) writes a fresh token for a component, 0600, to
``<state-dir>/join/<component>`` just before it starts the component's process. The
component reads it, deletes it, and trades it with certmanager for its first certificate
(``POST /v1/join`` with a CSR). In Kubernetes the pod's projected ServiceAccount token plays
the same part, checked with TokenReview; the exchange is the same.

A token is ``tjt1.<component>.<expiry>.<nonce>.<mac>``: an HMAC-SHA256 over the rest under
the mesh's **join key** (``<state-dir>/join-key``, 32 random bytes, 0600, made by the first
process that needs it). Whoever can read the join key can mint tokens, exactly as whoever
can read the admin token can administer the mesh: both live in the state directory of the
operator who runs the mesh. A token names one component, expires (10 minutes by default),
and works once: certmanager records its nonce as spent until it expires.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from trellis_common import filemode
from trellis_common.components import checked

SCHEME = "tjt1"
KEY_FILE = "join-key"
TOKENS_DIR = "join"
KEY_BYTES = 32
DEFAULT_TTL = 600.0


class InvalidJoinToken(ValueError):
    """The token is not one this mesh made, or no longer valid; the message says which."""


@dataclass(frozen=True, slots=True)
class JoinClaim:
    component: str
    expires_at: int
    nonce: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _private_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, mode 0600, in a directory of mode 0700 (atomic)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def key_path(state_dir: Path) -> Path:
    return state_dir / KEY_FILE


def load_or_create_key(path: Path) -> bytes:
    """The join key at ``path``; made (0600) if missing. A key file that others may read,
    or of the wrong length, is refused: it would let them mint identities."""
    if not path.exists():
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first: use theirs
            pass
        else:
            with os.fdopen(fd, "wb") as fh:
                fh.write(secrets.token_bytes(KEY_BYTES))
    info = path.stat()
    mode = info.st_mode & 0o777
    if filemode.loose_bits(info):
        raise InvalidJoinToken(f"{path} is readable by others (mode {mode:o}): chmod 600 {path}")
    key = path.read_bytes()
    if len(key) != KEY_BYTES:
        raise InvalidJoinToken(f"{path} must hold exactly {KEY_BYTES} bytes, has {len(key)}")
    return key


def _mac(key: bytes, body: str) -> str:
    return _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())


def mint(key: bytes, component: str, ttl: float = DEFAULT_TTL, now: float | None = None) -> str:
    expires = int((time.time() if now is None else now) + ttl)
    body = f"{SCHEME}.{checked(component)}.{expires}.{_b64(secrets.token_bytes(16))}"
    return f"{body}.{_mac(key, body)}"


def is_join_token(token: str) -> bool:
    """Whether ``token`` has the join token's form (else it may be a ServiceAccount token)."""
    return token.startswith(SCHEME + ".")


def verify(key: bytes, token: str, now: float | None = None) -> JoinClaim:
    """The claim of a token this mesh made and that has not expired; spent-ness is the
    caller's to check (it needs a store)."""
    parts = token.split(".")
    if len(parts) != 5 or parts[0] != SCHEME:
        raise InvalidJoinToken("not a join token")
    body, mac = ".".join(parts[:4]), parts[4]
    if not hmac.compare_digest(_mac(key, body), mac):
        raise InvalidJoinToken("not made with this mesh's join key")
    component, expiry, nonce = parts[1], parts[2], parts[3]
    try:
        checked(component)
        expires_at = int(expiry)
    except ValueError as exc:
        raise InvalidJoinToken(str(exc)) from None
    if expires_at < (time.time() if now is None else now):
        raise InvalidJoinToken("expired")
    return JoinClaim(component, expires_at, nonce)


def token_path(state_dir: Path, component: str) -> Path:
    return state_dir / TOKENS_DIR / checked(component)


def write_token(state_dir: Path, component: str, ttl: float = DEFAULT_TTL) -> Path:
    """Mint a token for ``component`` and leave it (0600) where the component looks."""
    path = token_path(state_dir, component)
    _private_file(path, mint(load_or_create_key(key_path(state_dir)), component, ttl).encode())
    return path


def take_token(path: Path) -> str:
    """Read the token at ``path`` and delete the file: a token is used once."""
    token = path.read_text().strip()
    path.unlink(missing_ok=True)
    return token

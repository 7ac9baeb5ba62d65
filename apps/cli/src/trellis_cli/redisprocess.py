"""The ``redis-server`` command line ``trellis up`` runs, for a lone Redis or a Sentinel set.

One place for the options every Redis of a local mesh has (:func:`server_argv`): it
persists every write (AOF, fsync always), rewrites its append-only file once it has
doubled since the last rewrite and is past :data:`AOF_REWRITE_MIN_SIZE` (so steady churn
does not grow the file without bound), keeps its data in a 0700 directory (what Redis
holds, sealed keys, certificates, registrations, is for the mesh's processes only), and
reads its users from an aclfile. A Redis of a Sentinel set (:mod:`trellis_cli.sentinel`)
also has a config file, given first, which holds its replication login and role.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from trellis_cli.errors import CliError

# Rewrite the AOF when it has grown by this percentage since the last rewrite...
AOF_REWRITE_PERCENTAGE = 100
# ...and is at least this big (Redis' own syntax).
AOF_REWRITE_MIN_SIZE = "64mb"


def find_binary() -> str:
    """The ``redis-server`` on PATH (a sentinel is ``redis-server --sentinel``)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise CliError(
            "redis-server not found: `apt-get install redis-server` (make run does it), "
            "or point TRELLIS_REDIS_URL at a Redis you run"
        )
    return binary


def private_dir(path: Path) -> Path:
    """Make ``path`` (0700); one made by an older version is narrowed: it holds the mesh's
    state."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def server_argv(
    binary: str, *, port: int, data: Path, aclfile: Path, config: Path | None = None
) -> list[str]:
    """A Redis on 127.0.0.1:``port`` keeping its data in ``data`` (see the module
    docstring); ``config`` comes first when given (options on the command line win over
    it)."""
    return [
        binary,
        *([str(config.resolve())] if config is not None else []),
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--dir", str(data.resolve()),
        "--appendonly", "yes",
        "--appendfsync", "always",
        "--auto-aof-rewrite-percentage", str(AOF_REWRITE_PERCENTAGE),
        "--auto-aof-rewrite-min-size", AOF_REWRITE_MIN_SIZE,
        "--save", "",
        "--protected-mode", "yes",
        "--daemonize", "no",
        "--loglevel", "warning",
        "--aclfile", str(aclfile.resolve()),
    ]  # fmt: skip

"""The configuration files of a Redis under Sentinel: one for each Redis, one per sentinel.

``trellis up --redis-sentinel`` (:mod:`trellis_cli.sentinel`) and the tests' Sentinel Redis
(:mod:`trellis_testing.redis_sentinel`) run the same set: a master, its replicas and
three sentinels, all ``redis-server`` (a sentinel is ``redis-server <file> --sentinel``).
This module writes their files, so both run what the other runs.

What must be in a file rather than on the command line:

* the secrets: a replica logs in to its master as :data:`~trellis_runtime.redisacl.REPLICATION`
  (``masteruser``/``masterauth``), a sentinel to Redis and to the other sentinels as
  :data:`~trellis_runtime.redisacl.SENTINEL`; and a sentinel's own ACL (``user`` lines:
  Sentinel reads no aclfile). A command line is readable by every local user, a file
  written 0600 is not;
* the topology: which Redis replicates which. Each Redis also has the replication login,
  because a failover can make any of them a replica. The sentinels rewrite these files
  (``CONFIG REWRITE``) when they promote a replica or turn an old master into a replica,
  and rewrite their own with what they learnt (the replicas, the other sentinels, the
  epoch). So a file that exists is kept, but for its logins and ACL lines
  (:func:`write_config`): a restart must come back with the roles as the last failover
  left them, not as they were first set up (a stale master brought back as master would
  have the new master's writes replaced by its old data).

Failure detection is quick by default (``down-after-milliseconds`` 1000, as the tests
want; the Helm chart uses 5000): the clients' retries
(:data:`trellis_runtime.redisconn.FAILOVER_SECONDS`) cover a failover of a set whose
``down-after-milliseconds`` is up to about 10 s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trellis_runtime import redisacl

#: The master's name under Sentinel (``sentinel monitor <name>``).
DEFAULT_MASTER_NAME = "trellis"


@dataclass(frozen=True)
class FailoverTiming:
    """How fast the sentinels act: the master is down after ``down_after_ms`` of silence
    (then a majority must agree); a failover that stalls is retried after
    ``failover_timeout_ms``."""

    down_after_ms: int = 1000
    failover_timeout_ms: int = 5000


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path``, readable by its owner only (0600 before the data)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        os.fchmod(file.fileno(), 0o600)
        file.write(text)
    return path


def node_config(passwords: Mapping[str, str], master: tuple[str, int] | None) -> str:
    """A Redis of the set: how it logs in to a master, and the master it replicates
    (``None``: it is the master). The rest of its options are on its command line."""
    lines = [
        f"masteruser {redisacl.REPLICATION}",
        f"masterauth {passwords[redisacl.REPLICATION]}",
        # a replica that lost its master answers reads from its data while it reconnects;
        # the control plane writes only, through the master
        "replica-serve-stale-data yes",
        "replica-read-only yes",
    ]
    if master is not None:
        lines.append(f"replicaof {master[0]} {master[1]}")
    return "\n".join(lines) + "\n"


def sentinel_config(
    *,
    bind: str,
    port: int,
    dir: Path,
    master: tuple[str, int],
    passwords: Mapping[str, str],
    master_name: str = DEFAULT_MASTER_NAME,
    quorum: int = 2,
    timing: FailoverTiming = FailoverTiming(),
    logfile: str = "",
) -> str:
    """A sentinel watching ``master`` (``quorum`` sentinels must agree it is down), with
    its ACL (:func:`~trellis_runtime.redisacl.sentinel_acl_lines`)."""
    name = master_name
    sentinel_password = passwords[redisacl.SENTINEL]
    lines = [
        f"bind {bind}",
        f"port {port}",
        f'dir "{dir}"',
        *([f'logfile "{logfile}"'] if logfile else []),
        "daemonize no",
        "sentinel resolve-hostnames no",
        f"sentinel monitor {name} {master[0]} {master[1]} {quorum}",
        f"sentinel down-after-milliseconds {name} {timing.down_after_ms}",
        f"sentinel failover-timeout {name} {timing.failover_timeout_ms}",
        f"sentinel parallel-syncs {name} 1",
        f"sentinel auth-user {name} {redisacl.SENTINEL}",
        f"sentinel auth-pass {name} {sentinel_password}",
        f"sentinel sentinel-user {redisacl.SENTINEL}",
        f"sentinel sentinel-pass {sentinel_password}",
        *redisacl.sentinel_acl_lines(passwords),
    ]
    return "\n".join(lines) + "\n"


#: The lines a file gets again at every start: the logins and the ACL (a password file
#: deleted to rotate it must be followed), and no line the sentinels may have rewritten.
_LOGIN_LINES = (
    "user ",
    "masteruser ",
    "masterauth ",
    "sentinel auth-user ",
    "sentinel auth-pass ",
    "sentinel sentinel-user ",
    "sentinel sentinel-pass ",
)


def write_config(path: Path, text: str) -> Path:
    """Write a Redis's or a sentinel's file (0600). One that exists keeps what the sentinels
    wrote in it (roles, epochs, peers: see the module docstring); only its logins and ACL
    lines are replaced by those of ``text``."""
    if path.exists():
        kept = [line for line in path.read_text().splitlines() if not line.startswith(_LOGIN_LINES)]
        fresh = [line for line in text.splitlines() if line.startswith(_LOGIN_LINES)]
        text = "\n".join([*kept, *fresh]) + "\n"
    return write_private(path, text)


def read_passwords(password_files: Mapping[str, Path]) -> dict[str, str]:
    return {name: file.read_text().strip() for name, file in password_files.items()}


#: The users of a Redis under Sentinel: the components', the operator's, and the two the
#: set uses itself.
USERS = (redisacl.ADMIN, *redisacl.COMPONENTS, redisacl.REPLICATION, redisacl.SENTINEL)

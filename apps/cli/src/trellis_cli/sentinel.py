"""``trellis up --redis-sentinel``: a local Redis with failover, for the HA mesh.

Three Redis servers and three sentinels, each a process of the supervisor:

* ``redis-0`` (port 16380) is the master at the first start, ``redis-1`` and ``redis-2``
  (16381, 16382) its replicas. Each is the Redis of a lone ``trellis up``
  (:func:`trellis_cli.redisprocess.server_argv`: AOF fsynced on every write, ACL on) with
  its data in ``<state>/redis-sentinel/redis-<n>/`` and a config file there
  (:mod:`trellis_runtime.sentinelconf`) with its replication login and, for a replica, its
  master. After a failover the sentinels rewrite those files, so a restarted mesh keeps
  the roles the last failover left.
* ``sentinel-0..2`` (16390-16392) watch them (``redis-server <file> --sentinel``; the file,
  in ``<state>/redis-sentinel/sentinel-<n>/``, is the sentinel's own to rewrite): two must
  agree that the master is down, after ``down-after-milliseconds`` (1000: a local mesh
  fails over in about 2 to 4 s).

The ports sit above the lone Redis's 16379 and below the tests' ports (from 20000); the
lone Redis is not started beside them.

Users: the components' (same password files as a lone Redis, ``<state>/redis/users/``),
``admin``, and the two the set uses itself, ``replication`` and ``sentinel``
(:mod:`trellis_runtime.redisacl`). The services are given :func:`sentinel_specs`'s URL,
``redis+sentinel://127.0.0.1:16390,127.0.0.1:16391,127.0.0.1:16392/trellis/0``, with their
user and password file as with a lone Redis, and should wait for one replica on their
durable writes (``TRELLIS_REDIS_MIN_REPLICAS_ACK=1``).
"""

from __future__ import annotations

from pathlib import Path

from trellis_cli import redisprocess
from trellis_cli.supervisor import ProcessSpec, tcp_ready
from trellis_runtime import redisacl, sentinelconf
from trellis_runtime.sentinelconf import FailoverTiming

HOST = "127.0.0.1"
#: The Redis servers: the first is the master at the first start.
REDIS_PORTS = (16380, 16381, 16382)
#: The sentinels.
SENTINEL_PORTS = (16390, 16391, 16392)
#: Where the set keeps its data, under the state directory.
DIRECTORY = "redis-sentinel"
MASTER_NAME = sentinelconf.DEFAULT_MASTER_NAME


def sentinel_url(sentinel_ports: tuple[int, ...] = SENTINEL_PORTS) -> str:
    """The URL the services are given (no credentials: each has its own user)."""
    hosts = ",".join(f"{HOST}:{port}" for port in sentinel_ports)
    return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"


def sentinel_specs(
    state_dir: Path,
    timing: FailoverTiming | None = None,
    *,
    redis_ports: tuple[int, ...] = REDIS_PORTS,
    sentinel_ports: tuple[int, ...] = SENTINEL_PORTS,
) -> tuple[list[ProcessSpec], str]:
    """The processes of the set (Redis servers first, then the sentinels, which start once
    every Redis is up) and the URL the services should use. The ports are the defaults
    above but for a test's."""
    binary = redisprocess.find_binary()
    users = redisacl.ensure_passwords(state_dir / "redis" / "users", sentinelconf.USERS)
    passwords = sentinelconf.read_passwords(users)
    base = redisprocess.private_dir(state_dir / DIRECTORY)
    first = (HOST, redis_ports[0])
    specs: list[ProcessSpec] = []
    for number, port in enumerate(redis_ports):
        name = f"redis-{number}"
        data = redisprocess.private_dir(base / name)
        master = None if number == 0 else first
        config = sentinelconf.write_config(
            data / "redis.conf", sentinelconf.node_config(passwords, master)
        )
        specs.append(
            ProcessSpec(
                name=name,
                argv=redisprocess.server_argv(
                    binary,
                    port=port,
                    data=data,
                    aclfile=redisacl.write_aclfile(data / "users.acl", users),
                    config=config,
                ),
                ready=tcp_ready(HOST, port),
                ports=(port,),
                address=f"redis://{HOST}:{port} ({'master' if master is None else 'replica'}"
                " at first)",
            )
        )
    redis_names = tuple(spec.name for spec in specs)
    for number, port in enumerate(sentinel_ports):
        name = f"sentinel-{number}"
        data = redisprocess.private_dir(base / name)
        config = sentinelconf.write_config(
            data / "sentinel.conf",
            sentinelconf.sentinel_config(
                bind=HOST,
                port=port,
                dir=data.resolve(),
                master=first,
                passwords=passwords,
                master_name=MASTER_NAME,
                timing=timing or FailoverTiming(),
            ),
        )
        specs.append(
            ProcessSpec(
                name=name,
                argv=[binary, str(config.resolve()), "--sentinel"],
                ready=tcp_ready(HOST, port),
                ports=(port,),
                address=f"sentinel {HOST}:{port} (master {MASTER_NAME!r})",
                after=redis_names,
            )
        )
    return specs, sentinel_url(sentinel_ports)

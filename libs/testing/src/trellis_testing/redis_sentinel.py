"""A real Redis under Sentinel for tests: a master, two replicas and three sentinels.

Tests of a failover need the real thing: ``redis-server`` processes on 127.0.0.1, the
Redis ones with the append-only file and ACL of :class:`RedisServer` (each is one, with a
config file besides), the sentinels ``redis-server <file> --sentinel``. Their files are
those ``trellis up --redis-sentinel`` writes (:mod:`trellis_runtime.sentinelconf`): the
replicas log in to the master as ``replication``, the sentinels to Redis and to each other
as ``sentinel``, and each component has its user on Redis and on the sentinels, with one
password file per user in ``<dir>/users/``.

:attr:`SentinelRedis.url` is a ``redis+sentinel://`` URL that logs in as ``admin``;
:meth:`SentinelRedis.target` logs in as a component. :meth:`SentinelRedis.kill_master`
SIGKILLs the master and :meth:`SentinelRedis.wait_failover` returns once the sentinels
name a promoted replica (about 2 to 4 s with the fast timing here).

The methods block (they poll with a synchronous client): an async test runs them with
``asyncio.to_thread``.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from redis.exceptions import RedisError

from trellis_runtime import redisacl, sentinelconf
from trellis_runtime.redisconn import RedisTarget
from trellis_runtime.sentinelconf import FailoverTiming
from trellis_testing.redis_server import RedisServer, RedisServerError

HOST = "127.0.0.1"


class ReplicatedRedis(RedisServer):
    """One Redis of the set: replicating ``master`` (``None``: it is the master) at its
    first start; after that, whatever the sentinels rewrote in its config file."""

    def __init__(self, dir: Path, users_dir: Path, master: RedisServer | None) -> None:
        super().__init__(dir=dir, users_dir=users_dir, users=sentinelconf.USERS)
        self._master = master
        self.config_file = self.dir / "redis.conf"

    def prepare(self) -> bytes:
        login = super().prepare()
        passwords = sentinelconf.read_passwords(
            {name: self.password_file(name) for name in sentinelconf.USERS}
        )
        master = None if self._master is None else (HOST, self._master.port)
        sentinelconf.write_config(self.config_file, sentinelconf.node_config(passwords, master))
        return login

    def config_args(self) -> list[str]:
        return [str(self.config_file)]


class SentinelProcess(RedisServer):
    """One sentinel watching the set's first master (its ACL in its config file)."""

    def __init__(
        self, dir: Path, users_dir: Path, master: RedisServer, name: str, timing: FailoverTiming
    ) -> None:
        super().__init__(dir=dir, users_dir=users_dir, users=sentinelconf.USERS)
        self._master = master
        self._name = name
        self._timing = timing
        self.config_file = self.dir / "sentinel.conf"

    def prepare(self) -> bytes:
        files = redisacl.ensure_passwords(self.users_dir, self.users)
        text = sentinelconf.sentinel_config(
            bind=HOST,
            port=self.port,
            dir=self.dir,
            master=(HOST, self._master.port),
            passwords=sentinelconf.read_passwords(files),
            master_name=self._name,
            timing=self._timing,
            logfile=str(self.log_path),
        )
        sentinelconf.write_config(self.config_file, text)
        return f"AUTH {redisacl.ADMIN} {self.password(redisacl.ADMIN)}\r\n".encode()

    def config_args(self) -> list[str]:
        return [str(self.config_file)]

    def server_args(self, *, bind: str, port: int, dir: str) -> list[str]:
        return ["--sentinel", "--bind", bind, "--port", str(port)]


class SentinelRedis:
    """A master, ``replicas`` replicas and ``sentinels`` sentinels in ``dir`` (a temporary
    directory without it, removed by :meth:`close`)."""

    def __init__(
        self,
        dir: Path | str | None = None,
        *,
        replicas: int = 2,
        sentinels: int = 3,
        master_name: str = sentinelconf.DEFAULT_MASTER_NAME,
        timing: FailoverTiming | None = None,
        startup_timeout: float = 30.0,
    ) -> None:
        self._own_dir = dir is None
        self.dir = Path(tempfile.mkdtemp(prefix="trellis-sentinel-") if dir is None else dir)
        self.users_dir = self.dir / "users"
        self.master_name = master_name
        self._timeout = startup_timeout
        self._killed: int | None = None
        first = ReplicatedRedis(self.dir / "redis-0", self.users_dir, None)
        self.nodes: list[ReplicatedRedis] = [first] + [
            ReplicatedRedis(self.dir / f"redis-{n}", self.users_dir, first)
            for n in range(1, replicas + 1)
        ]
        self.sentinels = [
            SentinelProcess(
                self.dir / f"sentinel-{n}",
                self.users_dir,
                first,
                master_name,
                timing or FailoverTiming(),
            )
            for n in range(sentinels)
        ]

    # --- where and who -------------------------------------------------------------------

    def _hosts(self) -> str:
        return ",".join(f"{HOST}:{s.port}" for s in self.sentinels)

    @property
    def plain_url(self) -> str:
        """The Sentinel URL without credentials."""
        return f"redis+sentinel://{self._hosts()}/{self.master_name}/0"

    @property
    def url(self) -> str:
        """The Sentinel URL as ``admin`` (every key and command, on Redis and sentinels)."""
        admin = redisacl.ADMIN
        return (
            f"redis+sentinel://{admin}:{self.password(admin)}@{self._hosts()}/{self.master_name}/0"
        )

    def password_file(self, user: str) -> Path:
        return self.users_dir / user

    def password(self, user: str) -> str:
        return self.password_file(user).read_text().strip()

    def target(self, user: str) -> RedisTarget:
        """Where to connect as ``user`` (a component, or ``admin``), through the sentinels."""
        return RedisTarget.create(self.plain_url, user, self.password_file(user))

    def service_env(self, component: str) -> dict[str, str]:
        """The environment a service process needs to log in as ``component``, and to wait
        for a replica on its durable writes."""
        return {
            "TRELLIS_REDIS_URL": self.plain_url,
            "TRELLIS_REDIS_USERNAME": component,
            "TRELLIS_REDIS_PASSWORD_FILE": str(self.password_file(component)),
            "TRELLIS_REDIS_MIN_REPLICAS_ACK": "1",
        }

    # --- life ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the Redis servers, wait for the replicas to be in sync, then the sentinels,
        and wait until each sentinel knows every replica and every other sentinel (before
        that, they could not agree on a failover)."""
        for node in self.nodes:
            node.start()
        for node in self.nodes[1:]:
            self._until(functools.partial(self._in_sync, node), f"replica on {node.port} in sync")
        for sentinel in self.sentinels:
            sentinel.start()
        peers, replicas = len(self.sentinels) - 1, len(self.nodes) - 1
        for sentinel in self.sentinels:
            self._until(
                functools.partial(self._knows, sentinel, peers, replicas),
                f"sentinel on port {sentinel.port} knows {peers} sentinels, {replicas} replicas",
            )

    def _in_sync(self, replica: ReplicatedRedis) -> bool:
        info = self._ask(replica, lambda c: c.info("replication"))
        return bool(info) and info.get("master_link_status") == "up"

    def _knows(self, sentinel: SentinelProcess, peers: int, replicas: int) -> bool:
        state = self._ask(sentinel, lambda c: c.sentinel_master(self.master_name))
        return bool(
            state
            and int(state["num-other-sentinels"]) >= peers
            and int(state["num-slaves"]) >= replicas
        )

    def stop(self) -> None:
        """Stop every process (SIGTERM), the sentinels first."""
        for server in [*self.sentinels, *self.nodes]:
            server.stop()

    def close(self) -> None:
        """Kill every process and remove a directory this object made."""
        for server in [*self.sentinels, *self.nodes]:
            server.kill()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SentinelRedis:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- failover ------------------------------------------------------------------------

    def master_port(self) -> int:
        """The master's port, as the first sentinel that answers names it."""
        for sentinel in self.sentinels:
            if sentinel.running:
                address = self._master_address(sentinel)
                if address:
                    return int(address[1])
        raise RedisServerError(f"no sentinel names a master for {self.master_name!r}")

    def master(self) -> ReplicatedRedis:
        port = self.master_port()
        return next(node for node in self.nodes if node.port == port)

    def kill_master(self) -> int:
        """SIGKILL the master; return its port."""
        master = self.master()
        master.kill()
        self._killed = master.port
        return master.port

    def wait_failover(self, old_port: int | None = None, timeout: float = 30.0) -> int:
        """Wait until every running sentinel names a master other than ``old_port`` (default:
        the one :meth:`kill_master` killed last), and that Redis says it is a master; return
        its port."""
        if old_port is None:
            if self._killed is None:
                raise RedisServerError("no master was killed: name the old master's port")
            old_port = self._killed

        def promoted() -> bool:
            ports = set()
            for sentinel in self.sentinels:
                if sentinel.running:
                    address = self._master_address(sentinel)
                    ports.add(int(address[1]) if address else old_port)
            if len(ports) != 1 or old_port in ports:
                return False
            node = next((n for n in self.nodes if n.port in ports), None)
            role = None if node is None else self._ask(node, lambda c: c.role())
            return role is not None and role[0] == b"master"

        self._until(
            promoted, f"a replica promoted in place of the master on port {old_port}", timeout
        )
        return self.master_port()

    # --- plumbing ------------------------------------------------------------------------

    def _master_address(self, sentinel: SentinelProcess) -> Any:
        return self._ask(sentinel, lambda c: c.sentinel_get_master_addr_by_name(self.master_name))

    def _ask(self, server: RedisServer, command: Callable[[redis.Redis], Any]) -> Any:
        """One command as ``admin`` (None when the server does not answer)."""
        client = redis.Redis(
            host=HOST,
            port=server.port,
            username=redisacl.ADMIN,
            password=self.password(redisacl.ADMIN),
            socket_timeout=2.0,
            socket_connect_timeout=2.0,
            driver_info=None,
        )
        try:
            return command(client)
        except (RedisError, OSError):
            return None
        finally:
            client.close()

    def _until(self, check: Callable[[], object], what: str, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (self._timeout if timeout is None else timeout)
        while not check():
            if time.monotonic() > deadline:
                raise RedisServerError(f"timed out waiting for: {what} (logs in {self.dir})")
            time.sleep(0.05)

"""Connecting to Redis: a client that rides over restarts, and waiting for it at start-up.

redis-py 8 gives clients made by ``from_url`` no retries; a service's commands should
survive a Redis restart, so :func:`connect` adds bounded retries with backoff. (The
signaling subscriber makes its own client without retries, on purpose: it must notice
every reconnect and resync.)

A Redis that is down is not the only failure: a frozen one (a stopped process, a dead
network path) accepts TCP connections and never answers. So every client has a connect
timeout and a socket timeout, and only *connection* errors are retried: a restart is over
in a few seconds, while retrying a timeout against a frozen server would multiply the
wait by the number of retries. A command therefore fails within about ``socket_timeout``
on a frozen Redis, and within about 3 s of retries on one that is down; callers that must
answer faster (a REST call) bound their own wait and fall back to the state they hold.

Credentials: Redis has one ACL user per component (:mod:`trellis_runtime.redisacl`). A
service gets its user from a :class:`RedisTarget`: the URL's own ``user:password@`` (an
external Redis, a URL from a Secret), or ``redis_password_file`` (``trellis up`` writes one
0600 file per component; in Kubernetes a Secret mounted as a file) with ``redis_username``,
else the URL's user, else the service's name. The password is read from the file, never
put on a command line, and never printed: :meth:`RedisTarget.describe` and the URL it
logs carry no password. A refused login (wrong password, user off) is not retried
forever as if Redis were down: :func:`wait_for_redis` logs it and raises
:class:`RedisRefused`, which names the user and where its password came from.

Redis under Sentinel: a ``redis+sentinel://`` URL (:mod:`trellis_runtime.sentinelurl` has
the format) gives a client of redis-py's ``Sentinel.master_for``, which asks a sentinel
where the master is each time it opens a connection. A failover then looks to the client
like a restart that lasts longer: the old master's connections break (or it answers
READONLY, once demoted, which redis-py turns into a connection error), and the sentinels
name the old master, or none, until a replica is promoted. So a Sentinel client retries
connection errors for about :data:`FAILOVER_SECONDS` instead of 3 s, which covers a
failover of sentinels whose ``down-after-milliseconds`` is up to about 10 s (``trellis up``
and the tests use 1 s, the Helm chart 5 s).

Durable writes: Redis replicates asynchronously, so a write the master acknowledged can be
lost in a failover if no replica had it yet. A write that must survive one (a VM
registration, a certificate record, a revocation) is followed by :func:`replicated`, which
returns once ``replicas`` replicas have everything the master had acknowledged until then
(``WAIT``), and raises :class:`NotReplicated` otherwise, so the caller answers an error
rather than a promise it may not keep. The sentinels promote the replica that is furthest
along, so such a write survives the loss of the master.
"""

from __future__ import annotations

import asyncio
import logging
import stat
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from trellis_common import filemode
from trellis_common.backoff import Backoff, RetryCallState, failure, retrying
from trellis_runtime import sentinelurl

log = logging.getLogger(__name__)


#: Seconds to open a TCP connection (and finish the handshake) to Redis.
CONNECT_TIMEOUT = 2.0
#: Seconds to wait for Redis to answer one command.
SOCKET_TIMEOUT = 5.0
#: Retries of a plain Redis's client (about 3.5 s of backoff in all: a restart)...
RETRIES = 6
#: ...and of a Sentinel client: about this many seconds of backoff, a failover.
FAILOVER_SECONDS = 17.5
FAILOVER_RETRIES = 20
#: The client's backoff between two retries (test_redisconn checks the sums above).
BACKOFF = ExponentialBackoff(cap=1.0, base=0.05)
#: Milliseconds :func:`replicated` waits for the replicas by default.
REPLICATION_TIMEOUT_MS = 2000


class RedisRefused(RuntimeError):
    """Redis refused our credentials: retrying will not help, the operator must act."""


class NotReplicated(RedisError):
    """Fewer replicas than required acknowledged a write: a failover could lose it."""


@dataclass(frozen=True)
class RedisTarget:
    """Where Redis is and who we are there. No password shows in ``repr``."""

    url: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def create(
        cls, url: str, username: str = "", password_file: Path | None = None, service: str = ""
    ) -> RedisTarget:
        """From settings: see the module docstring for which user is chosen.

        Raises ``ValueError`` naming the file when it cannot be read or is empty.
        """
        if password_file is None:
            return cls(url)
        try:
            info = password_file.stat()
            password = password_file.read_text().strip()
        except OSError as exc:
            raise ValueError(
                f"redis_password_file {str(password_file)!r} cannot be read: {exc.strerror}"
            ) from exc
        if not password:
            raise ValueError(f"redis_password_file {str(password_file)!r} is empty")
        if filemode.loose_bits(info):
            log.warning(
                "redis.password_file_open path=%s mode=%o advice=chmod 600",
                password_file,
                stat.S_IMODE(info.st_mode),
            )
        user = username or unquote(urlsplit(url).username or "") or service or None
        return cls(url, user, password)

    def describe(self) -> str:
        """``host:port/db user=name`` (``sentinel[h1:26379,...]/master/db user=name``): what
        a log line may say about this target."""
        parts = urlsplit(self.url)
        user = self.username or unquote(parts.username or "") or "default"
        if sentinelurl.is_sentinel(self.url):
            return f"{sentinelurl.SentinelUrl.parse(self.url).describe()} user={user}"
        where = f"{parts.hostname}:{parts.port or 6379}{parts.path or '/0'}"
        return f"{where} user={user}"

    def __repr__(self) -> str:
        """No password, neither ``password`` nor the URL's own."""
        return f"RedisTarget({sentinelurl.redacted(self.url)!r}, username={self.username!r})"

    @property
    def sentinel(self) -> bool:
        """Whether Redis is reached through its sentinels."""
        return sentinelurl.is_sentinel(self.url)

    def client_options(self) -> dict[str, object]:
        """Keywords for ``Redis.from_url``: the user (if not the URL's), and no CLIENT
        SETINFO (a command our ACL users are not given: Redis 7.2+ would log every
        connect as a refusal)."""
        options: dict[str, object] = {"driver_info": None}
        if self.password is not None:
            options["username"] = self.username
            options["password"] = self.password
        return options


def as_target(target: str | RedisTarget) -> RedisTarget:
    return target if isinstance(target, RedisTarget) else RedisTarget(target)


class _OwnedSentinelPool(SentinelConnectionPool):
    """The pool of one client's :class:`Sentinel`: closing the client closes the clients
    of the sentinels too (redis-py leaves them open)."""

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            await self.sentinel_manager.aclose()


def client(target: str | RedisTarget, **options: object) -> aioredis.Redis:
    """A client of ``target`` (a ``redis://``, ``unix://`` or ``redis+sentinel://`` URL)
    with the connection ``options`` of ``Redis.from_url`` (retry, timeouts...).

    For a Sentinel URL, the sentinels are asked with the same timeouts, once each (no
    retries: the client's own retry covers them), logged in as the URL says.
    Raises ``ValueError`` for a bad Sentinel URL or an unreadable sentinel password file.
    """
    target = as_target(target)
    credentials = target.client_options()
    if not target.sentinel:
        return aioredis.Redis.from_url(target.url, **options, **credentials)  # type: ignore[arg-type]  # redis-py: typed **kwargs
    where = sentinelurl.SentinelUrl.parse(target.url)
    if target.password is None:  # the URL's own user and password, as from_url reads them
        credentials.update(username=where.username, password=where.password)
    username, password = where.sentinel_login(
        credentials.get("username"),  # type: ignore[arg-type]  # str | None, set above
        credentials.get("password"),  # type: ignore[arg-type]
    )
    asking = {k: v for k, v in options.items() if k.startswith("socket_")}
    sentinel = Sentinel(  # type: ignore[no-untyped-call]  # redis-py: untyped
        list(where.sentinels),
        sentinel_kwargs={
            **asking,
            "retry": Retry(NoBackoff(), 0),
            "driver_info": None,
            "username": username,
            "password": password,
        },
    )
    return sentinel.master_for(  # type: ignore[no-any-return]  # redis-py: untyped
        where.master,
        redis_class=aioredis.Redis,
        connection_pool_class=_OwnedSentinelPool,
        db=where.db,
        **options,
        **credentials,
    )


def connect(
    target: str | RedisTarget,
    *,
    retries: int | None = None,
    health_check_interval: float = 5.0,
    connect_timeout: float = CONNECT_TIMEOUT,
    socket_timeout: float = SOCKET_TIMEOUT,
) -> aioredis.Redis:
    """A client whose commands retry with backoff across a restart (about 3 s in all) or,
    through Sentinel, a failover (about :data:`FAILOVER_SECONDS`).

    Connection errors are retried; a timeout (a frozen Redis) is raised at once.
    """
    target = as_target(target)
    if retries is None:
        retries = FAILOVER_RETRIES if target.sentinel else RETRIES
    return client(
        target,
        retry=Retry(
            BACKOFF,
            retries,
            supported_errors=(RedisConnectionError,),
        ),
        retry_on_error=[RedisConnectionError, ConnectionResetError],
        health_check_interval=health_check_interval,
        socket_connect_timeout=connect_timeout,
        socket_timeout=socket_timeout,
        socket_keepalive=True,
    )


async def replicated(
    redis: aioredis.Redis,
    *,
    replicas: int,
    timeout_ms: int = REPLICATION_TIMEOUT_MS,
    prefix: str = "trellis",
) -> int:
    """Wait until ``replicas`` replicas have every write this process's Redis acknowledged
    so far; return how many did (0 at once when ``replicas`` is 0: nothing is asked).

    ``WAIT`` counts the writes of its own connection only, and a pool spreads commands over
    several; so a write on the connection that waits comes first, a barrier that follows
    every write already acknowledged, on any connection (a ``PUBLISH`` nobody receives on
    the user's own control channel, ``<prefix>:subscriber:<user>:replicated``: Redis
    replicates it, and every user may publish there). Both run on one connection, without
    command retries: if it breaks (a failover under way) this raises instead of asking a new
    master, which may not have the write; and through Sentinel, a master that changed while
    the connection was taken (the write's master was lost) raises :class:`NotReplicated`.
    (Not covered: another task of this process reconnecting to a new master between the
    write and this call; that needs a failover inside that instant.) Raises
    :class:`NotReplicated` when fewer replicas answered within ``timeout_ms``, and redis-py's
    connection errors as they come.
    """
    if replicas <= 0:
        return 0
    pool = redis.connection_pool
    master = pool.master_address if isinstance(pool, SentinelConnectionPool) else None
    user = pool.connection_kwargs.get("username") or "default"
    barrier = f"{prefix}:subscriber:{user}:replicated"
    connection = await pool.get_connection()  # type: ignore[no-untyped-call]  # redis-py
    try:
        await connection.send_command("PUBLISH", barrier, "")
        await connection.read_response()
        await connection.send_command("WAIT", replicas, timeout_ms)
        acked = int(await connection.read_response(timeout=timeout_ms / 1000 + SOCKET_TIMEOUT))
    except BaseException:
        await connection.disconnect()
        raise
    finally:
        await pool.release(connection)
    if isinstance(pool, SentinelConnectionPool) and pool.master_address != master:
        log.warning("redis.not_replicated reason=failover")
        raise NotReplicated(
            "Redis: the master changed (a failover) between the write and the wait for its "
            "replicas; the write may be lost, so it is not acknowledged"
        )
    if acked < replicas:
        log.warning(
            "redis.not_replicated replicas=%d required=%d timeout_ms=%d",
            acked,
            replicas,
            timeout_ms,
        )
        raise NotReplicated(
            f"Redis: {acked} of the {replicas} replica(s) required acknowledged the write "
            f"within {timeout_ms} ms (WAIT); it is on the master only and a failover could "
            "lose it, so it is not acknowledged (check the replicas: INFO replication)"
        )
    return acked


async def wait_for_redis(
    redis: aioredis.Redis, stop: asyncio.Event, *, max_delay: float = 2.0
) -> None:
    """Return once Redis answers PING (or ``stop`` is set), logging while it does not."""

    def unreachable(state: RetryCallState) -> None:
        if state.attempt_number == 1:
            log.warning("redis.unreachable error=%r action=retrying", failure(state))

    attempts = 0
    async for attempt in retrying(
        stop,
        Backoff(min(0.05, max_delay), max_delay),
        on=(RedisConnectionError, RedisTimeoutError, OSError),
        before_sleep=unreachable,
    ):
        if stop.is_set():
            return
        attempts += 1
        with attempt:
            pool = redis.connection_pool
            if isinstance(pool, SentinelConnectionPool):
                await _sentinels_accept(pool)
            try:
                await redis.ping()
            except (AuthenticationError, NoPermissionError) as exc:
                raise _refused(redis, None, exc) from exc
    if attempts > 1 and not stop.is_set():
        log.info("redis.reachable")


async def _sentinels_accept(pool: SentinelConnectionPool) -> None:
    """Raise :class:`RedisRefused` if a sentinel refuses our login. redis-py takes a refusal
    for a sentinel that is down, and then finds no master, which would be retried forever;
    so the sentinels are asked (PING) one by one until one answers."""
    for sentinel in pool.sentinel_manager.sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        try:
            await sentinel.ping()
            return
        except (AuthenticationError, NoPermissionError) as exc:
            where = f"the sentinel at {kwargs.get('host')}:{kwargs.get('port')}"
            raise _refused(kwargs.get("username"), where, exc) from exc
        except (RedisConnectionError, RedisTimeoutError, OSError):
            continue


def _refused(redis: aioredis.Redis | str | None, where: str | None, exc: Exception) -> RedisRefused:
    """Log a refused login (with the user, never the password) and say what to do."""
    user = redis
    if isinstance(redis, aioredis.Redis):
        pool = redis.connection_pool
        kwargs = pool.connection_kwargs
        user = kwargs.get("username")
        where = f"Redis at {kwargs.get('host')}:{kwargs.get('port')}"
        if isinstance(pool, SentinelConnectionPool):
            where = f"Redis at {pool.master_address or '?'} (master {pool.service_name!r})"
    user = user or "default"
    log.error("redis.refused user=%s redis=%s error=%s", user, where, exc)
    return RedisRefused(
        f"{where} refused user {user!r}: {exc}. Check that the user exists and is on, and "
        f"that its password (redis_password_file, or the URL) is the one Redis has"
    )

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

Credentials: Redis has one ACL user per component (:mod:`trellis_common.redisacl`). A
service gets its user from a :class:`RedisTarget`: the URL's own ``user:password@`` (an
external Redis, a URL from a Secret), or ``redis_password_file`` (``trellis up`` writes one
0600 file per component; in Kubernetes a Secret mounted as a file) with ``redis_username``,
else the URL's user, else the service's name. The password is read from the file, never
put on a command line, and never printed: :meth:`RedisTarget.describe` and the URL it
logs carry no password. A refused login (wrong password, user off) is not retried
forever as if Redis were down: :func:`wait_for_redis` logs it and raises
:class:`RedisRefused`, which names the user and where its password came from.
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
from redis.backoff import ExponentialBackoff
from redis.exceptions import AuthenticationError, NoPermissionError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from trellis_common import filemode
from trellis_common.backoff import Backoff, RetryCallState, failure, retrying

log = logging.getLogger(__name__)


#: Seconds to open a TCP connection (and finish the handshake) to Redis.
CONNECT_TIMEOUT = 2.0
#: Seconds to wait for Redis to answer one command.
SOCKET_TIMEOUT = 5.0


class RedisRefused(RuntimeError):
    """Redis refused our credentials: retrying will not help, the operator must act."""


@dataclass(frozen=True)
class RedisTarget:
    """Where Redis is and who we are there. ``password`` never shows in ``repr``."""

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
        """``host:port/db user=name``: what a log line may say about this target."""
        parts = urlsplit(self.url)
        user = self.username or unquote(parts.username or "") or "default"
        where = f"{parts.hostname}:{parts.port or 6379}{parts.path or '/0'}"
        return f"{where} user={user}"

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


def connect(
    target: str | RedisTarget,
    *,
    retries: int = 6,
    health_check_interval: float = 5.0,
    connect_timeout: float = CONNECT_TIMEOUT,
    socket_timeout: float = SOCKET_TIMEOUT,
) -> aioredis.Redis:
    """A client whose commands retry with backoff (about 3 s in all) across a restart.

    Connection errors are retried; a timeout (a frozen Redis) is raised at once.
    """
    target = as_target(target)
    return aioredis.Redis.from_url(
        target.url,
        retry=Retry(
            ExponentialBackoff(cap=1.0, base=0.05),
            retries,
            supported_errors=(RedisConnectionError,),
        ),
        retry_on_error=[RedisConnectionError, ConnectionResetError],
        health_check_interval=health_check_interval,
        socket_connect_timeout=connect_timeout,
        socket_timeout=socket_timeout,
        socket_keepalive=True,
        **target.client_options(),  # type: ignore[arg-type]  # redis-py: typed **kwargs
    )


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
            try:
                await redis.ping()
            except (AuthenticationError, NoPermissionError) as exc:
                raise _refused(redis, exc) from exc
    if attempts > 1 and not stop.is_set():
        log.info("redis.reachable")


def _refused(redis: aioredis.Redis, exc: Exception) -> RedisRefused:
    """Log a refused login (with the user, never the password) and say what to do."""
    kwargs = redis.connection_pool.connection_kwargs
    user = kwargs.get("username") or "default"
    where = f"{kwargs.get('host')}:{kwargs.get('port')}"
    log.error("redis.refused user=%s redis=%s error=%s", user, where, exc)
    return RedisRefused(
        f"Redis at {where} refused user {user!r}: {exc}. Check that the user exists and is "
        f"on, and that its password (redis_password_file, or the URL) is the one Redis has"
    )

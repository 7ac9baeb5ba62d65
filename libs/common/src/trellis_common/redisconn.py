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
"""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from trellis_common.backoff import Backoff, RetryCallState, failure, retrying

log = logging.getLogger(__name__)


#: Seconds to open a TCP connection (and finish the handshake) to Redis.
CONNECT_TIMEOUT = 2.0
#: Seconds to wait for Redis to answer one command.
SOCKET_TIMEOUT = 5.0


def connect(
    url: str,
    *,
    retries: int = 6,
    health_check_interval: float = 5.0,
    connect_timeout: float = CONNECT_TIMEOUT,
    socket_timeout: float = SOCKET_TIMEOUT,
) -> aioredis.Redis:
    """A client whose commands retry with backoff (about 3 s in all) across a restart.

    Connection errors are retried; a timeout (a frozen Redis) is raised at once.
    """
    return aioredis.Redis.from_url(
        url,
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
            await redis.ping()
    if attempts > 1 and not stop.is_set():
        log.info("redis.reachable")

"""A leader election's lock in Redis, for a local run (no Kubernetes).

The lock is one key, ``trellis:leader:<name>``, holding the holder's identity with a TTL of
the lease duration; its fencing counter is ``trellis:leader:<name>:token``. Redis' own clock
expires the key, so there is one clock only. No Trellis user may run Lua
(:mod:`trellis_runtime.redisatomic`), so each step is an optimistic transaction on the lock's
key (``WATCH`` it, read, then ``MULTI``/``EXEC``; a write by anyone in between makes
``EXEC`` do nothing, and the attempt did not acquire):

* **acquire** (the key is absent, or names this replica while it does not lead, as after a
  restart): ``SET key identity PX ttl`` and ``INCR`` the counter in one transaction: each
  acquisition, by anyone, gets a larger token than every one before it;
* **renew** (the key names this replica, which leads): ``SET key identity PX ttl``;
* **release**: ``DEL key`` if it still names this replica;
* otherwise the attempt observes the holder and its token (``MGET``).

The commands are those every component user has (``GET``, ``MGET``, ``SET``, ``INCR``,
``DEL``, ``WATCH``, ``MULTI``, ``EXEC``); the keys are in the ACL table for the components
that elect (:func:`trellis_runtime.redisacl.leader_keys`). The token lives as long as Redis'
data: a Redis that loses everything starts it again from 1 (a store fenced by it must keep
its own high-water mark).
"""

from __future__ import annotations

from typing import Any

import redis.asyncio
from redis.exceptions import WatchError

from trellis_kube.leadership import Observation
from trellis_runtime.signaling import DEFAULT_PREFIX


def lock_key(name: str, prefix: str = DEFAULT_PREFIX) -> str:
    return f"{prefix}:leader:{name}"


def token_key(name: str, prefix: str = DEFAULT_PREFIX) -> str:
    return f"{lock_key(name, prefix)}:token"


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisLock:
    """The Redis lock of one election, as ``identity`` takes part in it."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        name: str,
        identity: str,
        duration: float,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        self._redis = client
        self.key = lock_key(name, prefix)
        self.token_key = token_key(name, prefix)
        self.identity = identity
        self.description = f"Redis {self.key}"
        self._ttl_ms = max(1, round(duration * 1000))
        self._token = 0

    async def attempt(self, leading: bool, now: float) -> Observation:
        async with self._redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(self.key)
                holder, token = (_text(v) for v in await pipe.mget(self.key, self.token_key))
                observed = int(token or 0)
                if holder and holder != self.identity:
                    return Observation(False, holder, observed)
                renewal = leading and holder == self.identity
                pipe.multi()  # type: ignore[no-untyped-call]  # redis-py: untyped
                pipe.set(self.key, self.identity, px=self._ttl_ms)
                if not renewal:
                    # INCR itself: redis-py's incr() sends INCRBY, which not every user has
                    pipe.execute_command("INCR", self.token_key)
                done = await pipe.execute()
            except WatchError:  # someone wrote the key meanwhile: not acquired this time
                return Observation(False, holder, observed)
        if not renewal:
            self._token = int(done[1])
        return Observation(True, self.identity, self._token or observed)

    async def release(self) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(self.key)
                if _text(await pipe.get(self.key)) != self.identity:
                    return
                pipe.multi()  # type: ignore[no-untyped-call]  # redis-py: untyped
                pipe.delete(self.key)
                await pipe.execute()
            except WatchError:
                return  # written meanwhile: no longer ours to release

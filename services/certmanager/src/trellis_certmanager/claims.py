"""One common name at a time across certmanager replicas; the rotation leader's fence.

Every replica issues (see :mod:`trellis_certmanager.manager`), so two requests for one
common name may land on two replicas at once. Before it issues, rotates, revokes or prunes
a name, a replica takes the name's **claim**: the key ``trellis:certmanager:claim:<cn>``,
set with ``SET NX PX`` to a random token of its own. Under it, it reads the record stored
now (not only the one it holds in memory) and issues only when that one will not do, so the
second request gets the first one's certificate. Others wait for the claim, polling with a
growing pause, at most ``wait`` seconds (then :class:`StoreUnavailable`: retry later). A
claim lives ``ttl`` seconds, so a replica killed while holding one holds that name up no
longer; its holder deletes it when done (only if it still holds its token).

Every write made under a claim is guarded (:meth:`Claims.write`): ``WATCH`` the claim, read
it, and ``MULTI``/``EXEC`` the write only if it still holds this replica's token (no Lua:
:mod:`trellis_runtime.redisatomic`). A replica that stalled past ``ttl`` while another took
the name over has its write refused (:class:`ClaimLost`) and changes nothing: one request
never yields two stored certificates.

The rotation pass runs on the leader only (:mod:`trellis_certmanager.rotation`), with its
leadership's fencing token (strictly increasing across acquisitions). It first takes the
**fence**, ``trellis:certmanager:rotation-fence``, refused (:class:`Deposed`) if a higher
token is stored; each of its writes then checks, in the same transaction, that no higher
token was stored since. A leader deposed while it was paused cannot overwrite what the new
leader rotated or pruned, however late it wakes up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError, WatchError

from trellis_certmanager.domain.errors import ClaimLost, Deposed, StoreUnavailable

if TYPE_CHECKING:
    from prometheus_client import Counter

log = logging.getLogger(__name__)

#: Transactions that lose to another writer of a watched key are tried this many times.
ATTEMPTS = 5
FIRST_PAUSE = 0.005
MAX_PAUSE = 0.1


@dataclass(frozen=True, slots=True)
class Claim:
    """What a write is guarded by: ``token`` held on ``common_name`` ("": none held in
    Redis), and the rotation ``fence`` token (``None``: not a rotation pass's write)."""

    common_name: str = ""
    token: str = ""
    fence: int | None = None


Queue = Callable[[Any], None]  # queues writes on a MULTI pipeline


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _number(value: bytes | str | None) -> int:
    text = _text(value)
    try:
        return int(text) if text else 0
    except ValueError:
        return 0  # not a number: anyone may take it over


class Claims:
    """Claims on common names, and the rotation fence, in one Redis (module docstring)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str = "trellis",
        ttl: float = 5.0,
        wait: float | None = None,
        refused: Counter | None = None,
    ) -> None:
        self._redis = redis
        self._refused = refused  # by reason: busy, claim_lost, deposed
        self._prefix = f"{prefix}:certmanager:claim:"
        self.fence_key = f"{prefix}:certmanager:rotation-fence"
        self.ttl = ttl
        self.wait = wait if wait is not None else 3 * ttl

    def key(self, common_name: str) -> str:
        return self._prefix + common_name

    @contextlib.asynccontextmanager
    async def hold(self, common_name: str, fence: int | None = None) -> AsyncIterator[Claim]:
        """Hold ``common_name`` against the other replicas until the block ends."""
        key, token = self.key(common_name), secrets.token_hex(16)
        await self._acquire(common_name, key, token)
        try:
            yield Claim(common_name, token, fence)
        finally:
            await self._release(common_name, key, token)

    async def _acquire(self, common_name: str, key: str, token: str) -> None:
        clock = asyncio.get_running_loop()
        deadline, pause = clock.time() + self.wait, FIRST_PAUSE
        while True:
            try:
                if await self._redis.set(key, token, nx=True, px=int(self.ttl * 1000)):
                    return
            except (RedisError, OSError) as exc:
                raise StoreUnavailable(
                    f"cannot claim {common_name} in the certificate store (Redis): {exc}"
                ) from exc
            if clock.time() >= deadline:
                self._count("busy")
                log.warning("cert.claim_busy cn=%s waited=%.1fs", common_name, self.wait)
                raise StoreUnavailable(
                    f"{common_name} is held by another certmanager replica for longer "
                    f"than {self.wait:.0f}s; nothing was issued: retry later"
                )
            await asyncio.sleep(pause * random.uniform(0.5, 1.0))
            pause = min(pause * 2, MAX_PAUSE)

    async def _release(self, common_name: str, key: str, token: str) -> None:
        async def delete(pipe: Any) -> None:
            if _text(await pipe.get(key)) == token:
                pipe.multi()
                pipe.delete(key)

        try:
            await self._transact([key], delete)
        except (RedisError, OSError) as exc:  # it expires by itself within ttl
            log.warning("cert.claim_not_released cn=%s error=%r", common_name, str(exc))

    async def take_fence(self, token: int) -> None:
        """Store ``token`` as the rotation fence; :class:`Deposed` if a higher one is."""

        async def take(pipe: Any) -> None:
            stored = _number(await pipe.get(self.fence_key))
            if stored > token:
                self._count("deposed")
                log.warning("cert.rotation_deposed token=%d leader_token=%d", token, stored)
                raise Deposed(f"a newer rotation leader (token {stored}) took over from {token}")
            pipe.multi()
            pipe.set(self.fence_key, str(token))

        await self._guarded([self.fence_key], take)

    async def write(self, claim: Claim | None, queue: Queue) -> None:
        """Run the writes ``queue`` adds as one transaction, if ``claim`` still holds (the
        common name's token, and the fence): :class:`ClaimLost` or :class:`Deposed` if not."""
        keys = []
        if claim is not None and claim.token:
            keys.append(self.key(claim.common_name))
        if claim is not None and claim.fence is not None:
            keys.append(self.fence_key)

        async def body(pipe: Any) -> None:
            if keys:
                values = await pipe.mget(keys)
                self._check(claim, dict(zip(keys, values, strict=True)))
            pipe.multi()
            queue(pipe)

        await self._guarded(keys, body)

    def _check(self, claim: Claim | None, values: dict[str, bytes | str | None]) -> None:
        if claim is None:
            return
        if claim.token and _text(values[self.key(claim.common_name)]) != claim.token:
            self._count("claim_lost")
            log.warning("cert.claim_lost cn=%s", claim.common_name)
            raise ClaimLost(
                f"another certmanager replica took {claim.common_name} over: nothing was "
                "changed here; ask again for its certificate"
            )
        if claim.fence is not None:
            stored = _number(values[self.fence_key])
            if stored > claim.fence:
                self._count("deposed")
                log.warning(
                    "cert.rotation_deposed token=%d leader_token=%d cn=%s",
                    claim.fence,
                    stored,
                    claim.common_name or "-",
                )
                raise Deposed(
                    f"a newer rotation leader (token {stored}) took over from {claim.fence}: "
                    "this write was refused"
                )

    def _count(self, reason: str) -> None:
        if self._refused is not None:
            self._refused.labels(reason).inc()

    async def _guarded(self, keys: list[str], body: Callable[[Any], Any]) -> None:
        try:
            await self._transact(keys, body)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(
                f"the certificate store (Redis) did not take the write ({exc}); nothing was "
                "issued or changed; retry once Redis is back"
            ) from exc

    async def _transact(self, keys: list[str], body: Callable[[Any], Any]) -> None:
        """``body(pipe)`` with ``keys`` watched, again while another writer touched them."""
        async with self._redis.pipeline(transaction=True) as pipe:
            for attempt in range(ATTEMPTS):
                try:
                    if keys:
                        await pipe.watch(*keys)
                    await body(pipe)
                    await pipe.execute()
                    return
                except WatchError:
                    await pipe.reset()  # type: ignore[no-untyped-call]  # redis-py: untyped
                    if attempt == ATTEMPTS - 1:
                        raise

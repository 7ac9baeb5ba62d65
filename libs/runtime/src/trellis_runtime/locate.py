"""Finding the service that owns some state: a configured address, or the registry.

A consumer fetches from an owner (certmanager, the catalog, a provider) over gRPC. Where
the owner is comes from a setting when the operator gave one, else from the service
registry: the live record of the owner's kind that started last. A :class:`Locator` keeps
one channel to that address and forgets it when a call finds nobody there
(``UNAVAILABLE``), so the next call looks again: an owner that restarted elsewhere is
found without any configuration.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc
import redis.asyncio

from trellis_runtime.registry import discover

log = logging.getLogger(__name__)

ChannelFactory = Callable[[str], grpc.aio.Channel]


class OwnerUnavailable(RuntimeError):
    """No live service of the kind is known (or none answers)."""


class Locator:
    """Where the live service of ``kind`` is, and a channel to it."""

    def __init__(
        self,
        redis: redis.asyncio.Redis,
        kind: str,
        configured: str = "",
        *,
        channel_factory: ChannelFactory = grpc.aio.insecure_channel,
    ) -> None:
        self.kind = kind
        self.configured = configured
        self._redis = redis
        self._factory = channel_factory
        self.address = configured
        self._channel: grpc.aio.Channel | None = None
        self._closing: set[asyncio.Task[None]] = set()

    async def locate(self) -> str:
        """The owner's address; raises :class:`OwnerUnavailable` when none is known."""
        if self.address:
            return self.address
        found = await discover(self._redis, self.kind)
        if not found:
            raise OwnerUnavailable(f"no live {self.kind} in the service registry")
        self.address = max(found, key=lambda record: record.started_at).grpc_address
        log.info("locate.found kind=%s address=%s", self.kind, self.address)
        return self.address

    async def channel(self) -> grpc.aio.Channel:
        address = await self.locate()
        if self._channel is None:
            self._channel = self._factory(address)
        return self._channel

    def failed(self, exc: BaseException) -> None:
        """A call failed with ``exc``: when nobody answered, look the owner up again."""
        if not isinstance(exc, grpc.aio.AioRpcError) or exc.code() not in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.UNIMPLEMENTED,  # something else took the port
        ):
            return
        if self.address and self.address != self.configured:
            log.info("locate.lost kind=%s address=%s", self.kind, self.address)
            self.address = ""
        if self._channel is not None and not self.configured:
            self._retire(self._channel)  # calls still in flight on it get a moment to finish
            self._channel = None

    def reset(self) -> None:
        """Open a new channel at the next call (this component's certificate was renewed:
        connections made from now on present the new one); calls in flight finish."""
        if self._channel is not None:
            self._retire(self._channel)
            self._channel = None

    def _retire(self, channel: grpc.aio.Channel) -> None:
        task = asyncio.get_running_loop().create_task(channel.close(grace=1.0))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        await asyncio.gather(*self._closing, return_exceptions=True)

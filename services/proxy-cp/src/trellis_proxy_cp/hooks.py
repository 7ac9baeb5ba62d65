"""What proxy-cp does when streams open, close, send, ACK and NACK.

Counts them (metrics), tells the catalog which proxies are connected (it computes the
mesh participants), and releases a proxy's group when its stream closes. A refused stream
is counted by code and reason and kept in the service's rejected records (source ``xds``,
key: the proxy) until that proxy opens a stream. Hooks are called synchronously by the
transports; work that needs the network is scheduled, not awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from trellis_proxy_cp import types
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.metrics import XdsMetrics
from trellis_proxy_cp.transport.streams import ProxyStream, StreamRefused
from trellis_proxy_cp.types import TypeUrl
from trellis_runtime.health import Rejections

log = logging.getLogger(__name__)

Register = Callable[[str, str], Awaitable[None]]
Unregister = Callable[[str], Awaitable[None]]


class ProxyHooks:
    def __init__(
        self,
        control_plane: ProxyControlPlane,
        metrics: XdsMetrics,
        register: Register,
        unregister: Unregister,
        rejections: Rejections | None = None,
    ) -> None:
        self._control_plane = control_plane
        self._metrics = metrics
        self._register = register
        self._unregister = unregister
        self._rejections = rejections
        self._tasks: set[asyncio.Task[None]] = set()

    def _spawn(self, work: Awaitable[None]) -> None:
        async def guarded() -> None:
            with contextlib.suppress(Exception):
                await work

        task = asyncio.ensure_future(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def idle(self) -> None:
        """Return once the work the hooks started in the background (the catalog's
        registrations, detaching) is done, including work that work started."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def on_refused(self, proxy_id: str, protocol: str, refused: StreamRefused) -> None:
        self._metrics.refused_streams.labels(refused.code.name, refused.reason).inc()
        if self._rejections is not None:
            self._rejections.reject(
                "xds", proxy_id or "(unknown)", f"{refused.code.name}: {refused.message}"
            )

    def on_open(self, stream: ProxyStream) -> None:
        if self._rejections is not None:
            self._rejections.accept("xds", stream.proxy_id)
        self._metrics.connected.labels(stream.protocol or "sotw").inc()
        self._metrics.streams.labels(stream.protocol or "sotw").inc()
        log.info(
            "proxy.connected proxy=%s identity=%s protocol=%s key=%s",
            stream.proxy_id,
            stream.identity,
            stream.protocol,
            stream.key,
        )
        address = ""
        self._spawn(self._register(stream.proxy_id, address))

    def on_close(self, stream: ProxyStream) -> None:
        self._metrics.connected.labels(stream.protocol or "sotw").dec()
        log.info("proxy.disconnected proxy=%s identity=%s", stream.proxy_id, stream.identity)
        self._control_plane.detach(stream.proxy_id, stream.key)
        if not self._control_plane.streams_of(stream.proxy_id):  # its newer stream is open
            self._spawn(self._unregister(stream.proxy_id))

    def on_sent(self, stream: ProxyStream, type_url: TypeUrl, version: str) -> None:
        self._metrics.pushes.labels(types.SHORT.get(type_url, type_url)).inc()

    def on_ack(self, stream: ProxyStream, type_url: TypeUrl, version: str) -> None:
        short = types.SHORT.get(type_url, type_url)
        self._metrics.acks.labels(short).inc()
        set_at = self._control_plane.set_at.get(stream.key)
        if set_at is not None:
            self._metrics.push_latency.labels(short).observe(time.monotonic() - set_at)

    def on_nack(
        self, stream: ProxyStream, type_url: TypeUrl, version: str, error_message: str
    ) -> None:
        self._metrics.nacks.labels(types.SHORT.get(type_url, type_url)).inc()

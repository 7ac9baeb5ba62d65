"""A TCP relay that a test can cut: a network partition between one client and a server.

A client connects to the relay's port instead of the server's; the relay forwards every
connection, both ways. :meth:`Relay.cut` partitions them: connections stay open and bytes
sent either way are held, not delivered and not refused, as on a network that drops
packets while TCP keeps retrying, so the client's calls hang (new connections too).
:meth:`Relay.heal` delivers what was held and lets traffic through again. Other clients of
the same server, connected directly, are not affected: that is the partition of one replica
that a leader election must survive (:mod:`trellis_kube.leadership`).
"""

from __future__ import annotations

import asyncio
import contextlib


class Relay:
    """Forward ``127.0.0.1:<port>`` to ``host:port``; use as ``async with``."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Relay:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def cut(self) -> None:
        """Partition: hold every byte, both ways, until :meth:`heal`."""
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.add(upstream_writer)
        for source, sink in ((reader, upstream_writer), (upstream_reader, writer)):
            task = asyncio.create_task(self._pump(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await source.read(65536):
                await self._open.wait()
                sink.write(data)
                await sink.drain()
        sink.close()

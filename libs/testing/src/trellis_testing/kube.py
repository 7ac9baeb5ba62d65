"""The test Kubernetes API server (:mod:`trellis_testing.kubeserver`) on its own thread.

Synchronous tests, blocking watches and services in other processes all reach it over
plain ``http://`` through a kubeconfig (:meth:`KubeApi.write_kubeconfig`), as they would a
local emulator. Each kubeconfig names its client (:meth:`KubeApi.write_kubeconfig`'s
``client``, sent as its bearer token), so a fault can pick one client out. Faults:
:meth:`KubeApi.drop_watches` (a dropped connection), :meth:`KubeApi.expire` (etcd
compaction: the next watch from an old revision gets 410) and :meth:`KubeApi.partitioned`
(one client cut off from the server: its requests hang, then fail, and change nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import kmock
import yaml
from kmock._internal import references

from trellis_testing.kubeselect import Selector
from trellis_testing.kubeserver import ApiServer

__all__ = ["ApiServer", "KubeApi", "Selector"]

#: The client a kubeconfig is for, unless it names another.
DEFAULT_CLIENT = "tester"


def _token(client: str) -> str:
    """The bearer token of ``client``'s kubeconfig (the server checks none: it only tells
    the clients apart)."""
    return f"emulator-client-{client}"


class KubeApi:
    """:class:`ApiServer` on its own thread and loop, for synchronous tests and services."""

    def __init__(self) -> None:
        self.url = ""
        self.server: ApiServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kube-api", daemon=True)

    def start(self) -> KubeApi:
        self._thread.start()
        if not self._ready.wait(10) or self.server is None:
            raise RuntimeError("the Kubernetes API emulator did not start") from self._failure
        return self

    def stop(self) -> None:
        if self._loop is not None and self.server is not None:
            self.heal()  # a held request would hold up the server's shutdown
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def __enter__(self) -> KubeApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001  # surfaced by start()
            self._failure = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with ApiServer() as server, kmock.Server(server, host="127.0.0.1") as http:
            server.resources.load_bundled()
            self.server = server
            self.url = str(http.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def _call(self, action: Callable[[ApiServer], Any]) -> Any:
        assert self._loop is not None
        assert self.server is not None
        server = self.server

        async def run() -> Any:
            return await action(server)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def drop_watches(self) -> None:
        """End every open watch, as a dropped connection does."""
        self._call(lambda server: server.drop_watches())

    def expire(self) -> None:
        """Compact the history: a watch from any resourceVersion so far gets 410 Gone."""
        self._call(lambda server: server.expire())

    def partition(self, client: str) -> None:
        """Cut ``client`` (a kubeconfig's, :meth:`write_kubeconfig`) off from the server:
        its requests hang, unanswered, until :meth:`heal`, then fail with 503; none of them
        reaches the store. Other clients are served as before."""
        self._call(lambda server: server.partition(_token(client)))

    def heal(self, client: str | None = None) -> None:
        """End the partition of ``client`` (of every client, with None)."""
        self._call(lambda server: server.heal(None if client is None else _token(client)))

    @contextlib.contextmanager
    def partitioned(self, client: str) -> Iterator[None]:
        """``client`` is cut off from the server for the duration of the block."""
        self.partition(client)
        try:
            yield
        finally:
            self.heal(client)

    def declare(self, resource: str, **info: Any) -> None:
        """Declare a resource (``group/version/plural``) for discovery, e.g. a CRD's."""
        assert self.server is not None
        self.server.resources[resource] = references.ResourceInfo(**info)

    def service_account_token(
        self,
        namespace: str,
        service_account: str,
        *,
        audiences: tuple[str, ...] = ("trellis",),
        lifetime: float = 600.0,
        pod: tuple[str, str] | None = None,
    ) -> str:
        """A projected ServiceAccount token this server's TokenReview accepts; bound to
        ``pod`` (its name and uid) if given, it is accepted only while that pod is stored
        with that uid. Neither the account nor the pod need exist when it is issued (the
        TokenRequest API, which the kubelet uses, checks both)."""
        assert self.server is not None
        return self.server.tokens.issue(
            namespace, service_account, audiences=audiences, lifetime=lifetime, pod=pod
        )

    def objects(self, group: str, plural: str) -> list[dict[str, Any]]:
        """What the server stores, as it stores it (a copy)."""

        async def read(server: ApiServer) -> list[dict[str, Any]]:
            return [
                copy.deepcopy(obj)
                for (g, p, _, _), obj in server.store.items()
                if (g, p) == (group, plural)
            ]

        return cast(list[dict[str, Any]], self._call(read))

    def watches(self) -> int:
        """How many watch requests the server has had so far."""
        assert self.server is not None
        return self.server.watch_count

    def write_kubeconfig(self, path: Path, client: str = DEFAULT_CLIENT) -> Path:
        """A kubeconfig for this server (plain ``http://``, as a local emulator is), for
        the client named ``client`` (the name a fault such as :meth:`partition` picks)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": _token(client)}}],
            "contexts": [
                {"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}
            ],
            "current-context": "emulator",
        }
        path.write_text(yaml.safe_dump(config))
        return path

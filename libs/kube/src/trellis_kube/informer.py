"""An informer: one kind of object, listed, then watched, and kept in memory.

This is client-go's reflector, in the form our services need, on the official synchronous
``kubernetes`` client:

* **list, then watch from the list's resourceVersion**, so nothing between the two is lost;
* a watch that ends (the server's ``timeoutSeconds``, a dropped connection) resumes from the
  last resourceVersion seen, bookmarks included;
* **410 Gone** (the history was compacted) lists again, and the new list is compared with
  what was known: what vanished in the gap is delivered as DELETED, what changed as
  MODIFIED, so a consumer never misses an event, only sees it late;
* any other failure propagates: the service's supervisor restarts :meth:`Informer.run`
  with backoff and shows the loop down in ``/readyz`` until it is back; the cache is kept,
  and the restart resumes the watch from the last resourceVersion (or lists, on 410).

The blocking list and watch calls run on a thread of the informer's own (a watch blocks for
its whole life, and the default executor has a handful of threads); each change is handed
to the event loop, where the cache is updated and the handlers run. Objects are the API's
JSON as plain dicts: no model classes, which are slow and reject what they do not know.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

Object = dict[str, Any]
Key = tuple[str, str]  # namespace ("" when cluster scoped), name
#: Called on the event loop for each change: (event type, the object before, after).
Handler = Callable[[str, Object | None, Object | None], None]

GONE = 410


def key_of(obj: Object) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


@dataclass
class InformerStats:
    lists: int = 0
    watches: int = 0
    expired: int = 0
    events: int = 0


@dataclass
class Informer:
    """``list_call`` is a client's list method (``CoreV1Api.list_service_for_all_namespaces``,
    or a ``functools.partial`` of ``CustomObjectsApi.list_cluster_custom_object``); it is
    called with ``watch=True`` for watches, as the client's own ``Watch`` does."""

    name: str
    list_call: Callable[..., Any]
    label_selector: str | None = None
    #: The server ends each watch after this long (and the informer resumes it); it also
    #: bounds how long a stop waits for a silent watch on its own.
    watch_timeout: int = 60
    request_timeout: float = 10.0
    objects: dict[Key, Object] = field(default_factory=dict)
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    revision: str | None = None
    stats: InformerStats = field(default_factory=InformerStats)
    _handlers: list[Handler] = field(default_factory=list)

    def subscribe(self, handler: Handler) -> None:
        self._handlers.append(handler)

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()
        worker = _Worker(self, loop, finished)
        thread = threading.Thread(target=worker.run, name=f"informer-{self.name}", daemon=True)
        thread.start()
        stopping: asyncio.Future[bool] = asyncio.ensure_future(stop.wait())
        waits: set[asyncio.Future[Any]] = {finished, stopping}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            worker.stop()
        if finished.done():
            finished.result()  # the thread's failure, for the supervisor

    # -- on the event loop -----------------------------------------------------------------

    def _replace(self, items: list[Object], revision: str) -> None:
        """A new list: the difference with what was known is delivered as events."""
        fresh = {key_of(obj): obj for obj in items}
        for key, known in list(self.objects.items()):
            if key not in fresh:
                self._apply("DELETED", known)
        for key, obj in fresh.items():
            before = self.objects.get(key)
            if before is None:
                self._apply("ADDED", obj)
            elif _revision(before) != _revision(obj):
                self._apply("MODIFIED", obj)
        self.revision = revision
        self.synced.set()

    def _apply(self, kind: str, obj: Object) -> None:
        key = key_of(obj)
        old = self.objects.get(key)
        new: Object | None
        if kind == "DELETED":
            self.objects.pop(key, None)
            new = None
        else:
            self.objects[key] = obj
            new = obj
        self.revision = _revision(obj) or self.revision
        self.stats.events += 1
        for handler in self._handlers:
            try:
                handler(kind, old, new)
            except Exception:
                log.exception("informer.handler_failed informer=%s key=%s", self.name, key)


def _revision(obj: Object) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class _Worker:
    """The blocking side: list, watch, hand each change to the loop."""

    def __init__(
        self, informer: Informer, loop: asyncio.AbstractEventLoop, finished: asyncio.Future[None]
    ) -> None:
        self.informer = informer
        self.loop = loop
        self.finished = finished
        self.stopped = threading.Event()
        self.watcher: Any = None

    def stop(self) -> None:
        self.stopped.set()
        if self.watcher is not None:
            self.watcher.stop()  # shuts the socket down: a blocked read returns at once

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001  # handed to the supervisor
            if not self.stopped.is_set():  # else: the socket was shut under it, on purpose
                self._post(self._fail, exc)
                return
        self._post(self._done)

    def _done(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if not self.finished.done():
            self.finished.set_exception(exc)

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the service is gone
            self.stopped.set()

    def _loop(self) -> None:
        informer = self.informer
        # after a restart, resume where the last run was: a 410 then lists again
        revision = informer.revision if informer.synced.is_set() else None
        while not self.stopped.is_set():
            if revision is None:
                revision = self._list()
            try:
                revision = self._watch(revision)
            except ApiException as exc:
                if exc.status != GONE:
                    raise
                revision = None
            if revision is None:
                informer.stats.expired += 1
                log.info("informer.expired informer=%s relisting=true", informer.name)

    def _list(self) -> str:
        informer = self.informer
        kwargs: dict[str, Any] = {"_preload_content": False}
        if informer.label_selector:
            kwargs["label_selector"] = informer.label_selector
        response = informer.list_call(_request_timeout=informer.request_timeout, **kwargs)
        body = json.loads(response.data)
        items = body.get("items") or []
        revision = str((body.get("metadata") or {}).get("resourceVersion") or "")
        informer.stats.lists += 1
        self._post(informer._replace, items, revision)
        log.info(
            "informer.listed informer=%s objects=%d revision=%s",
            informer.name,
            len(items),
            revision,
        )
        return revision

    def _watch(self, revision: str) -> str | None:
        """Watch from ``revision`` until the server ends it; the revision to resume from,
        or None when the history is gone (410) and the informer must list again."""
        informer = self.informer

        def call(**kwargs: Any) -> Any:  # no return annotation: the events stay plain dicts
            return informer.list_call(**kwargs)

        kwargs: dict[str, Any] = {
            "resource_version": revision,
            "timeout_seconds": informer.watch_timeout,
            "allow_watch_bookmarks": True,
            "_request_timeout": (informer.request_timeout, informer.watch_timeout + 15),
        }
        if informer.label_selector:
            kwargs["label_selector"] = informer.label_selector
        self.watcher = watch.Watch()  # type: ignore[no-untyped-call]
        informer.stats.watches += 1
        try:
            for event in self.watcher.stream(call, **kwargs):
                if self.stopped.is_set():
                    return revision
                # the client's Watch raises ERROR events as ApiException (410 included)
                kind, obj = event.get("type"), event.get("raw_object") or {}
                revision = _revision(obj) or revision
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._post(informer._apply, kind, obj)
        finally:
            self.watcher = None
        return revision

"""When to scan a directory tree again: on inotify's word (through watchfiles), with a net.

The spec directory used to be polled every 0.5 s, so an edit waited up to half a second to
reach Envoy. inotify tells at once. This module decides only *when* to scan; what a scan
reads, and what it refuses, stays with the scanner (:mod:`trellis_common.specdir`):

* Each scan returns a :class:`Plan`: the directories to watch, each watched on its own, not
  recursively. watchfiles' recursive mode follows every symlink, so one link to ``/`` in the
  tree would have it walk and watch the whole filesystem; the scanner's walk already refuses
  links that leave the tree, so its list is the bound. When the list changes (a new
  subdirectory, a ConfigMap's ``..data`` swapped), the watcher is remade and the tree is
  scanned once more with the new watch in place, so nothing written in between is missed.
  (This is why it drives watchfiles' ``RustNotify`` itself, as ``awatch`` does inside: awatch
  gives no point at which the watch is known to be in place.)
* Any event means "scan now": a scan compares stat stamps, so it is cheap and needs no detail.
  watchfiles gathers events until ``step_ms`` pass with no new one (``debounce_ms`` at most),
  so a write is seen within about two steps, not its default 1.6 s batch.
* A plan may ask to be woken by a time (a file left to settle while it may be half-written).
* A full rescan every ``rescan`` seconds is the safety net for events that never come:
  inotify's queue overflowed (watchfiles drops that notice), or a filesystem that sends none
  (NFS, some FUSE mounts).
* If no watch can be made (no inotify; ``fs.inotify.max_user_watches`` or instances used up),
  the tree is polled every ``poll`` seconds instead, as before: logged once, and shown by
  :attr:`DirWatcher.mode` for the service's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from watchfiles._rust_notify import RustNotify

log = logging.getLogger(__name__)

#: watchfiles checks for events this often while it waits: 5 ms cost an idle watcher 0.55%
#: of a core (measured), 20 ms 0.18%; an edit is still seen within about 40 ms
STEP_MS = 20
DEBOUNCE_MS = 50


@dataclass(frozen=True, slots=True)
class Plan:
    """What a scan asks of the watcher: directories to watch, and a wake-up in seconds."""

    dirs: frozenset[str]
    wake: float | None = None


@dataclass(frozen=True, slots=True)
class WatchMode:
    kind: Literal["starting", "inotify", "polling"]
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.kind, "reason": self.reason}


class StopFlag(Protocol):
    def is_set(self) -> bool: ...


class Notifier(Protocol):
    """What is used of watchfiles' ``RustNotify``."""

    def watch(
        self, debounce_ms: int, step_ms: int, timeout_ms: int, stop_event: StopFlag
    ) -> set[tuple[int, str]] | Literal["signal", "stop", "timeout"]: ...

    def close(self) -> None: ...


Opener = Callable[[list[str]], Notifier]


def inotify(dirs: list[str]) -> Notifier:
    """Each directory watched alone (inotify on Linux); raises ``OSError`` if it cannot."""
    return RustNotify(dirs, False, False, 300, False, False)


class _Flag:
    """Set when the service stops or the current wait is abandoned; read by watchfiles'
    thread every step."""

    def __init__(self, stop: asyncio.Event) -> None:
        self._stop = stop
        self.halt = False

    def is_set(self) -> bool:
        return self.halt or self._stop.is_set()


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


class DirWatcher:
    """Runs a scanner whenever its tree may have changed, until stopped."""

    def __init__(
        self,
        name: str,
        *,
        rescan: float,
        poll: float,
        opener: Opener = inotify,
        step_ms: int = STEP_MS,
        debounce_ms: int = DEBOUNCE_MS,
    ) -> None:
        self.name = name
        self.rescan = rescan
        self.poll = poll
        self.mode = WatchMode("starting")
        self._opener = opener
        self._step_ms = step_ms
        self._debounce_ms = debounce_ms

    async def run(self, stop: asyncio.Event, scan: Callable[[], Awaitable[Plan]]) -> None:
        notifier: Notifier | None = None
        watched: frozenset[str] | None = None
        try:
            while not stop.is_set():
                plan = await scan()
                if self.mode.kind != "polling" and plan.dirs and plan.dirs != watched:
                    if notifier is not None:
                        notifier.close()
                    notifier = self._open(plan.dirs)
                    watched = plan.dirs if notifier is not None else None
                    if notifier is not None:
                        continue  # scan again with the new watch in place
                timeout = self.rescan if notifier is not None else self.poll
                if plan.wake is not None:
                    timeout = min(timeout, plan.wake)
                if notifier is None:  # polling, or a directory went before it was watched
                    await _sleep(stop, timeout)
                    continue
                try:
                    await self._wait(notifier, stop, timeout)
                except (OSError, RuntimeError) as exc:  # watchfiles failed: remade after a poll
                    log.warning("dirwatch.failed path=%s error=%r action=rewatch", self.name, exc)
                    notifier.close()
                    notifier, watched = None, None
                    await _sleep(stop, self.poll)
        finally:
            if notifier is not None:
                notifier.close()

    def _open(self, dirs: frozenset[str]) -> Notifier | None:
        try:
            notifier = self._opener(sorted(dirs))
        except FileNotFoundError:
            return None  # went between the scan and the watch: scan again
        except (OSError, RuntimeError) as exc:  # no inotify, or out of watches
            self.mode = WatchMode("polling", f"cannot watch with inotify: {exc}")
            log.warning(
                "dirwatch.polling path=%s interval=%s reason=%r", self.name, self.poll, str(exc)
            )
            return None
        if self.mode.kind != "inotify":
            self.mode = WatchMode("inotify")
            log.info(
                "dirwatch.inotify path=%s dirs=%d rescan=%s", self.name, len(dirs), self.rescan
            )
        return notifier

    async def _wait(self, notifier: Notifier, stop: asyncio.Event, timeout: float) -> None:
        """Until something changes in a watched directory, ``timeout`` passes, or ``stop``."""
        flag = _Flag(stop)
        timeout_ms = max(1, round(timeout * 1000))
        try:
            await asyncio.to_thread(
                notifier.watch, self._debounce_ms, self._step_ms, timeout_ms, flag
            )
        finally:
            flag.halt = True  # if cancelled, the thread returns within a step

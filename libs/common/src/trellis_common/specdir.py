"""The spec directory: the YAML documents operators write, loaded and watched.

Operators keep any number of ``.yaml``/``.yml`` files (several documents per file) in one
directory tree; each service reads the kinds it owns from it. The promise they rely on: a
half-written or invalid file never wipes the last good version of its documents.

So state is kept per file: the documents in force from its last good parse and its current
errors. A file is re-read only when its ``(mtime_ns, size, inode)`` changes, which catches
both in-place rewrites and atomic replaces (a new inode), even when the mtime is unchanged.
When a file's YAML does not parse, its previous documents stay in force; when one document
is invalid, the file's other documents are taken and the invalid one keeps its previous
version (same key, same file) if it had one. Only deleting a file removes its documents.

The same ``(kind, namespace, name)`` in two places is resolved by path order (then position
in the file): the first wins, the others are reported as conflicts. Hidden names (which
include Kubernetes ConfigMap ``..data`` directories, whose files are reached through the
top-level symlinks) and editor temp files are ignored; a file reachable twice through
symlinks is read once.

What a file may cost is bounded, since whoever can write to the directory should not be
able to stop a service: its size and what its YAML aliases expand to
(:class:`~trellis_common.documents.yamlfile.Limits`, checked by
:mod:`~trellis_common.documents.yamlfile`), and a symlink (to a file or a directory) that
resolves outside the directory is not followed. Each refusal is an error of that file, like
invalid YAML: the file's last good documents stay in force.

:meth:`SpecDirectory.watch` runs :meth:`SpecDirectory.scan` in a worker thread whenever
inotify reports a change in one of the directories the last scan walked (and on a slow
periodic rescan, or by polling where inotify is not available: :mod:`trellis_common.dirwatch`),
and reports each change once. A file modified less than ``settle`` ago may be mid-write: it is
left for a wake-up at the end of that time (or sooner, if it changes again), but for no more
than ``settle_max``. :func:`load_paths` validates files offline.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trellis_common import dirwatch, spectree
from trellis_common.documents import yamlfile
from trellis_common.documents.base import Document, DocumentError, DocumentKey, KindRegistry, Origin
from trellis_common.documents.yamlfile import DEFAULT_LIMITS, Limits

log = logging.getLogger(__name__)


Stamp = tuple[int, int, int]  # (mtime_ns, size, inode)


@dataclass(frozen=True, slots=True)
class SpecChange:
    """What one scan changed; ``errors`` is the complete current error list."""

    added: tuple[Document, ...] = ()
    updated: tuple[Document, ...] = ()
    removed: tuple[DocumentKey, ...] = ()
    errors: tuple[DocumentError, ...] = ()
    errors_changed: bool = False

    @property
    def empty(self) -> bool:
        return not (self.added or self.updated or self.removed or self.errors_changed)


@dataclass(frozen=True, slots=True)
class _FileState:
    stamp: Stamp | None  # None: read while it changed, read again on the next scan
    documents: tuple[Document, ...]  # in force: the last good version of each
    errors: tuple[DocumentError, ...]


def _stamp(path: Path) -> Stamp:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _yaml_reason(exc: Exception) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        reason = f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
        if exc.context:
            started = exc.context_mark
            at = f" at line {started.line + 1}, column {started.column + 1}" if started else ""
            reason += f" ({exc.context}{at})"
        return reason
    return f"invalid YAML: {exc}"


def parse_file(
    path: Path,
    registry: KindRegistry,
    kinds: Collection[str] | None = None,
    previous: Iterable[Document] = (),
    report_unread: bool = False,
    limits: Limits = DEFAULT_LIMITS,
) -> tuple[list[Document], list[DocumentError]]:
    """One file's documents in force and its errors, falling back on ``previous``.

    With ``kinds``, documents of other kinds are skipped, except, with ``report_unread``,
    those of kinds no service reads: they come back as :class:`UnreadKind` errors, so the
    one service that reports them (the catalog) can say they are ignored.

    Raises ``FileNotFoundError`` if the file is gone.
    """
    source = str(path)
    previous = list(previous)
    try:
        raws = yamlfile.load(path, limits)
    except FileNotFoundError:
        raise
    except yamlfile.TooCostly as exc:
        return previous, [DocumentError(Origin(source), "", str(exc))]
    except OSError as exc:
        return previous, [DocumentError(Origin(source), "", f"cannot read: {exc.strerror}")]
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        return previous, [DocumentError(Origin(source), "", _yaml_reason(exc))]
    by_key = {doc.key: doc for doc in previous}
    documents: list[Document] = []
    errors: list[DocumentError] = []
    for index, raw in enumerate(raws):
        if raw is None:
            continue
        kind = raw.get("kind") if isinstance(raw, Mapping) else None
        if (
            kinds is not None
            and isinstance(kind, str)
            and kind
            and kind not in kinds
            and (kind in registry.kinds() or not report_unread)
        ):
            continue  # another service reads it (or the caller leaves unread kinds to others)
        try:
            documents.append(registry.parse(raw, Origin(source, index)))
        except DocumentError as exc:
            errors.append(exc)
            if exc.key is not None and exc.key in by_key:
                documents.append(by_key[exc.key])
    return documents, errors


def _origin_order(origin: Origin) -> tuple[tuple[str, ...], int]:
    return (Path(origin.source).parts, origin.index)


def _error_order(error: DocumentError) -> tuple[tuple[str, ...], int]:
    return _origin_order(error.origin)


def _resolve(
    files: Iterable[Iterable[Document]],
) -> tuple[dict[DocumentKey, Document], list[DocumentError]]:
    """Documents by key (files in path order: the first definition wins) and the conflicts."""
    current: dict[DocumentKey, Document] = {}
    conflicts: list[DocumentError] = []
    for documents in files:
        for doc in documents:
            winner = current.get(doc.key)
            if winner is None:
                current[doc.key] = doc
            else:
                reason = f"conflicts with {winner.origin}"
                conflicts.append(DocumentError(doc.origin, "", reason, doc.key))
    return current, conflicts


def _same(a: Document, b: Document) -> bool:
    """Same content (the origin may differ: a document moved is not a change)."""
    return a.api_version == b.api_version and a.resource == b.resource


def _error_id(error: DocumentError) -> tuple[object, ...]:
    return (error.origin, error.field, error.reason, error.key)


class SpecDirectory:
    """A directory of spec documents, of the ``kinds`` given (all if None), kept current."""

    def __init__(
        self,
        path: Path,
        registry: KindRegistry,
        kinds: Collection[str] | None = None,
        report_unread: bool = False,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.path = path
        self._registry = registry
        self._kinds = frozenset(kinds) if kinds is not None else None
        self._limits = limits
        self._report_unread = report_unread
        self._files: dict[Path, _FileState] = {}
        self._pending: dict[Path, float] = {}  # deferred while being written: first seen
        self._current: dict[DocumentKey, Document] = {}
        self._errors: list[DocumentError] = []
        self._missing_logged = False
        self._lock = threading.Lock()
        self._plan = dirwatch.Plan(frozenset())
        self._watcher: dirwatch.DirWatcher | None = None
        self.scans = 0  # directory scans done by ``watch`` (events and rescans)

    def current(self) -> dict[DocumentKey, Document]:
        return dict(self._current)

    def errors(self) -> list[DocumentError]:
        return list(self._errors)

    def status(self) -> list[dict[str, Any]]:
        """Every document in force and every error, by source and position, for REST."""
        rows: list[tuple[tuple[tuple[str, ...], int], dict[str, Any]]] = []
        for doc in self._current.values():
            row = {
                "key": str(doc.key),
                "kind": doc.key.kind,
                "namespace": doc.key.namespace,
                "name": doc.key.name,
                "apiVersion": doc.api_version,
                "source": doc.origin.source,
                "index": doc.origin.index,
                "status": "valid",
            }
            rows.append((_origin_order(doc.origin), row))
        for error in self._errors:
            key = error.key
            row = {
                "key": str(key) if key else None,
                "kind": key.kind if key else None,
                "namespace": key.namespace if key else None,
                "name": key.name if key else None,
                "apiVersion": None,
                "source": error.origin.source,
                "index": error.origin.index,
                "status": "error",
                "field": error.field,
                "reason": error.reason,
            }
            rows.append((_error_order(error), row))
        rows.sort(key=lambda item: (item[0], item[1]["status"] == "error"))
        return [row for _, row in rows]

    def scan(self) -> SpecChange:
        """Re-read what changed on disk since the last scan, and say what that changed."""
        return self._scan(settle=0.0, settle_max=0.0)

    def watching(self) -> dict[str, Any]:
        """How changes are noticed ("inotify", or "polling" and why), for status."""
        if self._watcher is None:
            return {"mode": "not watching", "reason": ""}
        return self._watcher.mode.as_dict()

    async def watch(
        self,
        stop: asyncio.Event,
        on_change: Callable[[SpecChange], Awaitable[None]],
        *,
        rescan: float = 30.0,
        poll: float = 0.5,
        settle: float = 0.01,
        settle_max: float = 1.0,
        opener: dirwatch.Opener = dirwatch.inotify,
    ) -> None:
        """Until ``stop``, scan on each change inotify reports, and every ``rescan`` seconds
        (every ``poll`` seconds where inotify cannot watch); call ``on_change`` for each
        non-empty change.

        A file modified less than ``settle`` seconds ago is left for later (it may be
        mid-write), but for no more than ``settle_max`` seconds.
        """
        watcher = dirwatch.DirWatcher(str(self.path), rescan=rescan, poll=poll, opener=opener)
        self._watcher = watcher

        async def scan() -> dirwatch.Plan:
            self.scans += 1
            try:
                change = await asyncio.to_thread(self._scan, settle, settle_max)
            except Exception:
                log.exception("specdir.scan_failed path=%s", self.path)
                return dirwatch.Plan(self._plan.dirs, wake=poll)
            if not change.empty:
                try:
                    await on_change(change)
                except Exception:
                    log.exception("specdir.on_change_failed path=%s", self.path)
            return self._plan

        await watcher.run(stop, scan)

    def _list(self) -> tuple[list[Path], dict[Path, str], set[str]]:
        if not self.path.exists():
            if not self._missing_logged:
                log.warning("specdir.missing path=%s action=treating_as_empty", self.path)
                self._missing_logged = True
            return [], {}, set()
        if self._missing_logged:
            log.info("specdir.found path=%s", self.path)
            self._missing_logged = False
        return spectree.walk(self.path)

    def _refused(self, outside: Mapping[Path, str]) -> dict[Path, _FileState]:
        """Symlinks not followed: an error each, and the documents in force of the file (or
        of the files under the directory) they replaced stay."""
        files: dict[Path, _FileState] = {}
        for link, reason in outside.items():
            error = DocumentError(Origin(str(link)), "", reason)
            old = self._files.get(link)
            files[link] = _FileState(None, old.documents if old is not None else (), (error,))
            for path, state in self._files.items():
                if link in path.parents:
                    files[path] = _FileState(None, state.documents, ())
        return files

    def _scan(self, settle: float, settle_max: float) -> SpecChange:
        with self._lock:
            now, clock = time.time_ns(), time.monotonic()
            listed, outside, walked = self._list()
            files = self._refused(outside)
            wake: float | None = None
            for path in listed:
                old = self._files.get(path)
                try:
                    stamp = _stamp(path)
                    if old is not None and old.stamp == stamp:
                        self._pending.pop(path, None)
                        files[path] = old
                        continue
                    if settle > 0 and now - stamp[0] < settle * 1e9:
                        first = self._pending.setdefault(path, clock)
                        if clock - first < settle_max:  # maybe mid-write: look again later
                            settled = settle - (now - stamp[0]) / 1e9
                            due = min(settled, first + settle_max - clock)
                            wake = due if wake is None else min(wake, due)
                            if old is not None:
                                files[path] = old
                            continue
                    self._pending.pop(path, None)
                    previous = old.documents if old is not None else ()
                    documents, errors = parse_file(
                        path,
                        self._registry,
                        self._kinds,
                        previous,
                        report_unread=self._report_unread,
                        limits=self._limits,
                    )
                    recorded = stamp if _stamp(path) == stamp else None  # changed while read
                except FileNotFoundError:
                    continue  # gone (or a dangling symlink): its documents go
                except OSError as exc:  # unreadable: like invalid, keep what was in force
                    documents = list(old.documents) if old is not None else []
                    reason = f"cannot read: {exc.strerror}"
                    errors, recorded = [DocumentError(Origin(str(path)), "", reason)], None
                files[path] = _FileState(recorded, tuple(documents), tuple(errors))
            present = set(listed) | set(files)
            self._pending = {p: t for p, t in self._pending.items() if p in present}
            self._files = files
            self._plan = dirwatch.Plan(spectree.watched_dirs(self.path, listed, walked), wake)
            return self._publish()

    def _publish(self) -> SpecChange:
        ordered = sorted(self._files.items(), key=lambda item: item[0].parts)
        current, conflicts = _resolve(state.documents for _, state in ordered)
        errors = [e for _, state in ordered for e in state.errors] + conflicts
        errors.sort(key=_error_order)
        old = self._current
        added = tuple(current[k] for k in sorted(current.keys() - old.keys()))
        removed = tuple(sorted(old.keys() - current.keys()))
        both = sorted(current.keys() & old.keys())
        updated = tuple(current[k] for k in both if not _same(current[k], old[k]))
        known = {_error_id(e) for e in self._errors}
        errors_changed = known != {_error_id(e) for e in errors}
        self._current, self._errors = current, errors
        change = SpecChange(added, updated, removed, tuple(errors), errors_changed)
        for error in errors:
            if _error_id(error) not in known:
                log.warning(
                    "specdir.invalid source=%s document=%d resource=%s field=%s reason=%r",
                    error.origin.source,
                    error.origin.index + 1,
                    error.key,
                    error.field,
                    error.reason,
                )
        if not change.empty:
            log.info(
                "specdir.reloaded path=%s added=%d updated=%d removed=%d errors=%d",
                self.path,
                len(added),
                len(updated),
                len(removed),
                len(errors),
            )
        return change


def load_paths(
    paths: Sequence[Path],
    registry: KindRegistry,
    kinds: Collection[str] | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> tuple[list[Document], list[DocumentError]]:
    """Offline validation: the documents (each key once) and errors of files and directories.

    A named file is read whatever its name; directories are walked as :class:`SpecDirectory`
    does. Duplicates are resolved in path order, as in a spec directory.
    """
    files: list[Path] = []
    errors: list[DocumentError] = []
    for path in paths:
        if path.exists():
            found, outside, _ = spectree.walk(path)
            files.extend(found)
            errors.extend(DocumentError(Origin(str(p)), "", r) for p, r in outside.items())
        else:
            errors.append(DocumentError(Origin(str(path)), "", "no such file or directory"))
    seen: set[str] = set()
    parsed: list[list[Document]] = []
    for path in sorted(files, key=lambda p: p.parts):
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        try:
            documents, file_errors = parse_file(path, registry, kinds, limits=limits)
        except FileNotFoundError:
            errors.append(DocumentError(Origin(str(path)), "", "no such file or directory"))
            continue
        parsed.append(documents)
        errors.extend(file_errors)
    current, conflicts = _resolve(parsed)
    errors.extend(conflicts)
    errors.sort(key=_error_order)
    documents = sorted(current.values(), key=lambda d: _origin_order(d.origin))
    return documents, errors

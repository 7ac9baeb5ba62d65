"""Where the mesh specification comes from: a directory of documents, or (later) the API.

A :class:`SpecSource` runs as ``async def run(stop)`` and hands the catalog every valid
document plus the errors, each time something changes. The directory source is the
default for a local run; a Kubernetes source (CRDs and Services through the API server)
plugs into the same protocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from trellis_catalog.catalog import Catalog
from trellis_common.documents import all_kinds
from trellis_common.documents.base import Document, DocumentError, KindRegistry
from trellis_common.specdir import SpecChange, SpecDirectory
from trellis_runtime.lifecycle import run_components
from trellis_spec.mesh import KINDS


def kinds() -> KindRegistry:
    return all_kinds()


class SpecSource(Protocol):
    async def load(self) -> None: ...

    async def run(self, stop: asyncio.Event) -> None: ...

    def describe(self) -> dict[str, Any]: ...


class DirectorySource:
    def __init__(
        self,
        catalog: Catalog,
        path: Path,
        *,
        rescan: float = 30.0,
        poll: float = 0.5,
        sink: Callable[[list[Document], list[DocumentError]], None] | None = None,
    ) -> None:
        self.catalog = catalog
        #: where the documents go: the catalog, or the union with another source's
        self._sink = sink or catalog.set_documents
        self.directory = SpecDirectory(path, kinds(), KINDS, report_unread=True)
        self.rescan = rescan
        self.poll = poll

    async def load(self) -> None:
        await asyncio.to_thread(self.directory.scan)
        self._apply()

    def _apply(self) -> None:
        self._sink(list(self.directory.current().values()), list(self.directory.errors()))

    async def _on_change(self, change: SpecChange) -> None:
        self._apply()

    async def run(self, stop: asyncio.Event) -> None:
        await self.directory.watch(stop, self._on_change, rescan=self.rescan, poll=self.poll)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "directory",
            "path": str(self.directory.path),
            "watch": self.directory.watching(),
        }


class NoSource:
    """No specification configured: the catalog serves providers' services only."""

    async def load(self) -> None:
        return None

    async def run(self, stop: asyncio.Event) -> None:
        await stop.wait()

    def describe(self) -> dict[str, Any]:
        return {"kind": "none"}


class BothSources:
    """The spec directory and the API server at once (see :class:`Sources`)."""

    def __init__(self, *parts: SpecSource) -> None:
        self.parts = parts

    async def load(self) -> None:
        for part in self.parts:
            await part.load()

    async def run(self, stop: asyncio.Event) -> None:
        await run_components([part.run for part in self.parts], stop)

    def describe(self) -> dict[str, Any]:
        return {"kind": "both", "sources": [part.describe() for part in self.parts]}


class Sources:
    """Documents from several sources at once: the catalog gets their union, in order of
    the sources (a document key two sources both have: the first one's)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._parts: dict[str, tuple[list[Document], list[DocumentError]]] = {}

    def set(
        self, name: str, documents: Iterable[Document], errors: Iterable[DocumentError]
    ) -> None:
        self._parts[name] = (list(documents), list(errors))
        merged: dict[Any, Document] = {}
        all_errors: list[DocumentError] = []
        for docs, errs in self._parts.values():
            for document in docs:
                merged.setdefault(document.key, document)
            all_errors.extend(errs)
        self.catalog.set_documents(merged.values(), all_errors)

"""The spec's documents as the sources hand them over, and what changed since the last ones.

A source (the spec directory, the Kubernetes API) hands over every document each time, after
one edit as after a full resync. :meth:`SpecDocuments.set` only keeps the list; the next
recompute compares it with the last one in steps (tens of thousands of documents are tens
of milliseconds of work), and learns each changed document's old resource.

Documents are told apart by identity first: a source that lists everything again after one
edit (the same objects but the edited one) costs a pass over the list, not a comparison,
nor even a hash of every key.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from trellis_common.documents.base import Document, DocumentError, DocumentKey
from trellis_spec import statuses
from trellis_spec.steps import Steps

STEP = 2000  # documents compared between two steps
INDEX_STEP = 10_000  # documents indexed by identity between two steps


@dataclass
class Changes:
    """What a new list changed: each changed document's old resource (None: it is new),
    whether the rejections changed, and whether a document moved (source or position)
    without changing (only its status moves)."""

    documents: dict[DocumentKey, Any] = field(default_factory=dict)
    errors: bool = False
    moved: bool = False


class SpecDocuments:
    def __init__(self) -> None:
        self.documents: list[Document] = []
        self.errors: list[DocumentError] = []
        self.error_statuses: list[statuses.Status] = []
        self.current: dict[DocumentKey, Document] = {}
        self.first_seen: dict[DocumentKey, datetime] = {}  # a route's age without a timestamp
        self._by_id: dict[int, Document] = {}  # the same documents, by identity
        self._pending: tuple[list[Document], list[DocumentError]] | None = None

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def set(self, documents: Iterable[Document], errors: Iterable[DocumentError]) -> None:
        """The whole specification, to be compared by :meth:`take_steps`."""
        self._pending = (list(documents), list(errors))

    def take_steps(self) -> Steps[Changes]:
        """Make the pending list the current one, comparing it with the last in steps."""
        changes = Changes()
        if self._pending is None:
            return changes
        (self.documents, self.errors), self._pending = self._pending, None
        error_statuses = [statuses.error_status(e) for e in self.errors]
        changes.errors = error_statuses != self.error_statuses
        self.error_statuses = error_statuses
        # the previous documents stay referenced until here: no new one can share an id
        by_id: dict[int, Document] = {}
        for position, document in enumerate(self.documents):
            if position % INDEX_STEP == 0:
                yield  # tens of thousands of documents: indexed a few thousand at a time
            by_id[id(document)] = document
        previous = self._by_id
        gone = {previous[i].key: previous[i] for i in previous.keys() - by_id.keys()}
        fresh = [by_id[i] for i in by_id.keys() - previous.keys()]
        self._by_id = by_id
        now = datetime.now(UTC)
        for position, document in enumerate(fresh):
            if position % STEP == 0:
                yield
            key = document.key
            old = gone.pop(key, None) or self.current.get(key)
            self.current[key] = document
            if old is None:
                self.first_seen[key] = now
                changes.documents.setdefault(key, None)
            elif old.resource != document.resource:
                changes.documents.setdefault(key, old.resource)
            elif (old.origin, old.api_version) != (document.origin, document.api_version):
                changes.moved = True
        for key, old in gone.items():
            if self.current.get(key) is old:
                del self.current[key]
                self.first_seen.pop(key, None)
                changes.documents.setdefault(key, old.resource)
        return changes

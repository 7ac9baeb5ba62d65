"""Converting a collection again when one member moved: the others are not converted again.

A service of 200 endpoints whose one endpoint moves travels whole at every hop of the
event path: endpoints-vm's gRPC answer, the catalog's report and cluster, the catalog's
answer to proxy-cp, proxy-cp's load assignment (endpoints-vm's own view of it is kept in
parts). Each answer carries the whole service, so each hop sees it whole again, and the
unchanged 199 are what a change mostly costs.

:class:`Members` keeps, per collection (a service, a cluster), the last conversion of each
member, and reuses it while the member is the same: the same object (``key=None``, for
immutable values a hop keeps), or the same key (``key=``, say the serialized bytes of a
message that arrives parsed anew each time). A conversion that raises is not kept. Only the
members of each collection's last conversion are kept, so memory follows what is current;
:meth:`forget` drops a collection that is gone. The runs a change left alone are found and
copied by C (a loop over 200 members in Python was a sixth of the catalog's work per
change under churn); with a ``key`` that C computes too (``operator.attrgetter``,
``methodcaller``), a pass costs Python only for what moved.

Reusing a converted member keeps its identity too, so the next hop's comparison of an old
and a new collection (tuples compare members by identity first) costs a pointer per
unchanged member instead of a field-by-field comparison.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Hashable, Iterable, Sequence
from itertools import compress, count, repeat
from typing import Any, Generic, TypeVar

C = TypeVar("C", bound=Hashable)  # a collection's key
T = TypeVar("T")  # a member as it comes
V = TypeVar("V")  # a member converted


class Members(Generic[C, T, V]):
    """Member conversions reused per collection; see the module docstring."""

    def __init__(
        self, convert: Callable[[T, Any], V], key: Callable[[T], Hashable] | None = None
    ) -> None:
        self._convert = convert
        self._key = key
        #: how two members are the same: the same object, or equal keys
        self._same: Callable[[Any, Any], bool] = operator.is_ if key is None else operator.eq
        #: per collection: what its conversions depend on, its members (by identity: kept
        #: alive, so their ids are theirs) or their keys, and their values, in order
        self._last: dict[C, tuple[Hashable, tuple[Any, ...], list[V]]] = {}
        self.hits = 0
        self.misses = 0

    def convert(
        self,
        collection: C,
        members: Iterable[T],
        context: Hashable = None,
        keys: Sequence[Hashable] | None = None,
    ) -> list[V]:
        """Every member converted (``convert(member, context)``), in order. ``context`` is
        what else the conversion reads (a port's spec): when it differs from the last
        one's, nothing is reused. ``keys``: the members' keys, where the caller read them
        already (with a ``key`` that is what this would compute).

        What a change leaves alone, the run before the first member that moved and the run
        after the last, is found by C (``operator.is_`` or ``eq`` over both lists) and its
        values copied; the members between are looked up by C too (:meth:`_middle`), and
        those the last list did not hold converted. A collection of 200 that gained one
        member here and lost another there costs a few C passes and one conversion, not
        200 lookups in Python."""
        listed = tuple(members)
        if keys is not None:
            if self._key is None or len(keys) != len(listed):
                raise ValueError("keys are for a Members with a key, one per member")
            tokens: tuple[Any, ...] = tuple(keys)
        else:
            tokens = listed if self._key is None else tuple(map(self._key, listed))
        last = self._last.get(collection)
        if last is None or last[0] != context:
            values = [self._convert(member, context) for member in listed]
            self.misses += len(values)
            self._last[collection] = (context, tokens, values)
            return list(values)
        _, before, before_values = last
        same = self._same
        shorter = min(len(before), len(tokens))
        flags = list(map(same, before[:shorter], tokens[:shorter]))
        head = flags.index(False) if False in flags else shorter
        flags = list(map(same, reversed(before[head:]), reversed(tokens[head:])))
        tail = flags.index(False) if False in flags else len(flags)
        values = before_values[:head]
        if head < len(tokens) - tail:
            values += self._middle(
                listed[head : len(tokens) - tail],
                tokens[head : len(tokens) - tail],
                before,
                before_values,
                context,
            )
        values += before_values[len(before) - tail :]
        self.hits += head + tail
        self._last[collection] = (context, tokens, values)
        return list(values)  # the caller's own: the kept one is the next call's

    def _middle(
        self,
        listed: tuple[T, ...],
        tokens: tuple[Any, ...],
        before: tuple[Any, ...],
        before_values: list[V],
        context: Hashable,
    ) -> list[V]:
        """The values of the members between the unchanged runs: each one the last list
        held (anywhere in it: a reorder, or a member twice) looked up by C in a dict of
        that list, by identity or key; only the others converted."""
        if self._key is None:
            tokens, before = tuple(map(id, tokens)), tuple(map(id, before))
        kept: dict[Any, V] = dict(zip(before, before_values, strict=True))
        found: list[V] = list(map(kept.get, tokens, repeat(_MISSING)))
        missing = list(compress(count(), map(operator.is_, found, repeat(_MISSING))))
        for at in missing:
            found[at] = self._convert(listed[at], context)
        self.misses += len(missing)
        self.hits += len(found) - len(missing)
        return found

    def forget(self, collection: C) -> None:
        self._last.pop(collection, None)

    def retain(self, keep: Callable[[C], bool]) -> None:
        """Forget every collection ``keep`` says no to (after a listing of them all)."""
        for collection in [c for c in self._last if not keep(c)]:
            del self._last[collection]

    def __len__(self) -> int:
        """How many collections are kept."""
        return len(self._last)


_MISSING: Any = object()


D = TypeVar("D")
_FIELDS: dict[type, Callable[[Any], Any]] = {}


def sorted_unique(values: Iterable[D]) -> tuple[D, ...]:
    """``tuple(sorted(set(values)))`` of ordered dataclasses, with C doing the work.

    A dataclass's generated ``__hash__``, ``__eq__`` and ``__lt__`` build a tuple of its
    fields in Python at every call; a sort of 200 calls ``__lt__`` about 1,500 times. Here
    each value's fields are read once, into a tuple (``attrgetter``), and those tuples are
    hashed and compared by C. Same result: two dataclasses are equal, and ordered, as the
    tuples of their fields are.
    """
    listed = list(values)
    if not listed:
        return ()
    cls = type(listed[0])
    if any(map(operator.is_not, map(type, listed), repeat(cls))):  # mixed: compared as they are
        return tuple(sorted(set(listed)))  # type: ignore[type-var]
    unique = dict(zip(map(fields_of(cls), listed), listed, strict=True))
    return tuple(map(unique.__getitem__, sorted(unique)))


def fields_of(cls: type) -> Callable[[Any], Any]:
    """A function of a dataclass value to the tuple of its fields, in order: what its
    generated ``__eq__`` and ``__lt__`` compare, read by C."""
    found = _FIELDS.get(cls)
    if found is None:
        names = [f.name for f in dataclasses.fields(cls)]
        getter = operator.attrgetter(*names)
        found = _FIELDS[cls] = getter if len(names) > 1 else lambda v: (getter(v),)
    return found

"""Reading one YAML file of documents at a bounded cost.

Whoever can write a file into a spec directory should not be able to stop the service that
reads it. Two things make a YAML file cost more than its text suggests:

* **Size.** A file over ``max_file_bytes`` is refused from its size (``fstat``), before it
  is read, and a file that grows past the limit while being read is refused too.
* **Aliases.** An alias (``*name``) stands for the whole node it names, so nine lines of
  nine aliases each stand for a billion strings ("billion laughs"). Building them is cheap
  (the loader shares one object per node), but whatever walks the result afterwards (model
  validation, JSON, a comparison) walks the billion. So each document is first *composed*
  (a node graph where an alias is the node it names), and the nodes the aliases add are
  counted on that graph, each node once: time and memory linear in the text. A file whose
  aliases add more than ``max_alias_nodes`` is refused before anything is built, and so is
  an alias inside the node it names (a recursive structure).

Either refusal is a :class:`TooCostly` whose message names the limit, its setting and the
value found; the caller turns it into an error of the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True, slots=True)
class Limits:
    """What one YAML file may cost to load."""

    max_file_bytes: int = 1024 * 1024
    """A larger file is refused from its size, unread."""
    max_alias_nodes: int = 10_000
    """The nodes YAML aliases may add to a file, each alias counted as the node it names."""


DEFAULT_LIMITS = Limits()


class TooCostly(Exception):
    """A file refused for what it would cost; the message says which limit and why."""


def load(path: Path, limits: Limits = DEFAULT_LIMITS) -> list[Any]:
    """Every document of the file at ``path`` (``None`` for an empty one), within ``limits``.

    Raises :class:`TooCostly`, ``OSError`` (``FileNotFoundError`` if it is gone),
    ``yaml.YAMLError``, or ``RecursionError`` for nesting too deep to build.
    """
    return load_bytes(read(path, limits.max_file_bytes), limits.max_alias_nodes)


def read(path: Path, limit: int) -> bytes:
    """The file's bytes, if there are at most ``limit`` of them."""
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size > limit:
            raise TooCostly(_size_reason(size, limit))
        data = file.read(limit + 1)
    if len(data) > limit:  # it grew while being read
        raise TooCostly(_size_reason(len(data), limit, "at least "))
    return data


def _size_reason(size: int, limit: int, qualifier: str = "") -> str:
    return (
        f"file too large: {qualifier}{size} bytes, over the limit of {limit} bytes "
        "(max_file_bytes); not read"
    )


def load_bytes(data: bytes, limit: int) -> list[Any]:
    """Every document of ``data``, as long as its aliases add at most ``limit`` nodes."""
    loader = _Loader(data)
    try:
        documents: list[Any] = []
        added = 0
        while loader.check_node():
            node = loader.get_node()
            sizes: dict[int, int] = {}
            added += expanded_size(node, sizes, set()) - len(sizes)
            if added > limit:
                raise TooCostly(
                    f"YAML aliases expand to more than {limit} extra nodes "
                    f"({added} so far, max_alias_nodes); not loaded"
                )
            documents.append(loader.construct_document(node))
        return documents
    finally:
        loader.dispose()


def expanded_size(node: yaml.Node, sizes: dict[int, int], open_: set[int]) -> int:
    """The nodes of ``node`` with every alias expanded; ``sizes`` remembers each node's
    (so each is counted once, and ``len(sizes)`` is the number of distinct nodes)."""
    key = id(node)
    known = sizes.get(key)
    if known is not None:
        return known
    if key in open_:
        raise TooCostly("a YAML alias refers to a node that contains it (a recursive alias)")
    open_.add(key)
    total = 1
    if isinstance(node, yaml.SequenceNode):
        total += sum(expanded_size(child, sizes, open_) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        for name, value in node.value:
            total += expanded_size(name, sizes, open_) + expanded_size(value, sizes, open_)
    open_.discard(key)
    sizes[key] = total
    return total

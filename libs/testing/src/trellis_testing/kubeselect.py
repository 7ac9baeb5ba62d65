"""Label selectors as the API server reads ``labelSelector=``: equality (``=``, ``==``,
``!=``), sets (``in``, ``notin``) and existence (``key``, ``!key``), for the Kubernetes API
emulator's lists and watches."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Selector:
    """A label selector as ``labelSelector=`` spells it."""

    terms: tuple[tuple[str, str, frozenset[str]], ...]

    @classmethod
    def parse(cls, text: str | None) -> Selector:
        terms: list[tuple[str, str, frozenset[str]]] = []
        for raw in _split_terms(text or ""):
            term = raw.strip()
            if not term:
                continue
            for op in (" notin ", " in "):
                if op in term:
                    key, values = term.split(op, 1)
                    names = frozenset(v.strip() for v in values.strip().strip("()").split(","))
                    terms.append((key.strip(), op.strip(), names))
                    break
            else:
                if "!=" in term:
                    key, value = term.split("!=", 1)
                    terms.append((key.strip(), "!=", frozenset([value.strip()])))
                elif "=" in term:
                    key, value = term.replace("==", "=").split("=", 1)
                    terms.append((key.strip(), "=", frozenset([value.strip()])))
                elif term.startswith("!"):
                    terms.append((term[1:].strip(), "!", frozenset()))
                else:
                    terms.append((term, "exists", frozenset()))
        return cls(tuple(terms))

    def matches(self, labels: dict[str, str]) -> bool:
        for key, op, values in self.terms:
            present = key in labels
            if op in ("=", "in") and not (present and labels[key] in values):
                return False
            if op in ("!=", "notin") and present and labels[key] in values:
                return False
            if (op == "exists" and not present) or (op == "!" and present):
                return False
        return True


def _split_terms(text: str) -> Iterator[str]:
    """Split on commas outside ``in (a,b)`` parentheses."""
    depth, start = 0, 0
    for index, char in enumerate(text):
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            yield text[start:index]
            start = index + 1
    yield text[start:]

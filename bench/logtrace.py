"""The lines of several processes' logs in one time window, in order (:mod:`bench.trace`).

A Trellis service writes ``ts=2026-11-28T09:12:56.123Z level=... logger=... event ...``
(UTC, milliseconds); Envoy writes ``[2026-11-28 09:12:56.123][pid][level][logger] ...``
in the machine's local time. :func:`parse` reads both; :func:`window` keeps the lines of a
time window, those of the hops a change crosses unless ``every``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

#: words that mark a hop of the path in a service's line (without --all)
HOPS = re.compile(
    r"workload\.|signal|endpoints\.|provider\.|catalog\.|views?\.|flush|snapshot|push|"
    r"delta|sotw|ack|GetService|GetResources|ListChanges|resources|cds|eds|ClusterLoadAssignment|"
    r"upstream|config",
    re.IGNORECASE,
)
#: hop lines that say nothing of the change (Envoy's per-host notes)
NOISE = re.compile(r"transport socket match")
_SERVICE_TS = re.compile(r"^ts=(\S+)Z ")
_ENVOY_TS = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\]")


@dataclass(frozen=True, slots=True)
class Line:
    at: float  # seconds since the epoch
    source: str
    text: str


def parse(source: str, text: str) -> Iterator[Line]:
    """The timestamped lines of a service's (``ts=...Z``) or Envoy's (``[...]``) log."""
    for raw in text.splitlines():
        found = _SERVICE_TS.match(raw)
        if found is not None:
            stamp = datetime.fromisoformat(found.group(1)).replace(tzinfo=UTC)
            body = raw[found.end() :]
        else:
            found = _ENVOY_TS.match(raw)
            if found is None:
                continue
            stamp = datetime.fromisoformat(found.group(1)).astimezone(UTC)
            body = raw[found.end() :].strip()
        yield Line(stamp.timestamp(), source, body)


def window(logs: dict[str, str], start: float, end: float, every: bool) -> list[Line]:
    """Lines from ``start`` to ``end`` (1 ms either side: the logs' resolution), in order."""
    found = [
        line
        for source, text in logs.items()
        for line in parse(source, text)
        if start - 0.001 <= line.at <= end + 0.001
        and (every or (HOPS.search(line.text) and not NOISE.search(line.text)))
    ]
    return sorted(found, key=lambda line: line.at)

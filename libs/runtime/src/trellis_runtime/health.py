"""What a service knows about its own health beyond "the process is up".

Two things an operator must be able to see without reading logs:

* **Loops.** Every long-lived stream, subscription or poller of a service registers a
  :class:`Loop`. It is *down* from its start until it reports ``up()`` (synced), and again
  from any failure until it has recovered. While one is down, ``/readyz`` answers 503 and
  names it with the reason, and ``/v1/status`` (and so ``trellis status``) shows it with its
  restart count. A loop that is stopped on purpose is ``close()``-d and leaves the table.
* **Rejections.** A record that fails validation where it enters, or where it is consumed
  (a spec document, a Redis value, a provider's report, a certificate record, a proxy's
  metadata), is rejected with a reason: :meth:`Rejections.reject` logs it once per
  (source, key, reason), counts it in ``trellis_rejected_records_total{source}``, and keeps it
  for ``/v1/status`` until the same key is accepted again (:meth:`Rejections.accept`).
  Rejecting one record never stops the others.
* **Roles.** A replica that takes part in a leader election (:mod:`trellis_kube.leadership`)
  adds it to :class:`Roles`: ``/v1/status`` lists each election (who holds it, the fencing
  token, whether this replica leads and since when), ``/readyz`` names this replica's role
  (``leader`` or ``standby``: a standby is ready, not broken; an election that cannot reach
  its API server or Redis is a down loop like any other), and the metrics carry
  ``trellis_leader{name}`` (1 while leading) and ``trellis_leader_transitions_total{name}``
  (each change of this replica's role).

All are plain objects handed to the parts that report, never globals.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger(__name__)

#: At most this many distinct rejected records are kept for status; the oldest go first.
MAX_KEPT_REJECTIONS = 200


@dataclass(frozen=True, slots=True)
class LoopStatus:
    name: str
    up: bool
    reason: str
    since: float
    restarts: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "up": self.up,
            "reason": self.reason,
            "since": self.since,
            "restarts": self.restarts,
        }


class Loop:
    """The reported state of one long-lived loop; made by :meth:`Loops.register`."""

    def __init__(self, owner: Loops, name: str, clock: Callable[[], float]) -> None:
        self._owner = owner
        self._clock = clock
        self.name = name
        self.is_up = False
        self.reason = "starting"
        self.since = clock()
        self.restarts = 0

    def up(self) -> None:
        if not self.is_up:
            if self.restarts:
                log.info("loop.recovered loop=%r restarts=%d", self.name, self.restarts)
            self.is_up, self.reason, self.since = True, "", self._clock()
            self._owner.changed()

    def down(self, reason: str) -> None:
        """Down for ``reason`` (a failure: counted as a restart)."""
        if self.is_up or reason != self.reason:
            self.since = self._clock() if self.is_up else self.since
            self.is_up, self.reason = False, reason
        self.restarts += 1
        self._owner.restarted(self)
        self._owner.changed()

    def close(self) -> None:
        self._owner.remove(self)

    def status(self) -> LoopStatus:
        return LoopStatus(self.name, self.is_up, self.reason, self.since, self.restarts)


class Loops:
    """The loops of one service, for readiness and status."""

    def __init__(
        self, metrics: CollectorRegistry | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self._clock = clock
        self._loops: dict[str, Loop] = {}
        self._down: Gauge | None = None
        self._restarts: Counter | None = None
        if metrics is not None:
            self._down = Gauge(
                "trellis_loop_down",
                "1 while a long-lived loop (stream, subscription) is down, else 0",
                ["loop"],
                registry=metrics,
            )
            self._restarts = Counter(
                "trellis_loop_restarts",
                "Times a long-lived loop failed and was restarted",
                ["loop"],
                registry=metrics,
            )

    def register(self, name: str) -> Loop:
        loop = Loop(self, name, self._clock)
        self._loops[name] = loop
        self.changed()
        return loop

    def remove(self, loop: Loop) -> None:
        if self._loops.get(loop.name) is loop:
            del self._loops[loop.name]
            if self._down is not None:
                self._down.remove(loop.name)

    def changed(self) -> None:
        if self._down is not None:
            for loop in self._loops.values():
                self._down.labels(loop.name).set(0 if loop.is_up else 1)

    def restarted(self, loop: Loop) -> None:
        if self._restarts is not None:
            self._restarts.labels(loop.name).inc()

    def __iter__(self) -> Iterator[Loop]:
        return iter(list(self._loops.values()))

    def down(self) -> dict[str, str]:
        """The loops that are down, with their reasons."""
        return {loop.name: loop.reason for loop in self if not loop.is_up}

    def statuses(self) -> list[LoopStatus]:
        return [loop.status() for loop in sorted(self, key=lambda loop: loop.name)]


@dataclass(frozen=True, slots=True)
class Rejection:
    source: str
    key: str
    reason: str
    first_seen: float
    last_seen: float
    count: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "key": self.key,
            "reason": self.reason,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "count": self.count,
        }


class Rejections:
    """The records a service refused, by source and key, with the reason for each."""

    def __init__(
        self,
        metrics: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        keep: int = MAX_KEPT_REJECTIONS,
    ) -> None:
        self._clock = clock
        self._keep = keep
        self._items: OrderedDict[tuple[str, str], Rejection] = OrderedDict()
        self._counter: Counter | None = None
        self._current: Gauge | None = None
        if metrics is not None:
            self._counter = Counter(
                "trellis_rejected_records",
                "Records rejected by validation, by where they came from",
                ["source"],
                registry=metrics,
            )
            self._current = Gauge(
                "trellis_rejected_records_current",
                "Records currently rejected (not since accepted), by where they came from",
                ["source"],
                registry=metrics,
            )

    def reject(self, source: str, key: str, reason: str) -> None:
        """Record that ``key`` from ``source`` was refused for ``reason``; never raises."""
        now = self._clock()
        previous = self._items.pop((source, key), None)
        if previous is None or previous.reason != reason:
            log.warning("record.rejected source=%s key=%r reason=%r", source, key, reason)
        self._items[(source, key)] = Rejection(
            source,
            key,
            reason,
            previous.first_seen if previous is not None else now,
            now,
            (previous.count if previous is not None else 0) + 1,
        )
        while len(self._items) > self._keep:
            self._items.popitem(last=False)
        if self._counter is not None:
            self._counter.labels(source).inc()
        self._update_gauge(source)

    def accept(self, source: str, key: str) -> None:
        """``key`` from ``source`` is valid now (or gone): it leaves the rejected list."""
        if self._items.pop((source, key), None) is not None:
            log.info("record.accepted source=%s key=%r", source, key)
            self._update_gauge(source)

    async def guarded(self, source: str, key: str, call: Awaitable[None]) -> bool:
        """Await ``call`` (handing one record on); a failure is logged with its traceback
        and rejected, never raised: one record never stops the others. True if it went."""
        try:
            await call
        except Exception as exc:
            log.exception("record.handing_on_failed source=%s key=%s", source, key)
            self.reject(
                source, key, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            )
            return False
        self.accept(source, key)
        return True

    def accept_all(self, source: str, keep: set[str] | frozenset[str] = frozenset()) -> None:
        """Forget every rejection of ``source`` except those of ``keep`` (after a resync)."""
        for item_source, key in list(self._items):
            if item_source == source and key not in keep:
                del self._items[(item_source, key)]
        self._update_gauge(source)

    def _update_gauge(self, source: str) -> None:
        if self._current is not None:
            self._current.labels(source).set(sum(1 for s, _ in self._items if s == source))

    def items(self) -> list[Rejection]:
        return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)


class Role(Protocol):
    """One leader election as a replica takes part in it (a ``Leadership``)."""

    @property
    def name(self) -> str: ...
    @property
    def leading(self) -> bool: ...
    @property
    def holder(self) -> str | None: ...
    @property
    def token(self) -> int: ...
    @property
    def since(self) -> float: ...


class Roles:
    """The leader elections this replica takes part in, for readiness, status and metrics."""

    def __init__(self, metrics: CollectorRegistry | None = None) -> None:
        self._roles: dict[str, Role] = {}
        self._leader: Gauge | None = None
        self._transitions: Counter | None = None
        if metrics is not None:
            self._leader = Gauge(
                "trellis_leader",
                "1 while this replica leads the election, else 0",
                ["name"],
                registry=metrics,
            )
            self._transitions = Counter(
                "trellis_leader_transitions",
                "Changes of this replica's role in the election (standby to leader, and back)",
                ["name"],
                registry=metrics,
            )

    def add(self, role: Role) -> None:
        self._roles[role.name] = role
        if self._leader is not None:
            # read at scrape time: a leader past its renew deadline shows 0 at once
            self._leader.labels(role.name).set_function(lambda: 1.0 if role.leading else 0.0)
        if self._transitions is not None:
            self._transitions.labels(role.name)

    def changed(self, role: Role) -> None:
        """``role`` became leader, or stopped being it."""
        if self._transitions is not None:
            self._transitions.labels(role.name).inc()

    def __iter__(self) -> Iterator[Role]:
        return iter(sorted(self._roles.values(), key=lambda role: role.name))

    def summary(self) -> dict[str, str]:
        """This replica's role in each election: ``leader`` or ``standby``."""
        return {role.name: "leader" if role.leading else "standby" for role in self}

    def statuses(self) -> list[dict[str, Any]]:
        return [
            {
                "name": role.name,
                "leading": role.leading,
                "holder": role.holder,
                "token": role.token,
                "since": role.since,
            }
            for role in self
        ]


class Health:
    """A service's loops, rejections and roles together, as the admin app and status read
    them; ``instance`` is the name of this replica (settings' ``instance_name``)."""

    def __init__(
        self,
        metrics: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        instance: str = "",
    ) -> None:
        self.instance = instance
        self.loops = Loops(metrics, clock)
        self.rejections = Rejections(metrics, clock)
        self.roles = Roles(metrics)

    def status(self) -> dict[str, Any]:
        return {
            "loops": [status.as_dict() for status in self.loops.statuses()],
            "rejections": [item.as_dict() for item in self.rejections.items()],
            "leadership": self.roles.statuses(),
        }

"""A registered service's view in parts, so that a change to one workload moves one part.

The view of a service that only registrations fill (no ServiceEntry declares it) is its
counted members' endpoints, sorted and without repeats
(:func:`~trellis_common.memo.sorted_unique`), and the ports its members name. Built whole
at every change, a service of 200 workloads costs 200 of everything per change: reading
each member's verdict, converting it, reading its fields to sort, comparing. Under churn
that was the largest share of endpoints-vm's CPU after the HTTP stack itself.

:class:`Listed` keeps the parts: per member, the workload it last saw and the endpoint made
of it, in the view's order (each endpoint's sort key is its fields, as ``sorted_unique``
orders them; two workloads never make equal endpoints, since an endpoint names its
workload), and a count of the (name, number) pairs the members' ports name. :meth:`move`
applies one workload's new state in O(log N) comparisons and one insertion; the view is
then a copy of the list (C). An endpoint whose content did not change keeps its identity,
so the next hop's comparison of the old and the new view costs a pointer per member.

Ports: a name with one number across the members is that port; a name given two numbers
by different workloads is resolved as the whole computation does (the first member by id
names it), which is the one case that reads every member again.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from trellis_common.memo import fields_of
from trellis_endpoints_vm.domain.views import EndpointInfo, PortInfo
from trellis_endpoints_vm.domain.workloads import Workload

_KEY = fields_of(EndpointInfo)


@dataclass
class _Member:
    workload: Workload
    endpoint: EndpointInfo | None  # None: not counted (expired)
    order: Any = None  # the endpoint's sort key


@dataclass
class Listed:
    """One service's members, their endpoints in order, and their ports (see the module)."""

    members: dict[str, _Member] = field(default_factory=dict)
    _order: list[Any] = field(default_factory=list)
    _endpoints: list[EndpointInfo] = field(default_factory=list)
    _ports: Counter[tuple[str, int]] = field(default_factory=Counter)

    def move(self, workload_id: str, workload: Workload | None, counted: bool) -> None:
        """``workload_id`` is now ``workload`` (None: no longer a member), counted in the
        view or not."""
        old = self.members.pop(workload_id, None)
        if old is not None:
            self._ports.subtract(old.workload.ports)
            self._ports += Counter()  # drop the names no member gives any more
            if old.endpoint is not None:
                at = bisect_left(self._order, old.order)
                del self._order[at]
                del self._endpoints[at]
        if workload is None:
            return
        self._ports.update(workload.ports)
        if not counted:
            self.members[workload_id] = _Member(workload, None)
            return
        endpoint = workload.endpoint()
        if old is not None and old.endpoint is not None and old.endpoint == endpoint:
            endpoint = old.endpoint  # the same content: the same object for the next hop
        order = _KEY(endpoint)
        at = bisect_left(self._order, order)
        self._order.insert(at, order)
        self._endpoints.insert(at, endpoint)
        self.members[workload_id] = _Member(workload, endpoint, order)

    @property
    def endpoints(self) -> tuple[EndpointInfo, ...]:
        return tuple(self._endpoints)

    def ports(self, members: Callable[[], Iterable[Workload]]) -> tuple[PortInfo, ...]:
        """The ports the members name; ``members`` (by id) is read only when a name has
        two numbers."""
        numbers: dict[str, int] = {}
        for name, number in self._ports:
            if numbers.setdefault(name, number) != number:
                return registered_ports(members())
        return tuple(PortInfo(name, number) for name, number in sorted(numbers.items()))


def registered_ports(members: Iterable[Workload]) -> tuple[PortInfo, ...]:
    """Each port name with the number the first member (by id) gives it."""
    ports: dict[str, int] = {}
    for workload in members:
        for name, number in workload.ports:
            ports.setdefault(name, number)
    return tuple(PortInfo(name, number) for name, number in sorted(ports.items()))

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

Ports: each name is numbered by the first member (by id) that names it, so each name
keeps its holders in that order: (workload id, the port's place among the workload's,
number), and the first one numbers it.
"""

from __future__ import annotations

from bisect import bisect_left
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
    _holders: dict[str, list[tuple[str, int, int]]] = field(default_factory=dict)

    def move(self, workload_id: str, workload: Workload | None, counted: bool) -> None:
        """``workload_id`` is now ``workload`` (None: no longer a member), counted in the
        view or not."""
        old = self.members.pop(workload_id, None)
        if old is not None:
            self._hold(workload_id, old.workload, add=False)
            if old.endpoint is not None:
                at = bisect_left(self._order, old.order)
                del self._order[at]
                del self._endpoints[at]
        if workload is None:
            return
        self._hold(workload_id, workload, add=True)
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

    @property
    def ports(self) -> tuple[PortInfo, ...]:
        """Each port name the members give, numbered by the first member (by id)."""
        return tuple(PortInfo(name, self._holders[name][0][2]) for name in sorted(self._holders))

    def _hold(self, workload_id: str, workload: Workload, *, add: bool) -> None:
        for place, (name, number) in enumerate(workload.ports):
            holders = self._holders.setdefault(name, [])
            holder = (workload_id, place, number)
            at = bisect_left(holders, holder)
            if add:
                holders.insert(at, holder)
                continue
            del holders[at]
            if not holders:
                del self._holders[name]

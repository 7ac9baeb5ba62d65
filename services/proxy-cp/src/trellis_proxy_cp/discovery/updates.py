"""What a ``Get`` stream sends: the difference between what its client has and what is
true now, in the order the seeds' contract and Linkerd's own server give.

* first: ``add`` with every endpoint, or ``no_endpoints`` (``exists`` as :class:`Resolved`
  says: true for a service with none, false for one that does not exist or that the client
  is to resolve by DNS);
* then: ``add`` of what came or changed, then ``remove`` of what went: make before break,
  so a workload whose address is replaced is never missing from the client's set;
  ``no_endpoints{exists:true}`` when the last endpoint goes, ``exists:false`` when the
  service goes.

The conduit API's messages are the same, in its own types (:func:`to_conduit`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trellis_api.conduit.common import common_pb2 as conduit_common
from trellis_api.conduit.proxy.destination import destination_pb2 as conduit
from trellis_api.linkerd import destination_pb2 as dpb
from trellis_proxy_cp.translate import linkerd

Addresses = dict[tuple[str, int], dpb.WeightedAddr]


@dataclass(frozen=True, slots=True)
class Resolved:
    """What a ``Get`` names, now: does it exist, its addresses, and the destination that
    owns it (``<namespace>/<name>``; empty if none)."""

    exists: bool
    addresses: Addresses
    owner: str = ""


#: What a caller is told of a destination it may not reach (yet): nothing.
NOTHING = Resolved(False, {})


def get_updates(before: Resolved | None, now: Resolved, labels: dict[str, str]) -> list[dpb.Update]:
    """What moves a client from ``before`` (None: nothing sent yet) to ``now``: what came
    is added before what went is removed (make before break)."""
    if before is None:
        if now.addresses:
            return [_add(now.addresses.values(), labels)]
        return [dpb.Update(no_endpoints=dpb.NoEndpoints(exists=now.exists))]
    if not now.exists:
        gone = before.exists or bool(before.addresses)
        return [dpb.Update(no_endpoints=dpb.NoEndpoints(exists=False))] if gone else []
    if not now.addresses:
        if before.addresses or not before.exists:
            return [dpb.Update(no_endpoints=dpb.NoEndpoints(exists=True))]
        return []
    updates = []
    added = [a for key, a in sorted(now.addresses.items()) if before.addresses.get(key) != a]
    if added:
        updates.append(_add(added, labels))
    removed = [key for key in before.addresses if key not in now.addresses]
    if removed:
        addrs = [linkerd.tcp_address(ip, port) for ip, port in sorted(removed)]
        updates.append(dpb.Update(remove=dpb.AddrSet(addrs=addrs)))
    return updates


def _add(addrs: Any, labels: dict[str, str]) -> dpb.Update:
    return dpb.Update(add=dpb.WeightedAddrSet(addrs=list(addrs), metric_labels=labels))


def to_conduit(update: dpb.Update) -> conduit.Update:
    kind = update.WhichOneof("update")
    if kind == "add":
        addrs = [linkerd.conduit_weighted_addr(a) for a in update.add.addrs]
        return conduit.Update(
            add=conduit.WeightedAddrSet(addrs=addrs, metric_labels=update.add.metric_labels)
        )
    if kind == "remove":
        removed = [
            conduit_common.TcpAddress.FromString(a.SerializeToString()) for a in update.remove.addrs
        ]
        return conduit.Update(remove=conduit.AddrSet(addrs=removed))
    return conduit.Update(no_endpoints=conduit.NoEndpoints(exists=update.no_endpoints.exists))

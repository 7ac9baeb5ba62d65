"""Who asks the Destination API, and what it may be told: only what its identity's view
reaches.

**The caller** is identified as an xDS stream's proxy is (:meth:`.MeshAuthorizer.identify`: a
proxy certificate of the mesh CA, its serial current and not revoked, the proxy expected by
the catalog), and its identity is its common name's ``<namespace>/<service>``, whose view
the catalog computes for that proxy's xDS too. The catalog answers a policy for any
identity, even one no proxy has (its service account's reach: nothing under a deny-by-default
policy, everything in permissive mode), so the view alone never admits anyone: a proxy the
catalog does not expect is refused before any view is asked (``not_expected``, as on xDS).

**What a view reaches** (:class:`Reach`) is a set of destination names, ``<namespace>/<name>``:
its outbound services (what SMI TrafficTargets, TrafficSplits and routes let the identity
call; in permissive mode the catalog lists there every service exported to the caller's
namespace, so no shortcut is taken here), the services of the clusters it routes to (split
and route backends), and the ServiceEntries it may reach (``external``, by their source).
A request is answered from one destination, its *owner*: by service name, by ServiceEntry
host, by a service address (clusterIP, ServiceEntry address), or, for an endpoint's own
address, the destination the endpoint is found in. A cluster name or address that no
destination owns is answered as before (``no_endpoints{exists: false}``, the default
profile): that tells nothing of anything. (A name that is neither a cluster name nor a
ServiceEntry host is refused INVALID_ARGUMENT before any of this, as upstream does.)

**Views** (:class:`CallerViews`) are asked of the catalog once per identity, when its first
stream opens, through the catalog client that follows the views of xDS proxies (``want``);
that client's follower hands each new view on (:meth:`CallerViews.set`) while any stream of
the identity is open, and the identity is forgotten with its last stream. A new view that
reaches the same names (most are endpoint changes) wakes no stream.

**The table and the views follow the catalog apart**, so for a moment either may be ahead of
the other. A stream's :class:`Sight` decides at every tick:

* at open, a destination the view does not reach is refused (PERMISSION_DENIED);
* when the table moved and now has a destination the view does not reach (a service that
  just appeared, an address that moved), it is answered as if it did not exist: only a
  newer view may refuse it, or let it through;
* when the view moved and no longer reaches the destination, the table is first brought up
  to date (a listing asked for after the view arrived:
  :meth:`.ResourceFollower.fresh`). If the destination is still there, the caller may no
  longer reach it: the stream ends PERMISSION_DENIED, and a new one is refused until the
  policy changes back. If it went meanwhile (a service removed: views and table lose it
  together), the stream follows it as gone, as it always has.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from trellis_api import catalog_pb2 as cpb
from trellis_proxy_cp.authorizer import PresentedProxy
from trellis_proxy_cp.transport.streams import StreamRefused
from trellis_runtime.locate import OwnerUnavailable

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
Watcher = Callable[[], None]
#: The catalog client's ``want``: an identity's view, followed from now on.
WantView = Callable[[str, str], Awaitable[cpb.View]]
Identify = Callable[[Context], Awaitable["Caller"]]


@dataclass(frozen=True, slots=True)
class Caller:
    """The proxy on the other end of a Destination API call."""

    common_name: str
    identity: str
    """``<namespace>/<service>``: the identity whose view says what it may reach."""
    service_account: str

    @classmethod
    def of(cls, presented: PresentedProxy) -> Caller:
        proxy = presented.proxy
        identity = f"{proxy.namespace}/{proxy.service}"  # as MeshAuthorizer.authorize names it
        return cls(presented.common_name, identity, presented.expected.account)

    def __str__(self) -> str:
        return f"proxy {self.common_name} (identity {self.identity})"


def identified(identify: Callable[[Context], Awaitable[PresentedProxy]]) -> Identify:
    """The caller of a call, as ``identify`` (:meth:`.MeshAuthorizer.identify`) checks it;
    raises its :class:`~.transport.streams.StreamRefused`."""

    async def caller(context: Context) -> Caller:
        return Caller.of(await identify(context))

    return caller


@dataclass(frozen=True, slots=True)
class Reach:
    """The destinations (``<namespace>/<name>``) one view lets its identity resolve."""

    names: frozenset[str]

    @classmethod
    def of(cls, view: cpb.View) -> Reach:
        names = {f"{o.namespace}/{o.name}" for o in view.outbound}
        names.update(f"{c.namespace}/{c.service}" for c in view.clusters if c.service)
        names.update(e.source for e in view.external if e.source)
        return cls(frozenset(names))

    def __contains__(self, name: object) -> bool:
        return name in self.names


class ViewUnavailable(Exception):
    """The catalog could not be asked for a caller's view."""


class Verdict(enum.Enum):
    ANSWER = "answer"  # the caller may reach the owner, or nothing owns the request
    HIDE = "hide"  # the table is ahead of the view: answer as if nothing owned it
    CONFIRM = "confirm"  # the view moved and does not reach it: bring the table up to date
    REFUSE = "refuse"  # refuse, or end the stream


@dataclass(eq=False)
class _Followed:
    """One identity's view, while streams of it are open."""

    streams: int = 0
    reach: Reach = Reach(frozenset())
    fetched: bool = False
    fetching: asyncio.Lock = field(default_factory=asyncio.Lock)
    watchers: set[Watcher] = field(default_factory=set)


class Sight:
    """One stream's verdicts on what it asked for, in the order the module docstring gives."""

    def __init__(self, caller: Caller, followed: _Followed) -> None:
        self.caller = caller
        self._followed = followed
        self._seen: Reach | None = None  # the reach of the last verdict
        self.opened = False  # a verdict has let the stream start

    @property
    def reach(self) -> Reach:
        return self._followed.reach

    def verdict(self, owner: str, *, fresh: bool = False) -> Verdict:
        """On the request's owner now (``""``: none); ``fresh``: the table was brought up
        to date after a :data:`Verdict.CONFIRM`."""
        reach = self._followed.reach
        first, moved = self._seen is None, reach is not self._seen
        self._seen = reach
        if not owner or owner in reach:
            self.opened = True
            return Verdict.ANSWER
        if first or fresh:
            return Verdict.REFUSE
        return Verdict.CONFIRM if moved else Verdict.HIDE

    async def hidden(
        self, owner: Callable[[], str], asked: str, fresh: Callable[[], Awaitable[None]]
    ) -> bool:
        """Whether to answer as if nothing owned the request (``owner()``: its owner now;
        ``fresh``: bring the table up to date); raises ``StreamRefused`` (PERMISSION_DENIED,
        ``not_reachable``) if the caller may not reach the owner."""
        verdict = self.verdict(owner())
        if verdict is Verdict.CONFIRM:
            try:
                await fresh()
            except (grpc.aio.AioRpcError, OwnerUnavailable) as exc:
                log.warning(
                    "destination.table_not_refreshed peer=%s reason=%r action='the view decides'",
                    self.caller.common_name,
                    str(exc),
                )
            verdict = self.verdict(owner(), fresh=True)
        if verdict is Verdict.REFUSE:
            refused = self.refusal(owner(), asked)
            raise StreamRefused(grpc.StatusCode.PERMISSION_DENIED, refused, "not_reachable")
        return verdict is Verdict.HIDE

    def refusal(self, owner: str, asked: str) -> str:
        """Why the caller is refused ``owner`` (asked for as ``asked``), in words."""
        because = f"{self.caller} may not reach {owner} (asked for {asked}): "
        if not self.opened:
            return because + "no access policy of the mesh lets it"
        return because + "its access policy changed; ask again once the policy lets it"


class CallerViews:
    """The views of the identities that have Destination streams open (module docstring)."""

    def __init__(self, want: WantView, forget: Callable[[str], None]) -> None:
        self._want = want
        self._forget = forget
        self._followed: dict[str, _Followed] = {}

    def __contains__(self, identity: object) -> bool:
        """Whether a stream of ``identity`` is open: its view is to be followed."""
        return identity in self._followed

    def set(self, identity: str, view: cpb.View) -> None:
        """A new view of ``identity`` (from the catalog client's follower)."""
        followed = self._followed.get(identity)
        if followed is None:
            return
        reach = Reach.of(view)
        followed.fetched = True
        if reach.names == followed.reach.names:
            return  # the same destinations: nothing for a stream to decide again
        followed.reach = reach
        for watcher in list(followed.watchers):
            watcher()

    @contextlib.asynccontextmanager
    async def following(self, caller: Caller, watcher: Watcher) -> AsyncIterator[Sight]:
        """The caller's sight for one stream, its view asked for if no stream of its
        identity has it; ``watcher`` is called whenever what the view reaches changes.
        Raises :class:`ViewUnavailable` if the view cannot be had."""
        identity = caller.identity
        followed = self._followed.setdefault(identity, _Followed())
        followed.streams += 1
        try:
            async with followed.fetching:  # the first stream of an identity asks, once
                if not followed.fetched:
                    await self._fetch(caller, followed)
            followed.watchers.add(watcher)
            yield Sight(caller, followed)
        finally:
            followed.watchers.discard(watcher)
            followed.streams -= 1
            if not followed.streams:
                del self._followed[identity]
                self._forget(identity)

    async def _fetch(self, caller: Caller, followed: _Followed) -> None:
        try:
            view = await self._want(caller.identity, caller.service_account)
        except (grpc.aio.AioRpcError, OwnerUnavailable) as exc:
            raise ViewUnavailable(str(exc)) from None
        if not followed.fetched:  # else the follower brought a view while we asked
            followed.reach = Reach.of(view)
            followed.fetched = True


@dataclass(frozen=True, slots=True)
class Access:
    """What the Destination server needs to know of its callers."""

    identify: Identify
    """Who a call comes from (:func:`identified`); raises ``StreamRefused``."""
    views: CallerViews
    fresh: Callable[[], Awaitable[None]]
    """Bring the destination table up to date (:meth:`.ResourceFollower.fresh`)."""

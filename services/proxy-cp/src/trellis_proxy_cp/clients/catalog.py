"""proxy-cp's side of the catalog: the resources its proxies and discovery clients need.

Resources travel the one event path (``docs/architecture.md``, "The path of a change"). The
one :class:`ResourceFollower` watches the catalog's changes on one stream
(``WatchChanges(since=<our cursor>)``): a first answer lists what moved since our cursor,
then one more comes after every flush of the catalog that moved a resource. The slices and
destinations that moved come inline, so an endpoint change reaches us in one message; for
the rest it holds or wants whose version moved (policies, and anything not inline), the
follower asks ``GetResources`` once: the policies of the identities wanted here, the
slices those policies name, and every destination (the Destination API's table,
:class:`~.destinations.DestinationTable`). A policy that names a slice not held yet costs
one more ``GetResources`` for those slices. A listing that is ``full`` (the first one, or a
catalog that restarted: a cursor from another epoch) lists every resource; a held one
missing from it is fetched again (a policy of an identity the catalog no longer knows is
computed on demand: its outbound view), or dropped (a destination). The cursor is stored
only once every fetch succeeded. A stream that ends or fails (the catalog restarted, a
fetch failed) is opened again with backoff from the stored cursor, so nothing is missed;
meanwhile the loop ``catalog resources`` is down and ``/readyz`` says so.

The catalog may run as several replicas (active-active). A resource's version is a digest
of its content, the same from every replica, while a cursor is one replica's own: after
the channel finds another replica, our cursor is foreign there and the listing is full, and
the follower fetches only what differs from what it holds (nothing, if nothing changed).
A replica that has not yet applied a change may hand us an older resource after a switch;
its next flush announces, and we take the newer one (the catalog's module docstring).

A :class:`CatalogClient` also answers the questions a stream asks when it opens: is this
proxy expected (``ListProxies``, shared by many streams: :mod:`.expected`), and what are its
identity's policy and slices (``want``). And it tells the catalog which proxies are
connected here (``RegisterProxy``). The catalog keeps that in memory only, so the follower
registers every connected proxy again whenever the catalog may have lost it: after a full
listing (a new catalog), after the stream was lost, and after a registration that failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from trellis_api import catalog_pb2 as pb
from trellis_api import catalog_pb2_grpc as pb_grpc
from trellis_proxy_cp.cache.inputs import Inputs, slice_names
from trellis_proxy_cp.clients import owners
from trellis_proxy_cp.clients.destinations import DestinationTable
from trellis_proxy_cp.clients.expected import Expectation, ExpectationTiming, ExpectedProxies
from trellis_runtime import lifecycle
from trellis_runtime.follow import follow_forever
from trellis_runtime.health import Health
from trellis_runtime.locate import Locator, OwnerUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Registrations in flight at once when every connected proxy is registered again.
REREGISTER_CONCURRENCY = 32
#: Names asked for in one GetResources (the catalog takes at most 10,000).
BATCH = 2000
POLICY, SLICE, DESTINATION = "policy/", "slice/", "destination/"

Slices = dict[str, pb.ClusterSlice | None]
#: Resources that came with a watch answer, by name.
Inline = dict[str, pb.Resource]


@dataclass
class Fetched:
    """What one round of GetResources brought: policies by identity, slices by name (None:
    gone), destinations, and the names of destinations that are gone."""

    policies: dict[str, pb.View] = field(default_factory=dict)
    slices: Slices = field(default_factory=dict)
    destinations: list[pb.Destination] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)


#: New policies (by identity) and slices (by name; None: gone) to hand on.
OnResources = Callable[[dict[str, pb.View], Slices], Awaitable[None]]


class CatalogClient:
    def __init__(
        self,
        locator: Locator,
        on_resources: OnResources,
        proxy_cp_name: str = "proxy-cp",
        health: Health | None = None,
        expectation: ExpectationTiming | None = None,
        table: DestinationTable | None = None,
    ) -> None:
        self.locator = locator
        self.health = health if health is not None else Health()
        self._on_resources = on_resources
        self._name = proxy_cp_name
        self.wanted: dict[str, str] = {}  # identity -> service account
        self.held: dict[str, str] = {}  # policies held: name -> version
        self.slices: dict[str, pb.ClusterSlice] = {}  # those the wanted policies name
        self._slices_of: dict[str, tuple[str, ...]] = {}  # identity -> its policy's slices
        self.table = table if table is not None else DestinationTable()
        self.cursor = ""  # of the last listing whose changes were all fetched
        self.proxies: dict[str, str] = {}  # connected here: common name -> address
        self.expectations = ExpectedProxies(self._list_expected, expectation)
        self.follower = ResourceFollower(self)

    @property
    def connected(self) -> asyncio.Event:
        """Set while the resources are in sync with the catalog."""
        return self.follower.synced

    async def close(self) -> None:
        """Close the channel (a service's runtime closes its locators itself)."""
        await self.locator.close()

    async def _call(self, rpc: Callable[[pb_grpc.CatalogAsyncStub], Awaitable[T]]) -> T:
        return await owners.call(self.locator, lambda channel: rpc(pb_grpc.CatalogStub(channel)))

    # -- proxies ---------------------------------------------------------------------

    async def expected(
        self, common_name: str, serial: str = "", *, onboarding: bool = False
    ) -> Expectation | None:
        """What the catalog expects of a proxy presenting ``serial``, or None; raises
        :class:`~.expected.ExpectationUnknown` if the catalog cannot be asked.
        ``onboarding``: its certificate was just issued (see :class:`.ExpectedProxies`)."""
        return await self.expectations.account(common_name, serial, onboarding=onboarding)

    async def _list_expected(self) -> dict[str, Expectation | str]:
        listed = await self._call(
            lambda stub: stub.ListProxies(pb.ListProxiesRequest(), timeout=10)
        )
        return {
            p.common_name: Expectation(p.service_account, p.serial)
            for p in listed.proxies
            if p.expected
        }

    async def register(self, common_name: str, address: str) -> None:
        """Tell the catalog ``common_name`` is connected here (again after a failure, see
        the module docstring)."""
        self.proxies[common_name] = address
        try:
            await self._send_registration(common_name, address)
        except Exception:
            self.follower.reregister = True
            raise

    async def _send_registration(self, common_name: str, address: str) -> None:
        request = pb.RegisterProxyRequest(
            common_name=common_name, proxy_cp=self._name, address=address
        )
        await self._call(lambda stub: stub.RegisterProxy(request, timeout=10))

    async def expect(self, common_name: str, service_account: str) -> None:
        """Tell the catalog a proxy was just enrolled (as the injector does at onboarding)."""
        request = pb.ExpectProxyRequest(common_name=common_name, service_account=service_account)
        await self._call(lambda stub: stub.ExpectProxy(request, timeout=10))

    async def unregister(self, common_name: str) -> None:
        self.proxies.pop(common_name, None)
        request = pb.UnregisterProxyRequest(common_name=common_name)
        with contextlib.suppress(grpc.aio.AioRpcError, OwnerUnavailable):
            await self._call(lambda stub: stub.UnregisterProxy(request, timeout=10))

    async def reregister(self) -> None:
        """Register every proxy connected here; raises if the catalog did not take one."""
        limit = asyncio.Semaphore(REREGISTER_CONCURRENCY)

        async def one(common_name: str, address: str) -> None:
            async with limit:
                if self.proxies.get(common_name) == address:  # not gone meanwhile
                    await self._send_registration(common_name, address)

        await asyncio.gather(*(one(cn, address) for cn, address in list(self.proxies.items())))
        if self.proxies:
            log.info("catalog.proxies_registered count=%d", len(self.proxies))

    # -- resources -------------------------------------------------------------------

    async def want(self, identity: str, service_account: str) -> Inputs:
        """Follow ``identity``: its policy and slices, fetched now (and handed on from then
        on as they move); raises what the RPC raises."""
        self.wanted[identity] = service_account
        policy = (await self.fetch([POLICY + identity])).policies.get(identity)
        if policy is None:  # the catalog computes any identity's policy: never missing
            raise LookupError(f"the catalog has no policy for {identity}")
        return Inputs(policy, {n: self.slices[n] for n in slice_names(policy) if n in self.slices})

    def forget(self, identity: str) -> None:
        self.wanted.pop(identity, None)
        self.held.pop(POLICY + identity, None)
        self._slices_of.pop(identity, None)
        self._drop_unnamed()

    def _drop_unnamed(self) -> None:
        """Forget the slices no wanted identity's policy names any more."""
        named = {n for names in self._slices_of.values() for n in names}
        for name in [n for n in self.slices if n not in named]:
            del self.slices[name]

    async def _get(self, names: list[str]) -> pb.GetResourcesResponse:
        """One GetResources per :data:`BATCH` names, their answers together."""
        answer = pb.GetResourcesResponse()
        for start in range(0, len(names), BATCH):
            chunk = names[start : start + BATCH]
            identities = [n.removeprefix(POLICY) for n in chunk if n.startswith(POLICY)]
            accounts = {i: self.wanted[i] for i in identities if self.wanted.get(i)}
            request = pb.GetResourcesRequest(names=chunk, service_accounts=accounts)
            got = await self._get_one(request)
            answer.resources.extend(got.resources)
            answer.missing.extend(got.missing)
        return answer

    async def _get_one(self, request: pb.GetResourcesRequest) -> pb.GetResourcesResponse:
        return await self._call(lambda stub: stub.GetResources(request, timeout=30))

    async def fetch(self, names: list[str], inline: Inline | None = None) -> Fetched:
        """Resources by name: those in ``inline`` (a watch answer's, by name) as they came,
        the others in one GetResources, and one more round for the slices the new policies
        name that are not held yet (again from ``inline`` first). Policies and slices are
        kept (a slice that is missing has no endpoints: None); destinations are the
        caller's to apply."""
        fetched = Fetched()
        slices = fetched.slices
        came = inline or {}
        asked = list(names)
        while True:
            got = pb.GetResourcesResponse(resources=[came[n] for n in asked if n in came])
            if rest := [n for n in asked if n not in came]:
                got.MergeFrom(await self._get(rest))
            for resource in got.resources:
                body = resource.WhichOneof("body")
                if body == "policy":
                    fetched.policies[resource.policy.identity] = resource.policy
                    self.held[resource.name] = resource.version
                elif body == "slice":
                    slices[resource.name] = resource.slice
                elif body == "destination":
                    fetched.destinations.append(resource.destination)
            for name in got.missing:
                if name.startswith(SLICE):
                    slices[name] = None
                elif name.startswith(DESTINATION):
                    fetched.gone.append(name.removeprefix(DESTINATION))
            for identity, policy in fetched.policies.items():
                if identity in self.wanted:
                    self._slices_of[identity] = slice_names(policy)
            named = {n for p in fetched.policies.values() for n in slice_names(p)}
            asked = sorted(named - set(self.slices) - set(slices))  # one more round at most
            if not asked:
                break
        for name, found in slices.items():
            if found is None:
                self.slices.pop(name, None)
            else:
                self.slices[name] = found
        self._drop_unnamed()
        return fetched

    def version(self, name: str) -> str:
        """The version held of a policy or slice ("": none)."""
        if name.startswith(SLICE):
            found = self.slices.get(name)
            return found.version if found is not None else ""
        return self.held.get(name, "")

    async def hand_on(self, policies: dict[str, pb.View], slices: Slices) -> None:
        """Hand new policies and slices on; a failure is rejected, never raised."""
        if policies or slices:
            await self.health.rejections.guarded(
                "catalog resources", "apply", self._on_resources(policies, slices)
            )

    async def list_changes(self) -> pb.ListChangesResponse:
        request = pb.ListChangesRequest(since=self.cursor)
        return await self._call(lambda stub: stub.ListChanges(request, timeout=10))

    async def watch_changes(self) -> AsyncIterator[pb.ListChangesResponse]:
        """The catalog's answers from our cursor on, as they come (see the module docstring);
        raises what the stream raises, once the locator was told."""
        channel = await self.locator.channel()
        call = pb_grpc.CatalogStub(channel).WatchChanges(pb.ListChangesRequest(since=self.cursor))
        try:
            async for listed in call:
                yield listed
        except grpc.aio.AioRpcError as exc:
            self.locator.failed(exc)
            raise
        finally:
            call.cancel()


class ResourceFollower:
    """Watches what moved since our cursor (one stream), fetches what we hold or want."""

    what = "catalog resources"

    def __init__(self, client: CatalogClient) -> None:
        self.client = client
        self.synced = asyncio.Event()  # set while the watch is in sync with the catalog
        self.reregister = False  # the catalog may have lost the proxies connected here
        self._listing = asyncio.Lock()  # one listing at a time: the cursor moves in order
        self._started = 0  # listings asked for so far
        self._applied = 0  # the number of the last one applied

    async def run(self, stop: asyncio.Event) -> None:
        """Watch until ``stop``: each failure ends one stream, logged and shown on the loop
        ``catalog resources``, and the next one starts from our cursor with backoff."""
        loop = self.client.health.loops.register(self.what)

        async def watch() -> None:
            async for listed in self.client.watch_changes():
                await self.apply(listed)
                self.synced.set()
                loop.up()

        async def session() -> None:
            await lifecycle.first(watch(), stop.wait())

        await follow_forever(session, stop, what=self.what, loop=loop, on_lost=self.lost)

    def lost(self) -> None:
        """The watch broke: changes may be missed until it is open again."""
        self.synced.clear()
        self.reregister = True

    async def apply(self, listed: pb.ListChangesResponse) -> None:
        """Apply one watch answer (what moved, the slices and destinations inline)."""
        received = time.perf_counter()
        async with self._listing:
            self._started += 1
            await self._apply(self._started, listed, received, received)

    async def sync(self) -> None:
        """One listing now (``ListChanges``), applied as a watch answer is."""
        async with self._listing:
            await self._list()

    async def fresh(self) -> None:
        """Return once what we hold is from a listing asked for after this call, so it is
        at least as new as anything the catalog answered before the call (a policy, say).
        One listing serves every call made while the one before it was in flight. Raises
        what the call raises if the catalog cannot be asked."""
        asked_after = self._started
        async with self._listing:
            if self._applied > asked_after:
                return
            await self._list()

    async def _list(self) -> None:
        self._started += 1
        number = self._started
        started = time.perf_counter()
        listed = await self.client.list_changes()
        await self._apply(number, listed, started, time.perf_counter())

    async def _apply(
        self, number: int, listed: pb.ListChangesResponse, started: float, listed_at: float
    ) -> None:
        client = self.client
        if _behind(listed.cursor, client.cursor):
            # a watch answer overtaken by a listing fresh() asked for: it has all of it
            self._applied = number
            return
        wanted = {POLICY + i for i in client.wanted} | set(client.slices)
        listing = {item.name: item.version for item in listed.changes}
        moved = [n for n, v in listing.items() if n in wanted and client.version(n) != v]
        if listed.full:
            moved += sorted(n for n in wanted if n not in listing)
        destinations, gone = self._destinations(listing, listed.full)
        inline = {r.name: r for r in listed.resources if listing.get(r.name) == r.version}
        fetched = (
            await client.fetch(moved + destinations, inline) if moved or destinations else Fetched()
        )
        fetched_at = time.perf_counter()
        await client.hand_on(fetched.policies, fetched.slices)
        table_moved = client.table.apply(fetched.destinations, gone + fetched.gone)
        applied_at = time.perf_counter()
        client.cursor = listed.cursor
        self._applied = number
        if listed.full or self.reregister:
            self.reregister = False
            try:
                await client.reregister()
            except BaseException:
                self.reregister = True
                raise
        # each hop's share, for `make trace`
        log.debug(
            "catalog.synced list_ms=%.1f get_ms=%.1f apply_ms=%.1f listed=%d fetched=%d "
            "inline=%d policies=%d slices=%d destinations=%d full=%s cursor=%s",
            (listed_at - started) * 1000,
            (fetched_at - listed_at) * 1000,
            (applied_at - fetched_at) * 1000,
            len(listing),
            len(moved) + len(destinations),
            len(inline),
            len(fetched.policies),
            len(fetched.slices),
            len(table_moved),
            listed.full,
            listed.cursor,
        )

    def _destinations(self, listing: dict[str, str], full: bool) -> tuple[list[str], list[str]]:
        """The destinations to fetch (their version moved), and those gone."""
        table = self.client.table
        named = {n.removeprefix(DESTINATION): v for n, v in listing.items()
                 if n.startswith(DESTINATION)}  # fmt: skip
        fetch = [
            DESTINATION + name
            for name, version in sorted(named.items())
            if version and ((held := table.get(name)) is None or held.version != version)
        ]
        gone = [name for name, version in named.items() if not version]
        if full:
            gone += [name for name in table.by_name if name not in named]
        return fetch, gone


def _behind(cursor: str, held: str) -> bool:
    """Whether ``cursor`` is from before ``held`` (both ``<epoch>-<revision>`` of the same
    catalog epoch); a cursor of another epoch or replica is never behind."""
    epoch, _, revision = cursor.rpartition("-")
    held_epoch, _, held_revision = held.rpartition("-")
    if not epoch or epoch != held_epoch or not (revision.isdigit() and held_revision.isdigit()):
        return False
    return int(revision) < int(held_revision)

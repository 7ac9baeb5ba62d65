"""Which proxies the catalog expects, asked once for many streams.

Every new xDS stream must belong to a proxy the catalog expects (certmanager issued its
certificate). Asking the catalog once per stream makes a reconnect storm of N proxies cost
N listings of N proxies, O(N²); remembering a listing and answering from it makes it O(N).
What a cached answer may be trusted for is what makes this correct:

* **Yes** comes from any listing less than ``max_age`` old. A proxy the catalog stopped
  expecting is refused on its first connect after the listing that no longer names it, at
  most ``max_age`` after the change (a hit on an older listing waits for a new one).
* **No** comes only from a listing that started *after* the question was asked. A proxy
  onboarded a moment ago, or one a restarted catalog has only just learned of again, is
  never refused on the strength of an older listing.
* **Single flight.** At most one ``ListProxies`` is in flight; every question that needs a
  listing waits for the one in flight (if it answers, good; if it started too early to say
  no, the next one), so N concurrent misses cost one or two listings, not N.
* **Rate limit.** Listings start at least ``min_interval`` apart, and a common name that a
  fresh listing did not name is refused without asking again for ``refused_for``: a proxy
  that is not expected (perhaps hostile, with a certificate from the mesh CA it should no
  longer use) cannot make proxy-cp hammer the catalog by reconnecting in a loop.
* **Events.** A proxy certificate that certmanager issues (its ``certificates`` signal,
  which proxy-cp follows anyway) is :meth:`~ExpectedProxies.learned`: the catalog expects
  that proxy too, so it is a yes for ``max_age`` with no listing at all. A proxy that
  connects right after onboarding costs the catalog nothing.
* **Outages.** If the catalog cannot be asked, a proxy the last good listing named is still
  accepted (that listing stays in force, however old) and any other question fails with
  :class:`ExpectationUnknown`, which the authorizer turns into UNAVAILABLE: retry later,
  rather than "not expected".

The clock and the sleep are parameters, so tests run on a fake clock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from trellis_common.follow import describe

log = logging.getLogger(__name__)

#: Common name -> service account of every proxy the catalog expects.
ListProxies = Callable[[], Awaitable[Mapping[str, str]]]

#: At most this many refused common names are remembered; the oldest go first.
MAX_REMEMBERED_REFUSALS = 10_000


class ExpectationUnknown(Exception):
    """The catalog could not be asked, and no listing in force names the proxy."""


@dataclass(frozen=True, slots=True)
class ExpectationTiming:
    """How long answers are trusted and how often the catalog may be asked (seconds)."""

    min_interval: float = 0.25
    """Between the starts of two listings."""
    max_age: float = 10.0
    """A listing older than this no longer says yes without a new listing."""
    refused_for: float = 5.0
    """A common name a listing did not name is refused without asking, for this long."""


class ExpectedProxies:
    """The catalog's expected proxies, listed at most once per question burst (see above)."""

    def __init__(
        self,
        list_proxies: ListProxies,
        timing: ExpectationTiming | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._list = list_proxies
        self.timing = timing if timing is not None else ExpectationTiming()
        self._clock = clock
        self._sleep = sleep
        self._accounts: dict[str, str] = {}
        self._listed_at: float | None = None  # when the listing in force was asked for
        self._listed_number = 0  # and its number (listings are numbered as they start)
        self._last_start: float | None = None
        self._inflight: asyncio.Task[None] | None = None
        self._refused: OrderedDict[str, float] = OrderedDict()
        self._learned: dict[str, tuple[str, float]] = {}  # from events: account, when
        self.listings = 0
        """Listings started (successful or not); the latest one's number."""

    async def account(self, common_name: str) -> str | None:
        """The service account of ``common_name`` if the catalog expects it, else None.

        Raises :class:`ExpectationUnknown` when the catalog could not be asked and no listing
        in force names the proxy.
        """
        learned = self._learned.get(common_name)
        if learned is not None:
            account, at = learned
            if self._clock() - at <= self.timing.max_age:
                return account
            del self._learned[common_name]
        refused_at = self._refused.get(common_name)
        if refused_at is not None and self._clock() - refused_at < self.timing.refused_for:
            return None
        asked = self.listings  # a listing numbered above this started after the question
        while True:
            listed_at = self._listed_at
            if listed_at is not None:
                found = self._accounts.get(common_name)
                if found is not None and self._clock() - listed_at <= self.timing.max_age:
                    return found
                if self._listed_number > asked:
                    return self._answer(common_name, found)
            try:
                await self._listing()
            except ExpectationUnknown:
                found = self._accounts.get(common_name)
                if found is not None:
                    return found  # the last good listing stays in force during an outage
                raise

    def learned(self, common_name: str, account: str) -> None:
        """certmanager issued ``common_name``'s proxy certificate: the catalog expects it."""
        self._learned[common_name] = (account, self._clock())
        self._refused.pop(common_name, None)
        now = self._clock()
        for name in [n for n, (_, at) in self._learned.items() if now - at > self.timing.max_age]:
            del self._learned[name]

    def _answer(self, common_name: str, found: str | None) -> str | None:
        if found is None:
            self._refused[common_name] = self._clock()
            self._refused.move_to_end(common_name)
            while len(self._refused) > MAX_REMEMBERED_REFUSALS:
                self._refused.popitem(last=False)
        else:
            self._refused.pop(common_name, None)
        return found

    async def _listing(self) -> None:
        """Wait for the listing in flight, or start one (no sooner than ``min_interval``
        after the previous start)."""
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._run_listing())
            # Its failure is raised in every waiter; this marks it seen even if none is left.
            self._inflight.add_done_callback(lambda t: t.cancelled() or t.exception())
        task = self._inflight
        # Shielded: a stream that goes away does not cancel the others' listing.
        await asyncio.shield(task)

    async def _run_listing(self) -> None:
        try:
            if self._last_start is not None:
                wait = self._last_start + self.timing.min_interval - self._clock()
                if wait > 0:
                    await self._sleep(wait)
            started = self._last_start = self._clock()
            self.listings += 1
            number = self.listings
            try:
                listed = await self._list()
            except Exception as exc:
                reason = describe(exc)
                log.warning("expected.listing_failed reason=%r listings=%d", reason, self.listings)
                raise ExpectationUnknown(reason) from exc
            self._accounts = dict(listed)
            self._listed_at, self._listed_number = started, number
            self._refused = OrderedDict(
                (name, at) for name, at in self._refused.items() if name not in self._accounts
            )
            log.debug("expected.listed proxies=%d listings=%d", len(listed), self.listings)
        finally:
            self._inflight = None

"""Which proxies the catalog expects, asked once for many streams.

Every new xDS stream must belong to a proxy the catalog expects (certmanager issued its
certificate). Asking the catalog once per stream makes a reconnect storm of N proxies cost
N listings of N proxies, O(N²); remembering a listing and answering from it makes it O(N).
What a cached answer may be trusted for is what makes this correct:

* **Serials.** An answer carries the proxy's current certificate serial when the catalog
  knows it (empty from a catalog that does not). A listing (or event) whose serial is not
  the one presented is a yes only if it started *after* the question: a proxy whose
  certificate was just rotated is not refused on the strength of an older listing; a stale
  serial is then answered as the listing says (the authorizer refuses it), and remembered
  like a refusal for ``refused_for``.
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
* **Onboarding.** A proxy that connects the moment its certificate is issued may beat
  certmanager's event to this process and the catalog both. So a "no" for a certificate
  issued moments ago (the authorizer tells, from its validity) waits up to
  ``onboarding_grace`` for that event. If it has not come (during an onboarding storm the
  events queue behind each other), certmanager is asked what it issued to that common
  name (``ask_issuer``, the same question the event would have led to); its answer is
  learned as the event's would have been. Only then is the catalog asked once more, before
  the "no" is final.
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

from trellis_runtime.follow import describe

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Expectation:
    """What the catalog says of an expected proxy."""

    account: str
    serial: str = ""
    """Its current certificate's serial (lowercase hex); empty when the catalog does not say."""

    def fits(self, serial: str) -> bool:
        """Whether a certificate with ``serial`` is the one expected (or nothing is known)."""
        return not serial or not self.serial or self.serial == serial


#: Common name -> what the catalog says of every proxy it expects (a bare service account
#: from a catalog that gives no serial).
ListProxies = Callable[[], Awaitable[Mapping[str, Expectation | str]]]

#: What certmanager issued to a proxy common name (its current certificate), else None.
AskIssuer = Callable[[str], Awaitable[Expectation | None]]

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
    onboarding_grace: float = 2.0
    """A proxy onboarding right now (its certificate just issued) that a listing does not
    name yet is waited for this long before it is refused: for certmanager's event of its
    certificate, else for one more listing."""


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
        self._accounts: dict[str, Expectation] = {}
        self._listed_at: float | None = None  # when the listing in force was asked for
        self._listed_number = 0  # and its number (listings are numbered as they start)
        self._last_start: float | None = None
        self._inflight: asyncio.Task[None] | None = None
        self._refused: OrderedDict[str, float] = OrderedDict()
        self._learned: dict[str, tuple[Expectation, float]] = {}  # from events, and when
        self._onboarding: dict[str, asyncio.Event] = {}  # waited for: set when learned
        self.ask_issuer: AskIssuer | None = None
        """Asked of an onboarding proxy the grace did not hear of (see the module)."""
        self.listings = 0
        """Listings started (successful or not); the latest one's number."""

    async def account(
        self, common_name: str, serial: str = "", *, onboarding: bool = False
    ) -> Expectation | None:
        """What the catalog expects of ``common_name`` (presenting ``serial``), else None.

        ``onboarding``: the certificate was issued moments ago. The proxy may then connect
        before the catalog (and this process) heard of its certificate, so a listing that
        does not name it is not the last word: it is waited for, ``onboarding_grace`` at
        most (see :meth:`_onboarded`), before the answer is no.

        Raises :class:`ExpectationUnknown` when the catalog could not be asked and no listing
        in force names the proxy.
        """
        learned = self._learned.get(common_name)
        if learned is not None:
            expectation, at = learned
            if self._clock() - at > self.timing.max_age:
                del self._learned[common_name]
            elif expectation.fits(serial):
                return expectation
        for key in (common_name, f"{common_name} {serial}"):
            refused_at = self._refused.get(key)
            if refused_at is not None and self._clock() - refused_at < self.timing.refused_for:
                return self._accounts.get(common_name) if key != common_name else None
        asked = self.listings  # a listing numbered above this started after the question
        while True:
            listed_at = self._listed_at
            if listed_at is not None:
                found = self._accounts.get(common_name)
                fresh = self._clock() - listed_at <= self.timing.max_age
                if found is not None and fresh and found.fits(serial):
                    return found
                if self._listed_number > asked:
                    if found is None and onboarding:
                        onboarding = False  # waited for once
                        heard = await self._onboarded(common_name)
                        if heard is not None and heard.fits(serial):
                            return heard
                        asked = self.listings  # and a listing that starts after the wait
                        continue
                    return self._answer(common_name, serial, found)
            try:
                await self._listing()
            except ExpectationUnknown:
                found = self._accounts.get(common_name)
                if found is not None:
                    return found  # the last good listing stays in force during an outage
                raise

    def learned(self, common_name: str, account: str, serial: str = "") -> None:
        """certmanager issued (or rotated) ``common_name``'s proxy certificate: the catalog
        expects it, with ``serial``."""
        self._learned[common_name] = (Expectation(account, serial), self._clock())
        self._refused.pop(common_name, None)
        waiter = self._onboarding.pop(common_name, None)
        if waiter is not None:
            waiter.set()
        now = self._clock()
        for name in [n for n, (_, at) in self._learned.items() if now - at > self.timing.max_age]:
            del self._learned[name]

    async def _onboarded(self, common_name: str) -> Expectation | None:
        """Wait for certmanager's event of ``common_name``'s certificate (``learned``), at
        most ``onboarding_grace``; what it taught, if it came."""
        learned = self._learned.get(common_name)
        if learned is not None:  # it came while the listing was on its way
            return learned[0]
        waiter = self._onboarding.setdefault(common_name, asyncio.Event())
        heard = asyncio.ensure_future(waiter.wait())
        timer = asyncio.ensure_future(self._sleep(self.timing.onboarding_grace))
        try:
            await asyncio.wait({heard, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            heard.cancel()
            timer.cancel()
            if self._onboarding.get(common_name) is waiter and not waiter.is_set():
                del self._onboarding[common_name]
        learned = self._learned.get(common_name)
        if learned is None and self.ask_issuer is not None:
            await self._ask_issuer(common_name, self.ask_issuer)
            learned = self._learned.get(common_name)
        return learned[0] if learned is not None else None

    async def _ask_issuer(self, common_name: str, ask: AskIssuer) -> None:
        """certmanager's word on ``common_name``, learned as its event would have been; a
        failure to ask leaves the question to the catalog's next listing."""
        try:
            issued = await ask(common_name)
        except Exception as exc:  # noqa: BLE001 (the listing after it still answers)
            log.warning("expected.issuer_unanswered cn=%s reason=%r", common_name, describe(exc))
            return
        log.info("expected.issuer_asked cn=%s issued=%s", common_name, "yes" if issued else "no")
        if issued is not None and common_name not in self._learned:
            self.learned(common_name, issued.account, issued.serial)

    def revoked(self, common_name: str) -> None:
        """certmanager revoked a serial of ``common_name``: what events taught is void."""
        self._learned.pop(common_name, None)

    def _answer(
        self, common_name: str, serial: str, found: Expectation | None
    ) -> Expectation | None:
        if found is None or not found.fits(serial):
            key = common_name if found is None else f"{common_name} {serial}"
            self._refused[key] = self._clock()
            self._refused.move_to_end(key)
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
            self._accounts = {
                name: said if isinstance(said, Expectation) else Expectation(said)
                for name, said in listed.items()
            }
            self._listed_at, self._listed_number = started, number
            self._refused = OrderedDict(
                (key, at)
                for key, at in self._refused.items()
                if key not in self._accounts and not self._current(key)
            )
            log.debug("expected.listed proxies=%d listings=%d", len(listed), self.listings)
        finally:
            self._inflight = None

    def _current(self, key: str) -> bool:
        """``key`` is a stale-serial refusal whose serial the listing now expects."""
        name, _, serial = key.partition(" ")
        found = self._accounts.get(name)
        return bool(serial) and found is not None and found.serial == serial

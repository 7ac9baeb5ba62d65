"""Expected proxies: one listing for many questions, and what a listing may be trusted for.

The rules on a fake clock with a recording listing, then the same cache behind the real
:class:`CatalogClient` against a catalog served over gRPC (:class:`FakeCatalog`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping

import pytest

from trellis_proxy_cp import testing as t
from trellis_proxy_cp.clients.catalog import CatalogClient
from trellis_proxy_cp.clients.expected import (
    Expectation,
    ExpectationTiming,
    ExpectationUnknown,
    ExpectedProxies,
)
from trellis_testing.waiting import eventually

PROXY = t.proxy_common_name("bookstore", "bookstore", 1)
LATER = t.proxy_common_name("bookstore", "bookstore", 2)
STRANGER = t.proxy_common_name("bookstore", "bookstore", 9)
TIMING = ExpectationTiming(min_interval=0.25, max_age=10.0, refused_for=5.0)


class Listings:
    """The catalog's listing as :class:`ExpectedProxies` asks for it, on a fake clock: every
    call is recorded with the time it was made; ``failure`` makes the calls fail."""

    def __init__(self, clock: t.FakeClock, expected: Mapping[str, Expectation | str]) -> None:
        self.clock = clock
        self.expected = dict(expected)
        self.at: list[float] = []
        self.failure: Exception | None = None

    async def __call__(self) -> Mapping[str, Expectation | str]:
        self.at.append(self.clock())
        await asyncio.sleep(0)
        if self.failure is not None:
            raise self.failure
        return dict(self.expected)


@pytest.fixture
def clock() -> t.FakeClock:
    return t.FakeClock()


@pytest.fixture
def listings(clock: t.FakeClock) -> Listings:
    return Listings(clock, {PROXY: "bookstore-sa"})


@pytest.fixture
def proxies(clock: t.FakeClock, listings: Listings) -> ExpectedProxies:
    return ExpectedProxies(listings, TIMING, clock=clock, sleep=clock.sleep)


async def test_concurrent_questions_share_one_listing(
    proxies: ExpectedProxies, listings: Listings
) -> None:
    answers = await asyncio.gather(*(proxies.account(PROXY) for _ in range(500)))

    assert set(answers) == {Expectation("bookstore-sa")}
    assert len(listings.at) == 1
    assert await proxies.account(PROXY) == Expectation("bookstore-sa")  # a hit asks nobody
    assert len(listings.at) == 1


async def test_a_proxy_onboarded_after_the_listing_is_found(
    proxies: ExpectedProxies, listings: Listings, clock: t.FakeClock
) -> None:
    assert await proxies.account(PROXY) == Expectation("bookstore-sa")
    listings.expected[LATER] = "bookstore-sa"

    assert await proxies.account(LATER) == Expectation("bookstore-sa")
    # The second listing waited for the rate limit, then started after the question.
    assert listings.at == [1000.0, 1000.25]
    assert clock.slept == [0.25]


async def test_a_proxy_certmanager_just_issued_is_known_without_a_listing(
    proxies: ExpectedProxies, listings: Listings, clock: t.FakeClock
) -> None:
    assert await proxies.account(PROXY) == Expectation("bookstore-sa")
    assert await proxies.account(LATER) is None  # refused: not yet onboarded
    listings.expected[LATER] = "later-sa"
    proxies.learned(LATER, "later-sa")  # certmanager's ISSUED event, as proxy-cp follows it

    assert await proxies.account(LATER) == Expectation("later-sa")  # no refusal memory, no listing
    assert len(listings.at) == 2
    clock.advance(TIMING.max_age + 1)  # an event is trusted as long as a listing would be
    assert await proxies.account(LATER) == Expectation("later-sa")
    assert len(listings.at) == 3


async def test_no_is_only_said_by_a_listing_started_after_the_question(
    proxies: ExpectedProxies, listings: Listings
) -> None:
    listings.expected.clear()
    first = asyncio.ensure_future(proxies.account(PROXY))
    await eventually(lambda: len(listings.at) == 1)
    # Onboarded while the first listing (which does not name it) is on its way.
    listings.expected[LATER] = "later-sa"
    second = asyncio.ensure_future(proxies.account(LATER))

    assert await first is None
    assert await second == Expectation("later-sa")
    assert len(listings.at) == 2


async def test_an_unknown_proxy_is_refused_without_a_storm_of_listings(
    proxies: ExpectedProxies, listings: Listings, clock: t.FakeClock
) -> None:
    answers = await asyncio.gather(*(proxies.account(STRANGER) for _ in range(200)))
    for _ in range(200):  # reconnecting in a loop
        answers.append(await proxies.account(STRANGER))
        clock.advance(0.01)

    assert set(answers) == {None}
    # One listing for the burst; the loop ran 2 s, within refused_for: no other listing.
    assert len(listings.at) == 1
    clock.advance(TIMING.refused_for)
    assert await proxies.account(STRANGER) is None
    assert len(listings.at) == 2


async def test_unknown_proxies_cannot_list_faster_than_the_rate_limit(
    proxies: ExpectedProxies, listings: Listings, clock: t.FakeClock
) -> None:
    for number in range(20):
        assert await proxies.account(t.proxy_common_name("x", "y", 100 + number)) is None

    starts = listings.at
    assert len(starts) == 20
    assert all(b - a >= TIMING.min_interval for a, b in itertools.pairwise(starts))


async def test_a_proxy_no_longer_expected_is_refused_once_the_listing_is_old(
    proxies: ExpectedProxies, listings: Listings, clock: t.FakeClock
) -> None:
    assert await proxies.account(PROXY) == Expectation("bookstore-sa")
    del listings.expected[PROXY]
    clock.advance(TIMING.max_age / 2)
    assert await proxies.account(PROXY) == Expectation(
        "bookstore-sa"
    )  # the listing is fresh enough

    clock.advance(TIMING.max_age)
    assert await proxies.account(PROXY) is None
    assert len(listings.at) == 2


async def test_a_catalog_that_forgot_a_proxy_does_not_refuse_it_forever(
    proxies: ExpectedProxies, listings: Listings, clock: t.FakeClock
) -> None:
    listings.expected.clear()  # a restarted catalog, not yet refilled from certmanager
    assert await proxies.account(PROXY) is None

    listings.expected[PROXY] = "bookstore-sa"  # refilled
    clock.advance(TIMING.refused_for)
    assert await proxies.account(PROXY) == Expectation("bookstore-sa")


async def test_during_an_outage_the_last_listing_stays_in_force(
    proxies: ExpectedProxies, listings: Listings, clock: t.FakeClock
) -> None:
    assert await proxies.account(PROXY) == Expectation("bookstore-sa")
    listings.failure = ConnectionError("catalog down")
    clock.advance(TIMING.max_age * 3)

    assert await proxies.account(PROXY) == Expectation("bookstore-sa")
    with pytest.raises(ExpectationUnknown, match="ConnectionError: catalog down"):
        await proxies.account(STRANGER)
    # Failed listings are rate-limited too.
    assert listings.at[-1] - listings.at[-2] >= TIMING.min_interval

    listings.failure = None
    assert await proxies.account(STRANGER) is None


async def test_a_question_given_up_does_not_cancel_the_listing_of_the_others(
    proxies: ExpectedProxies, listings: Listings
) -> None:
    called, gate = asyncio.Event(), asyncio.Event()
    inner = listings.__call__

    async def held() -> Mapping[str, Expectation | str]:
        called.set()
        await gate.wait()
        return await inner()

    proxies._list = held
    leaving = asyncio.ensure_future(proxies.account(PROXY))
    staying = asyncio.ensure_future(proxies.account(PROXY))
    await called.wait()
    leaving.cancel()
    gate.set()

    assert await staying == Expectation("bookstore-sa")
    assert leaving.cancelled()


# -- behind the real catalog client, over gRPC ----------------------------------------------


async def test_a_storm_of_streams_costs_one_listproxies() -> None:
    names = [t.proxy_common_name("shop", "cart", n) for n in range(300)]
    async with t.fake_catalog({name: "cart" for name in names}) as catalog:
        client = CatalogClient(t.locator(catalog.address), on_resources=_ignore)
        try:
            catalog.gate = asyncio.Event()
            storm = asyncio.gather(*(client.expected(name) for name in names))
            await eventually(lambda: catalog.calls == 1)
            catalog.gate.set()
            answers = await storm
            again = await asyncio.gather(*(client.expected(name) for name in names))
        finally:
            await client.close()

    assert answers == again == [Expectation("cart")] * 300
    assert catalog.calls == 1


async def test_over_grpc_an_unknown_proxy_is_refused_and_an_outage_is_unknown() -> None:
    timing = ExpectationTiming(min_interval=0, max_age=10, refused_for=60)
    async with t.fake_catalog({PROXY: "bookstore-sa"}) as catalog:
        client = CatalogClient(t.locator(catalog.address), on_resources=_ignore, expectation=timing)
        try:
            strangers = await asyncio.gather(*(client.expected(STRANGER) for _ in range(100)))
            calls = catalog.calls
            catalog.failing = True
            known = await client.expected(PROXY)
            with pytest.raises(ExpectationUnknown, match="UNAVAILABLE: catalog is restarting"):
                await client.expected(LATER)
        finally:
            await client.close()

    assert strangers == [None] * 100
    assert calls == 1
    assert known == Expectation("bookstore-sa")  # the last good listing, during the outage


async def _ignore(policies: object, slices: object) -> None:
    return None


async def test_a_new_serial_is_not_refused_on_the_strength_of_an_older_listing(
    proxies: ExpectedProxies, listings: Listings, clock: t.FakeClock
) -> None:
    listings.expected = {PROXY: Expectation("bookstore-sa", "01")}
    assert await proxies.account(PROXY, "01") == Expectation("bookstore-sa", "01")
    listings.expected = {PROXY: Expectation("bookstore-sa", "02")}  # rotated meanwhile
    clock.advance(1.0)

    assert await proxies.account(PROXY, "02") == Expectation("bookstore-sa", "02")
    assert len(listings.at) == 2  # the older listing could not say yes to the new serial
    # The old serial is now answered with the current one (the authorizer refuses it) and
    # remembered: a proxy reconnecting with it in a loop costs no listing.
    assert await proxies.account(PROXY, "01") == Expectation("bookstore-sa", "02")
    assert await proxies.account(PROXY, "01") == Expectation("bookstore-sa", "02")
    assert len(listings.at) == 3


async def test_a_revocation_voids_what_an_event_taught(
    proxies: ExpectedProxies, listings: Listings
) -> None:
    proxies.learned(LATER, "later-sa", "0a")
    assert await proxies.account(LATER, "0a") == Expectation("later-sa", "0a")
    proxies.revoked(LATER)

    assert await proxies.account(LATER, "0a") is None  # the listing does not name it
    assert len(listings.at) == 1


async def test_an_onboarding_proxy_is_waited_for_until_certmanager_tells(
    listings: Listings, clock: t.FakeClock
) -> None:
    """Its certificate was just issued: a listing that does not name it yet is not the
    last word; certmanager's event of it, a moment later, is."""
    never = asyncio.Event()

    async def sleep(seconds: float) -> None:
        clock.slept.append(seconds)
        if seconds == TIMING.onboarding_grace:
            await never.wait()  # the grace does not run out in this test
        await clock.sleep(seconds)

    proxies = ExpectedProxies(listings, TIMING, clock=clock, sleep=sleep)
    answer = asyncio.ensure_future(proxies.account(LATER, onboarding=True))
    await eventually(lambda: TIMING.onboarding_grace in clock.slept)
    assert not answer.done()
    proxies.learned(LATER, "later-sa")
    assert await answer == Expectation("later-sa")
    assert len(listings.at) == 1


async def test_an_onboarding_proxy_nobody_tells_of_is_refused_after_the_grace(
    proxies: ExpectedProxies, listings: Listings, clock: t.FakeClock
) -> None:
    assert await proxies.account(STRANGER, onboarding=True) is None
    assert TIMING.onboarding_grace in clock.slept
    assert len(listings.at) == 2  # asked once more, after the grace
    assert await proxies.account(STRANGER, onboarding=True) is None  # now remembered
    assert len(listings.at) == 2


class Issuer:
    """certmanager's answer to :attr:`ExpectedProxies.ask_issuer`, recorded; ``failure``
    makes it fail."""

    def __init__(self, issued: Mapping[str, Expectation]) -> None:
        self.issued = dict(issued)
        self.asked: list[str] = []
        self.failure: Exception | None = None

    async def __call__(self, common_name: str) -> Expectation | None:
        self.asked.append(common_name)
        if self.failure is not None:
            raise self.failure
        return self.issued.get(common_name)


async def test_an_onboarding_proxy_whose_event_is_late_is_accepted_on_certmanager_s_word(
    proxies: ExpectedProxies, listings: Listings, clock: t.FakeClock
) -> None:
    """An onboarding storm: the events queue, and the grace runs out before this one's
    came. certmanager, asked directly, issued it that serial: accepted, and remembered as
    its event would be, without another listing."""
    issuer = Issuer({LATER: Expectation("later-sa", "0b")})
    proxies.ask_issuer = issuer

    assert await proxies.account(LATER, "0b", onboarding=True) == Expectation("later-sa", "0b")
    assert TIMING.onboarding_grace in clock.slept
    assert issuer.asked == [LATER]
    assert len(listings.at) == 1
    assert await proxies.account(LATER, "0b") == Expectation("later-sa", "0b")  # learned
    assert issuer.asked == [LATER]
    assert len(listings.at) == 1


@pytest.mark.parametrize(
    "issued",
    [{}, {STRANGER: Expectation("stranger-sa", "0a")}],
    ids=["never-issued", "another-serial"],
)
async def test_an_onboarding_proxy_certmanager_did_not_issue_is_refused(
    proxies: ExpectedProxies,
    listings: Listings,
    clock: t.FakeClock,
    issued: dict[str, Expectation],
) -> None:
    issuer = Issuer(issued)
    proxies.ask_issuer = issuer

    found = await proxies.account(STRANGER, "0b", onboarding=True)

    assert found is None
    assert issuer.asked == [STRANGER]
    assert len(listings.at) == 2  # and the catalog was asked once more, after the grace


async def test_an_issuer_that_cannot_answer_leaves_the_question_to_the_catalog(
    proxies: ExpectedProxies, listings: Listings, caplog: pytest.LogCaptureFixture
) -> None:
    issuer = Issuer({})
    issuer.failure = ConnectionError("certmanager away")

    async def away(common_name: str) -> Expectation | None:
        listings.expected[LATER] = "later-sa"  # the catalog has heard of it meanwhile
        return await issuer(common_name)

    proxies.ask_issuer = away

    assert await proxies.account(LATER, onboarding=True) == Expectation("later-sa")
    assert issuer.asked == [LATER]
    assert len(listings.at) == 2
    assert "expected.issuer_unanswered" in caplog.text
    assert LATER in caplog.text


async def test_a_proxy_that_is_not_onboarding_is_refused_at_once(
    proxies: ExpectedProxies, listings: Listings, clock: t.FakeClock
) -> None:
    assert await proxies.account(STRANGER) is None
    assert TIMING.onboarding_grace not in clock.slept
    assert len(listings.at) == 1

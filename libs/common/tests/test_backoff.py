"""Retrying with backoff: the delays, the stop that cuts a wait short, what is not retried."""

from __future__ import annotations

import asyncio

import pytest

from trellis_common.backoff import Backoff, RetryCallState, failure, retrying, start_over

#: Far longer than any test may run: a test that passes did not wait it out.
HOUR = Backoff(initial=3600.0, maximum=3600.0)


def test_delays_double_from_initial_up_to_the_cap_with_jitter() -> None:
    backoff = Backoff(initial=0.1, maximum=1.0, jitter=0.5)
    for failures, full in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (60, 1.0)]:
        delays = [backoff.delay(failures) for _ in range(200)]
        assert all(full / 2 <= d <= full + 1e-9 for d in delays), (failures, delays)
        assert len(set(delays)) > 1  # jittered


def test_no_jitter_gives_the_exponential_delays() -> None:
    backoff = Backoff(initial=0.5, maximum=10.0, jitter=0.0)
    assert [backoff.delay(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


@pytest.mark.parametrize(
    ("initial", "maximum", "jitter", "error"),
    [(0.0, 1.0, 0.5, "initial"), (2.0, 1.0, 0.5, "initial"), (0.1, 1.0, 1.5, "jitter")],
)
def test_a_bad_policy_is_refused(initial: float, maximum: float, jitter: float, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Backoff(initial, maximum, jitter)


async def test_failures_are_retried_until_one_succeeds_and_each_is_reported() -> None:
    stop = asyncio.Event()
    reported: list[tuple[int, str]] = []
    calls = 0

    def before_sleep(state: RetryCallState) -> None:
        reported.append((state.attempt_number, str(failure(state))))

    async for attempt in retrying(stop, Backoff(0.001, 0.002), before_sleep=before_sleep):
        with attempt:
            calls += 1
            if calls < 3:
                raise OSError(f"down {calls}")

    assert calls == 3
    assert reported == [(1, "down 1"), (2, "down 2")]


async def test_a_stop_during_a_backoff_wait_ends_the_retrying_at_once() -> None:
    stop = asyncio.Event()
    waiting = asyncio.Event()
    calls = 0

    async def retry() -> None:
        nonlocal calls
        async for attempt in retrying(stop, HOUR, before_sleep=lambda state: waiting.set()):
            if stop.is_set():
                break
            with attempt:
                calls += 1
                raise OSError("down")

    task = asyncio.create_task(retry())
    await waiting.wait()  # the first attempt failed: it now waits an hour
    stop.set()
    await task  # returns without the hour (and without raising RetryError)
    assert calls == 1


async def test_a_failure_while_stopping_ends_quietly() -> None:
    stop = asyncio.Event()
    reported: list[RetryCallState] = []
    async for attempt in retrying(stop, HOUR, before_sleep=reported.append):
        with attempt:
            stop.set()
            raise OSError("down as we stop")
    assert reported == []  # not retried, not reported: the service is stopping


async def test_an_error_of_another_type_is_raised_at_once() -> None:
    stop = asyncio.Event()
    calls = 0

    async def retry() -> None:
        nonlocal calls
        async for attempt in retrying(stop, HOUR, on=OSError):
            with attempt:
                calls += 1
                raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        await retry()
    assert calls == 1


async def test_cancellation_is_never_retried() -> None:
    stop = asyncio.Event()
    started = asyncio.Event()

    async def retry() -> None:
        async for attempt in retrying(stop, Backoff(0.001, 0.002)):
            with attempt:
                started.set()
                await asyncio.Event().wait()  # until cancelled

    task = asyncio.create_task(retry())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_start_over_makes_the_next_wait_the_first_delay_again() -> None:
    stop = asyncio.Event()
    backoff = Backoff(initial=0.001, maximum=0.064, jitter=0.0)
    waits: list[float] = []
    calls = 0

    def before_sleep(state: RetryCallState) -> None:
        waits.append(state.upcoming_sleep)

    async for attempt in retrying(stop, backoff, before_sleep=before_sleep):
        with attempt:
            calls += 1
            if calls == 4:
                start_over(attempt)  # say it ran healthy for long
            if calls < 6:
                raise OSError("down")

    assert waits == [0.001, 0.002, 0.004, 0.001, 0.002]

"""``eventually``: a condition that holds soon is seen soon, and a long wait checks less often."""

from __future__ import annotations

import time

import pytest

from trellis_testing.waiting import LONGEST_INTERVAL, eventually


class Later:
    """True from ``after`` seconds on; counts how often it was asked."""

    def __init__(self, after: float) -> None:
        self.at = time.monotonic() + after
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return time.monotonic() >= self.at


async def test_a_long_wait_checks_at_most_ten_times_a_second_after_the_first_tries() -> None:
    condition = Later(1.5)
    assert await eventually(condition, timeout=10)
    # at a fixed 10 ms this was 150 checks; growing to 100 ms, the first 0.2 s take 7
    # checks and the rest at most one per LONGEST_INTERVAL
    assert condition.asked <= 7 + 1.5 / LONGEST_INTERVAL + 2, condition.asked


async def test_a_condition_that_holds_at_once_is_checked_once() -> None:
    condition = Later(0)
    assert await eventually(condition)
    assert condition.asked == 1


async def test_an_interval_the_caller_names_stays_fixed() -> None:
    condition = Later(1.0)
    assert await eventually(condition, timeout=10, interval=0.01)
    # about 100 checks (a loaded machine sleeps longer: fewer); growing, it would be 16
    assert condition.asked > 25, condition.asked


async def test_the_timeout_names_what_was_awaited() -> None:
    with pytest.raises(AssertionError, match=r"condition not met within 0\.3s: the moon"):
        await eventually(lambda: False, timeout=0.3, message="the moon")

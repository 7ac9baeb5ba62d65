"""Retrying with backoff: one policy, and tenacity set up the way every loop here needs it.

Every loop that talks to something that can go away (Redis, a peer over gRPC, a child
process) retries the same way: with exponential backoff, capped, and jittered so that many
clients that lost a server together do not all come back together. tenacity does the
retrying; this module only sets it up once:

* :class:`Backoff` is the policy (first delay, cap, jitter), as a tenacity wait.
* :func:`retrying` is tenacity's ``AsyncRetrying`` with that wait, and with a sleep that
  ends at once when the service's ``stop`` is set, so shutdown is never held up by a
  backoff. Stop ends the retrying quietly (no ``RetryError``): a failure while ``stop`` is
  set ends it, and so does the check at the top of each attempt after a cut-short wait::

      async for attempt in retrying(stop, backoff, before_sleep=report):
          if stop.is_set():
              break
          with attempt:
              await do_it()

  The caller logs a failure (and marks its loop down) in ``before_sleep``, which sees the
  error (``state.outcome``), the failures in a row (``state.attempt_number``) and the
  coming wait (``state.upcoming_sleep``).
* tenacity counts failures from the first attempt. A loop whose attempts can run healthy
  for a long time (a subscription, a supervised process) calls :func:`start_over` when one
  did, so the next failure waits the first delay again, not the cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import Awaitable, Callable

from tenacity import AsyncRetrying, AttemptManager, RetryCallState
from tenacity.retry import retry_if_exception_type
from tenacity.wait import wait_base, wait_exponential, wait_random_exponential

__all__ = [
    "DEFAULT_BACKOFF",
    "Backoff",
    "BeforeSleep",
    "RetryCallState",
    "failure",
    "retrying",
    "start_over",
    "wait_or_stop",
]

BeforeSleep = Callable[[RetryCallState], Awaitable[None] | None]


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Exponential backoff: ``initial`` doubling on each failure in a row, up to ``maximum``.

    ``jitter`` is the fraction of each delay that is random (0.5: between half and all of
    it): a fixed part keeps a server that is down from being hammered, the random part
    spreads the clients out.
    """

    initial: float = 0.05
    maximum: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError(f"need 0 < initial <= maximum, got {self.initial}, {self.maximum}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be in [0, 1], got {self.jitter}")

    def wait(self) -> wait_base:
        """The tenacity wait: a fixed share of the exponential delay plus a random share."""
        fixed, random = 1.0 - self.jitter, self.jitter
        return wait_exponential(
            multiplier=self.initial * fixed, max=self.maximum * fixed
        ) + wait_random_exponential(multiplier=self.initial * random, max=self.maximum * random)

    def delay(self, failures: int) -> float:
        """The wait after ``failures`` failures in a row (1: the first), for a retry that is
        scheduled rather than slept (the subscriber's per-topic resyncs)."""
        state = RetryCallState(AsyncRetrying(), None, (), {})
        state.attempt_number = max(1, failures)
        return self.wait()(state)


#: Redis clients: from 25-50 ms up to 1-2 s.
DEFAULT_BACKOFF = Backoff()


async def wait_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less when ``stop`` is set."""
    # Not asyncio.wait_for: before Python 3.12 it can swallow a cancellation that arrives
    # as ``stop`` is set, and the cancelled task would go on to its next attempt.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()


def retrying(
    stop: asyncio.Event,
    backoff: Backoff = DEFAULT_BACKOFF,
    *,
    on: type[Exception] | tuple[type[Exception], ...] = Exception,
    before_sleep: BeforeSleep | None = None,
) -> AsyncRetrying:
    """tenacity's retrying with ``backoff``, for as long as ``stop`` is not set.

    Failures of the types ``on`` are retried (by default any ``Exception``); any other is
    raised at once, and so is cancellation.
    """
    return AsyncRetrying(
        wait=backoff.wait(),
        retry=retry_if_exception_type(on),
        stop=lambda state: stop.is_set(),
        sleep=functools.partial(wait_or_stop, stop),
        before_sleep=before_sleep,
        retry_error_callback=lambda state: None,  # stopped: end the iteration quietly
    )


def start_over(attempt: AttemptManager) -> None:
    """Count failures from none again: ``attempt`` ran healthy for long enough that its
    failure starts a new streak (whose wait is the first delay, not the cap)."""
    attempt.retry_state.attempt_number = 1


def failure(state: RetryCallState) -> BaseException:
    """The error that ended the attempt ``state`` is about (in ``before_sleep``)."""
    error = None if state.outcome is None else state.outcome.exception()
    if error is None:
        raise ValueError("the attempt did not fail")
    return error

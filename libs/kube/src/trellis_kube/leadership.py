"""Leader election: of a component's replicas, one at a time does the single-writer work.

certmanager's rotation and pruning and endpoints-vm's TTL judgement each need one writer;
every replica runs, and :class:`Leadership` says which of them leads. It follows
client-go's ``leaderelection`` (the same three timings, the same rules), over a
:class:`Lock` of two kinds:

* a Kubernetes ``Lease`` (:mod:`trellis_kube.leases`), in a cluster;
* a Redis lock with a fencing counter (:mod:`trellis_kube.redislocks`), for a local run.

The rules, which every lock keeps:

* **Acquire** when the lock is free, expired, or ours; otherwise observe who holds it. A
  standby tries every ``retry_period`` (jittered), with backoff while it cannot reach the
  server.
* **Renew** every ``retry_period`` while leading. Each attempt starts a term of
  ``renew_deadline`` from the moment it was *sent*: a leader that has not renewed within
  ``renew_deadline`` of its last successful attempt steps down (``leading`` is False from
  that instant, and the callbacks are told). As ``renew_deadline < lease_duration`` and the
  lock can only have expired ``lease_duration`` after that attempt reached the server, a
  replica partitioned from its server has stepped down before anyone can take over: there is
  never a moment when two replicas both believe they lead.
* **The fencing token** (:attr:`Leadership.token`) grows with every acquisition, by anyone;
  a write made on the leader's behalf carries it, and a store that has seen a larger one
  refuses it (a deposed leader that wakes up late cannot overwrite its successor).
* **Release** on a clean stop, so a standby takes over at its next attempt rather than after
  the lease expires; a replica that is killed (its task cancelled) releases nothing.

The election loop is a :class:`~trellis_runtime.health.Loop` (down while the server cannot be
reached) and its role is a :class:`~trellis_runtime.health.Role` of the service's
:class:`~trellis_runtime.health.Health` (``/readyz`` names it; a standby is ready).
:func:`elect` makes one on the lock asked for, :func:`elect_for` from a service's settings
(``TRELLIS_LEADER_ELECTION``, ``TRELLIS_LEASE_DURATION``, ``TRELLIS_LEASE_RENEW_DEADLINE``,
``TRELLIS_LEASE_RETRY_PERIOD``, ``TRELLIS_LEASE_NAMESPACE``, ``TRELLIS_INSTANCE``). A service
runs the election beside its other parts and its single-writer work under it::

    election = leadership.elect_for(settings, redis=runtime.redis, health=runtime.health)
    components = {"election": election.run, "rotation": functools.partial(election.lead,
                  work=rotate)}  # rotate(over): runs while leading, returns once over is set

and passes :attr:`Leadership.token` with each write that only the leader may make.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from trellis_common.backoff import Backoff, wait_or_stop
from trellis_runtime import lifecycle
from trellis_runtime.health import Health, Loop

if TYPE_CHECKING:
    from trellis_runtime.settings import ServiceSettings

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Timing:
    """client-go's three timings, in seconds; see the module docstring for their rules."""

    duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.duration:
            raise ValueError(
                "need 0 < lease_retry_period < lease_renew_deadline < lease_duration, got "
                f"{self.retry_period}, {self.renew_deadline}, {self.duration}"
            )


@dataclasses.dataclass(frozen=True)
class Observation:
    """What one attempt on the lock saw: whether this replica holds it now, who does
    ("" when nobody), and the holder's fencing token (0 when unknown)."""

    acquired: bool
    holder: str
    token: int


class Lock(Protocol):
    """The shared record an election is decided on (a Lease, a Redis key)."""

    #: What and where it is, for logs (``Lease trellis-system/trellis-certmanager``).
    description: str

    async def attempt(self, leading: bool, now: float) -> Observation:
        """Acquire or renew (``leading``: this replica's term goes on), at wall time ``now``."""
        ...

    async def release(self) -> None:
        """Let the lock go if this replica still holds it."""
        ...


Callback = Callable[[bool], None]


class Leadership:
    """One elected role, e.g. ``certmanager`` (its Lease or lock is ``trellis-<name>``)."""

    def __init__(
        self,
        name: str,
        identity: str,
        lock: Lock,
        timing: Timing = Timing(),
        health: Health | None = None,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.identity = identity
        self.lock = lock
        self.timing = timing
        self._health = health
        self._clock = clock
        self._monotonic = monotonic
        self._is_leader = False
        self._deadline = 0.0
        self._holder: str | None = None
        self._token = 0
        self._since = clock()
        self._callbacks: list[Callback] = []
        self._became_leader = asyncio.Event()
        self._term_over = asyncio.Event()
        self._term_over.set()
        self._abandoned: set[asyncio.Future[Any]] = set()
        self._backoff = Backoff(initial=timing.retry_period, maximum=timing.duration)
        if health is not None:
            health.roles.add(self)

    @property
    def leading(self) -> bool:
        """True only while this replica holds the lock and renewed it within the deadline."""
        return self._is_leader and self._monotonic() < self._deadline

    @property
    def holder(self) -> str | None:
        """Who holds the lock, as last observed ("" when nobody, None before any look)."""
        return self._holder

    @property
    def token(self) -> int:
        """The fencing token of the current holder, as last observed (this replica's own
        while it leads); it grows with every acquisition."""
        return self._token

    @property
    def since(self) -> float:
        """When (unix time) this replica's role last changed, or the election began."""
        return self._since

    def subscribe(self, callback: Callback) -> None:
        """Call ``callback(leading)`` on every change of :attr:`leading`."""
        self._callbacks.append(callback)

    async def wait_leading(self, stop: asyncio.Event) -> bool:
        """True once this replica leads; False if ``stop`` is set first."""
        while not self.leading:
            if stop.is_set():
                return False
            await lifecycle.first(self._became_leader.wait(), stop.wait())
            if self._is_leader and not self.leading:  # past its deadline: the loop is
                await asyncio.sleep(self.timing.retry_period / 10)  # about to step down
        return True

    async def lead(
        self, stop: asyncio.Event, work: Callable[[asyncio.Event], Awaitable[None]]
    ) -> None:
        """Run ``work(over)`` each time this replica leads, until ``stop``: ``over`` is set
        when the term ends (leadership lost, or ``stop``), and ``work`` must then return."""
        while not stop.is_set() and await self.wait_leading(stop):
            over = self._term_over
            relay = asyncio.create_task(_set_when(stop, over))
            try:
                await work(over)
                await over.wait()
            finally:
                relay.cancel()

    async def run(self, stop: asyncio.Event) -> None:
        """Take part in the election until ``stop`` (then release the lock if held)."""
        loop = self._health.loops.register(f"leader:{self.name}") if self._health else None
        failures = 0
        try:
            while not stop.is_set():
                self._check_deadline()
                failures = await self._attempt(loop, failures)
                await wait_or_stop(stop, self._pause(failures))
        except asyncio.CancelledError:
            self._step_down("cancelled")  # killed: the lock expires on its own
            raise
        finally:
            if loop is not None:
                loop.close()
        await self._release()

    async def _attempt(self, loop: Loop | None, failures: int) -> int:
        """One try at acquiring or renewing; the failures in a row after it."""
        started, leading = self._monotonic(), self.leading
        budget = self._deadline - started if leading else self.timing.renew_deadline
        try:
            seen = await self._bounded(self.lock.attempt(leading, self._clock()), budget)
        except Exception as exc:  # noqa: BLE001  # retried; TimeoutError: a hung server
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            log.warning(
                "leader.attempt_failed name=%s lock=%r failures=%d reason=%r",
                self.name,
                self.lock.description,
                failures + 1,
                reason,
            )
            if loop is not None:
                loop.down(reason)
            self._check_deadline()
            return failures + 1
        if loop is not None:
            loop.up()
        self._holder, self._token = seen.holder, seen.token or self._token
        if seen.acquired:
            self._deadline = started + self.timing.renew_deadline
            if not self._is_leader:
                self._set_leading(True, f"acquired with token {seen.token}")
        elif self._is_leader:
            self._set_leading(False, f"lost to {seen.holder or 'nobody'}")
        return 0

    async def _bounded(self, call: Awaitable[T], seconds: float) -> T:
        """``call``'s result, or TimeoutError after ``seconds``. A call that overruns is
        cancelled and left to end on its own, not awaited: a lock whose clean-up waits on a
        dead connection (redis-py's UNWATCH) cannot hold up a step-down."""
        task = asyncio.ensure_future(call)
        try:
            await asyncio.wait({task}, timeout=max(seconds, 0.0))
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not task.done():
            task.cancel()
            self._abandoned.add(task)
            task.add_done_callback(self._forget)
            raise TimeoutError(f"no answer within {max(seconds, 0.0):.3g} s")
        return task.result()

    def _forget(self, task: asyncio.Future[Any]) -> None:
        self._abandoned.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("leader.abandoned_attempt name=%s error=%r", self.name, task.exception())

    def _pause(self, failures: int) -> float:
        """How long until the next attempt: a leader renews every retry period (and wakes
        at its deadline); a standby retries with jitter, backing off while failing."""
        if self._is_leader:
            return max(0.0, min(self.timing.retry_period, self._deadline - self._monotonic()))
        if failures:
            return self._backoff.delay(failures)
        return self.timing.retry_period * random.uniform(1.0, 1.2)

    def _check_deadline(self) -> None:
        if self._is_leader and self._monotonic() >= self._deadline:
            self._step_down("not renewed within the renew deadline")

    def _step_down(self, reason: str) -> None:
        if self._is_leader:
            self._set_leading(False, reason)

    def _set_leading(self, leading: bool, reason: str) -> None:
        self._is_leader = leading
        self._since = self._clock()
        if leading:
            self._term_over = asyncio.Event()
            self._became_leader.set()
            self._holder = self.identity
        else:
            self._deadline = 0.0
            self._became_leader.clear()
            self._term_over.set()
        log.info(
            "leader.%s name=%s identity=%s token=%d lock=%r reason=%r",
            "elected" if leading else "stepped_down",
            self.name,
            self.identity,
            self._token,
            self.lock.description,
            reason,
        )
        if self._health is not None:
            self._health.roles.changed(self)
        for callback in list(self._callbacks):
            try:
                callback(leading)
            except Exception:  # one callback never stops the election or the others
                log.exception("leader.callback_failed name=%s", self.name)

    async def _release(self) -> None:
        """A clean stop: step down, then let the lock go (bounded by the renew deadline)."""
        held = self._is_leader or self._holder == self.identity
        self._step_down("stopped")
        if not held:
            return
        try:
            await self._bounded(self.lock.release(), self.timing.renew_deadline)
        except Exception as exc:  # noqa: BLE001  # it expires on its own
            log.warning("leader.release_failed name=%s reason=%r", self.name, str(exc))
        else:
            log.info("leader.released name=%s lock=%r", self.name, self.lock.description)
            self._holder = ""


async def _set_when(stop: asyncio.Event, over: asyncio.Event) -> None:
    await stop.wait()
    over.set()


def elect(
    name: str,
    identity: str,
    *,
    redis: Any = None,
    kube_api: Any = None,
    namespace: str = "",
    timing: Timing = Timing(),
    health: Health | None = None,
) -> Leadership:
    """The election ``name`` as ``identity`` takes part in it: on a Kubernetes Lease when
    ``kube_api`` (an ``ApiClient``) is given, else on a Redis lock (``redis``, a
    ``redis.asyncio.Redis``). ``namespace`` is the Lease's (empty: the pod's own, else
    ``trellis-system``). Run it with :meth:`Leadership.run`."""
    from trellis_kube import leases, redislocks  # they build on this module

    lock: Lock
    if kube_api is not None:
        lock = leases.LeaseLock(
            kube_api,
            leases.namespace(namespace),
            name,
            identity,
            timing.duration,
            request_timeout=timing.renew_deadline,
        )
    elif redis is not None:
        lock = redislocks.RedisLock(redis, name, identity, timing.duration)
    else:
        raise ValueError(f"leader election {name!r}: give a Kubernetes API client or Redis")
    return Leadership(name, identity, lock, timing, health)


def elect_for(
    settings: ServiceSettings,
    *,
    redis: Any,
    health: Health | None = None,
    name: str = "",
    kube_api: Any = None,
) -> Leadership:
    """A service's election from its settings: ``name`` (default: the service's), this
    replica's instance name, the lease timings, and the lock ``leader_election`` asks for
    (``auto``: a Lease when the service has a ``kubeconfig`` setting that is set, or runs
    in a pod; else Redis). A Lease needs an API client: ``kube_api``, else one made from
    the service's kubeconfig (or the pod's configuration)."""
    from trellis_kube import client as kube_client

    kubeconfig = getattr(settings, "kubeconfig", None)
    mode = settings.leader_election
    if mode == "auto":
        mode = (
            "kubernetes"
            if kube_api is not None or kubeconfig or kube_client.in_cluster()
            else "redis"
        )
    if mode == "kubernetes" and kube_api is None:
        kube_api = kube_client.api_client(kubeconfig)
    return elect(
        name or settings.service_name,
        settings.instance_name,
        redis=redis if mode == "redis" else None,
        kube_api=kube_api if mode == "kubernetes" else None,
        namespace=settings.lease_namespace,
        timing=Timing(
            settings.lease_duration, settings.lease_renew_deadline, settings.lease_retry_period
        ),
        health=health,
    )

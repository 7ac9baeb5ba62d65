"""A leader election's lock as a Kubernetes ``Lease`` (``coordination.k8s.io/v1``).

The record is client-go's (``resourcelock.LeaseLock``): ``holderIdentity``,
``leaseDurationSeconds``, ``acquireTime``, ``renewTime`` (MicroTime, the writer's clock) and
``leaseTransitions``, in the Lease ``trellis-<name>`` of the control plane's namespace. One
attempt (:meth:`LeaseLock.attempt`) reads it, then:

* absent: creates it (a 409 ``AlreadyExists`` means another replica was first);
* held by another and not expired: observes it;
* free (``holderIdentity`` empty, as a release leaves it), expired, or ours: replaces it with
  this replica as holder, under the resourceVersion it read (optimistic concurrency: a 409
  ``Conflict`` means another replica wrote first, and this one did not acquire).

**Expiry** is judged as client-go judges it: ``leaseDurationSeconds`` after this replica
*observed* the record last change (on its own monotonic clock), not after ``renewTime``,
which another machine's clock wrote; skewed clocks then cannot make two leaders. A replica
that starts beside a stale Lease therefore waits one duration before taking it over.

**The fencing token** is ``leaseTransitions + 1``: a new holder, a holder that comes back
after a release or a restart, each adds one to ``leaseTransitions``; a renewal keeps it.

**Release** (client-go's ``ReleaseOnCancel``) writes an empty ``holderIdentity`` with a
duration of one second, keeping ``leaseTransitions``.

The official client is synchronous: its calls run on this lock's own threads, with a request
timeout, and their results are taken in on the event loop, so an attempt abandoned at its
deadline (a partitioned API server) changes nothing here when its answer comes late.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import json
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from trellis_kube.client import in_cluster
from trellis_kube.leadership import Observation

if TYPE_CHECKING:
    from kubernetes import client

#: The control plane's namespace when neither a setting nor the pod says otherwise.
DEFAULT_NAMESPACE = "trellis-system"
#: Where a pod finds its own namespace.
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
CONFLICT = 409
NOT_FOUND = 404
T = TypeVar("T")
Lease = dict[str, Any]


def lease_name(name: str) -> str:
    return f"trellis-{name}"


def namespace(configured: str = "", pod_file: Path = POD_NAMESPACE_FILE) -> str:
    """The Leases' namespace: ``configured``, else the pod's own, else the default."""
    if configured:
        return configured
    if in_cluster() and pod_file.is_file():
        return pod_file.read_text().strip() or DEFAULT_NAMESPACE
    return DEFAULT_NAMESPACE


def micro_time(moment: float) -> str:
    """Unix time as ``metav1.MicroTime`` writes it: ``2006-01-02T15:04:05.000000Z``.

    The official client parses a Lease's times and writes them again with
    ``datetime.isoformat()``, which leaves out the fraction of a whole second; the API
    server's MicroTime needs all six digits, so a whole second is written a microsecond on.
    """
    when = datetime.datetime.fromtimestamp(moment, datetime.UTC)
    if when.microsecond == 0:
        when += datetime.timedelta(microseconds=1)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: str) -> float:
    """A MicroTime (or any RFC 3339 time) as unix time."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class LeaseLock:
    """The Lease of one election, as ``identity`` takes part in it."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        duration: float,
        *,
        request_timeout: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        from kubernetes import client  # a third of a second: only when a Lease is used

        self._api = client.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.name = lease_name(name)
        self.identity = identity
        self.description = f"Lease {namespace}/{self.name}"
        #: whole seconds, rounded up: a standby then waits at least as long as intended
        self._duration = max(1, math.ceil(duration))
        self._timeout = request_timeout
        self._monotonic = monotonic
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"lease-{name}")
        self._observed: tuple[str, float] = ("", 0.0)  # resourceVersion, when first seen

    async def attempt(self, leading: bool, now: float) -> Observation:
        lease = await self._call(self._read)
        if lease is None:
            try:
                created = await self._call(self._create, self._body(now, 0, now))
            except _Status as exc:
                if exc.status != CONFLICT:
                    raise
                return Observation(False, "", 0)  # created by another replica just now
            self._observe(created)
            return Observation(True, self.identity, 1)
        self._observe(lease)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder and holder != self.identity and not self._expired(spec):
            return Observation(False, holder, transitions + 1)
        renewal = leading and holder == self.identity
        if not renewal:
            transitions += 1  # a new term: the fencing token grows
        acquired = spec.get("acquireTime") if renewal else None
        body = self._body(now, transitions, acquired or now, lease)
        try:
            written = await self._call(self._replace, body)
        except _Status as exc:
            if exc.status != CONFLICT:
                raise
            return Observation(False, holder, int(spec.get("leaseTransitions") or 0) + 1)
        self._observe(written)
        return Observation(True, self.identity, transitions + 1)

    async def release(self) -> None:
        lease = await self._call(self._read)
        spec = (lease or {}).get("spec") or {}
        if lease is None or spec.get("holderIdentity") != self.identity:
            return
        now = time.time()
        body = self._body(now, int(spec.get("leaseTransitions") or 0), now, lease)
        body["spec"].update(holderIdentity="", leaseDurationSeconds=1)
        try:
            await self._call(self._replace, body)
        except _Status as exc:
            if exc.status != CONFLICT:  # a conflict: someone else has it already
                raise

    def _expired(self, spec: dict[str, Any]) -> bool:
        duration = float(spec.get("leaseDurationSeconds") or self._duration)
        return self._monotonic() > self._observed[1] + duration

    def _observe(self, lease: Lease) -> None:
        version = str((lease.get("metadata") or {}).get("resourceVersion") or "")
        if version != self._observed[0]:
            self._observed = (version, self._monotonic())

    def _body(
        self, now: float, transitions: int, acquired: str | float, current: Lease | None = None
    ) -> Lease:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if current is not None:
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self._duration,
                "acquireTime": acquired if isinstance(acquired, str) else micro_time(acquired),
                "renewTime": micro_time(now),
                "leaseTransitions": transitions,
            },
        }

    # -- the client's calls, on this lock's threads ----------------------------------------

    async def _call(self, call: Any, *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(call, *args))

    def _read(self) -> Lease | None:
        try:
            answer = self._api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=self._timeout
            )
        except Exception as exc:
            if getattr(exc, "status", None) == NOT_FOUND:
                return None
            raise _Status.of(exc) from exc
        return _json(answer)

    def _create(self, body: Lease) -> Lease:
        try:
            answer = self._api.create_namespaced_lease(
                self.namespace,
                body,  # type: ignore[arg-type]  # the client sends a dict as it is
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        except Exception as exc:
            raise _Status.of(exc) from exc
        return _json(answer)

    def _replace(self, body: Lease) -> Lease:
        try:
            answer = self._api.replace_namespaced_lease(
                self.name,
                self.namespace,
                body,  # type: ignore[arg-type]  # the client sends a dict as it is
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        except Exception as exc:
            raise _Status.of(exc) from exc
        return _json(answer)


class _Status(Exception):
    """A failed call to the API server: its HTTP status (0 when none came back)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @classmethod
    def of(cls, exc: Exception) -> _Status:
        status = int(getattr(exc, "status", 0) or 0)
        reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
        return cls(status, f"{status} {reason}" if status else f"{type(exc).__name__}: {reason}")


def _json(answer: Any) -> Lease:
    return dict(json.loads(answer.data))

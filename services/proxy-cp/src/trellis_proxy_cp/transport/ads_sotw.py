"""ADS, state of the world: ``StreamAggregatedResources``.

Per type URL the stream keeps a subscription and the nonce of its latest response; every
response carries the snapshot's per-type version and a fresh nonce. How a request is read
(Envoy's xDS protocol doc and the observations in ``envoy-xds-facts.md``):

* A non-empty ``response_nonce`` other than the latest one sent for that type is **stale**:
  a newer response is on its way and will be ACKed with the then-current names. It is
  ignored entirely, subscription included. (A nonce on a type this stream never answered
  comes from an earlier stream and is treated as empty.)
* An empty nonce is a first request or a reconnect (``version_info`` = the proxy's last
  accepted version): always answered, even at the current version, since Envoy waits for a
  response to warm.
* The latest nonce, not yet answered, with ``error_detail``: a **NACK**. It is recorded and
  reported (``on_nack`` gets the rejected version) and the rejected version is not sent
  again: the next response for that type waits for a new version or a new subscription.
* The latest nonce, not yet answered, without error: an **ACK** (``on_ack``).
* After an ACK or NACK the proxy gets an answer only if its names differ (as sets) from the
  ones the latest response was built for.
* The latest nonce once more, after it was already ACKed: Envoy asks again. After a cluster
  update it re-sends its EDS request with the ACKed nonce and the same names, and the updated
  cluster keeps warming until it gets a response (facts, item 6). Such a request is answered.

Wildcard (only LDS and CDS): an empty name list means "everything" until the proxy names
something; ``*`` subscribes to everything explicitly. EDS, RDS and SDS are always by name.

On a snapshot change every type the proxy subscribes to whose per-type version differs from
the version last sent is pushed, in :data:`~trellis_proxy_cp.types.ORDER` (CDS before EDS,
LDS before RDS); a type the proxy never requested is never sent. One response is in flight
per type, as go-control-plane's watches and Istio's flow control keep it: a type whose
latest response the proxy has not answered yet waits, and its ACK or NACK sends the newest
version then (a NACKed version is still never sent again), so a proxy under churn gets no
more pushes than it takes in, and none of the versions it would only skip. Before the key
has a snapshot requests are held and answered when it arrives.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from trellis_proxy_cp import types
from trellis_proxy_cp.cache.snapshot import Snapshot, push_order, with_nonce
from trellis_proxy_cp.cache.store import SnapshotSource
from trellis_proxy_cp.transport.streamhooks import StreamHooks
from trellis_proxy_cp.transport.streams import (
    Outgoing,
    ProxyStream,
    Send,
    StreamRunner,
    TypeState,
    short,
)
from trellis_proxy_cp.types import CLUSTER, LISTENER, TypeUrl

log = logging.getLogger(__name__)

WILDCARD_TYPES = frozenset({LISTENER, CLUSTER})
#: Distinct sets of names kept for sharing; past it, they are all forgotten at once.
SHARED_NAME_SETS = 4096


class NameSets:
    """One object per distinct set of subscribed names, with its names sorted: the proxies
    of a group ask for the same names, so thousands of streams share a few sets (their
    strings included) instead of each keeping its own, and a response's sorted names are
    sorted once."""

    def __init__(self, kept: int = SHARED_NAME_SETS) -> None:
        self._kept = kept
        self._sets: dict[frozenset[str], tuple[frozenset[str], tuple[str, ...]]] = {}

    def __call__(self, names: frozenset[str]) -> frozenset[str]:
        return self._entry(names)[0]

    def sorted(self, names: frozenset[str]) -> tuple[str, ...]:
        return self._entry(names)[1]

    def _entry(self, names: frozenset[str]) -> tuple[frozenset[str], tuple[str, ...]]:
        found = self._sets.get(names)
        if found is None:
            if len(self._sets) >= self._kept:
                self._sets.clear()  # a proxy cycling through names cannot grow it for good
            found = self._sets[names] = (names, tuple(sorted(names)))
        return found


#: shared by every SotW stream of the process (one event loop: no lock)
SHARED = NameSets()
WILDCARD = "*"

Subscription = tuple[bool, frozenset[str]]


@dataclasses.dataclass(slots=True)
class _Progress:
    """SotW-only bookkeeping of one type, next to the shared :class:`TypeState`."""

    answered: bool = False
    """Whether the latest nonce was already ACKed or NACKed."""
    sent_for: Subscription | None = None
    """The subscription the latest response was built for."""
    pending: bool = False
    """A request waits for the key's first snapshot."""
    named: bool = False
    """The proxy named resources once: an empty list no longer means wildcard."""


def _behind(type_url: TypeUrl, state: TypeState, snapshot: Snapshot) -> bool:
    """Whether a type the proxy subscribes to was last sent at another version than the
    snapshot's."""
    return (
        bool(state.wildcard or state.names)
        and state.sent_version is not None
        and state.sent_version != snapshot.version_of(type_url)
    )


class SotwMachine:
    """The state of the world protocol for one stream (see the module docstring)."""

    __slots__ = ("_hooks", "_nonces", "_progress", "_send", "_source", "_stream")

    def __init__(
        self, stream: ProxyStream, source: SnapshotSource, hooks: StreamHooks, send: Send
    ) -> None:
        self._stream = stream
        self._source = source
        self._hooks = hooks
        self._send = send
        self._progress: dict[TypeUrl, _Progress] = {}
        self._nonces = itertools.count(1)

    def on_request(self, request: Any) -> None:
        type_url = types.type_url(request.type_url)
        state = self._stream.state(type_url)
        progress = self._progress.setdefault(type_url, _Progress())
        nonce = request.response_nonce
        if nonce and state.nonce and nonce != state.nonce:
            log.debug(
                "ads.stale proxy=%s type=%s nonce=%s latest=%s",
                self._stream.proxy_id,
                short(type_url),
                nonce,
                state.nonce,
            )
            return
        state.wildcard, state.names = self._subscription(type_url, progress, request)
        names_changed = (state.wildcard, state.names) != progress.sent_for
        if not nonce or not state.nonce:
            answer = True
        elif request.HasField("error_detail"):
            held = not progress.answered
            if held:
                self._nack(type_url, state, request)
            progress.answered = True
            answer = names_changed or (held and self._moved(type_url, state))
        elif not progress.answered:
            self._ack(type_url, state, request)
            progress.answered = True
            answer = names_changed or self._moved(type_url, state)
        else:
            answer = True
        if answer:
            snapshot = self._source.get(self._stream.key)
            if snapshot is None:
                progress.pending = True
                log.info(
                    "ads.waiting proxy=%s key=%s type=%s",
                    self._stream.proxy_id,
                    self._stream.key,
                    short(type_url),
                )
            else:
                self._respond(type_url, state, progress, snapshot)

    def on_snapshot(self) -> None:
        snapshot = self._source.get(self._stream.key)
        if snapshot is None:
            return
        for type_url in push_order(self._progress):
            state, progress = self._stream.types[type_url], self._progress[type_url]
            # one response in flight: the proxy's ACK or NACK sends the newest (on_request)
            if progress.pending or (progress.answered and _behind(type_url, state, snapshot)):
                self._respond(type_url, state, progress, snapshot)

    def _moved(self, type_url: TypeUrl, state: TypeState) -> bool:
        """Whether the snapshot moved past the type's latest response while it was in
        flight (held back until the proxy answered it)."""
        snapshot = self._source.get(self._stream.key)
        return snapshot is not None and _behind(type_url, state, snapshot)

    def _subscription(self, type_url: TypeUrl, progress: _Progress, request: Any) -> Subscription:
        names = SHARED(frozenset(request.resource_names))
        if type_url not in WILDCARD_TYPES:
            return False, names
        if names:
            progress.named = True
            return WILDCARD in names, SHARED(names - {WILDCARD})
        return not progress.named, names

    def _respond(
        self, type_url: TypeUrl, state: TypeState, progress: _Progress, snapshot: Snapshot
    ) -> None:
        names = None if state.wildcard else SHARED.sorted(state.names)
        response, count = snapshot.response(type_url, names)  # serialized once, shared
        version = snapshot.version_of(type_url)
        nonce = str(next(self._nonces))
        state.sent_version, state.nonce = version, nonce
        progress.answered, progress.pending = False, False
        progress.sent_for = (state.wildcard, state.names)
        log.debug(
            "ads.respond proxy=%s type=%s version=%s nonce=%s resources=%d",
            self._stream.proxy_id,
            short(type_url),
            version,
            nonce,
            count,
        )
        self._send(Outgoing(with_nonce(response, nonce), type_url, version))

    def _ack(self, type_url: TypeUrl, state: TypeState, request: Any) -> None:
        acked = request.version_info
        # the version sent, when it is the one ACKed: one string per version, not per stream
        state.acked_version = state.sent_version if acked == state.sent_version else acked
        state.last_error = None
        log.debug(
            "ads.ack proxy=%s type=%s version=%s",
            self._stream.proxy_id,
            short(type_url),
            request.version_info,
        )
        self._hooks.on_ack(self._stream, type_url, request.version_info)

    def _nack(self, type_url: TypeUrl, state: TypeState, request: Any) -> None:
        rejected = state.sent_version or ""
        message = request.error_detail.message
        state.nack_count += 1
        state.last_error = message
        log.warning(
            "ads.nack proxy=%s type=%s version=%s accepted=%s error=%r",
            self._stream.proxy_id,
            short(type_url),
            rejected,
            request.version_info,
            message,
        )
        self._hooks.on_nack(self._stream, type_url, rejected, message)


class SotwServer:
    """The ``StreamAggregatedResources`` handler; :class:`AdsServicer` registers it."""

    def __init__(self, runner: StreamRunner) -> None:
        self._runner = runner

    async def StreamAggregatedResources(
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        runner = self._runner

        def make(stream: ProxyStream, send: Send) -> SotwMachine:
            return SotwMachine(stream, runner.source, runner.hooks, send)

        await runner.run("sotw", request_iterator, context, make)

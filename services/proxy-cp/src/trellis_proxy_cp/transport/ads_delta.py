"""ADS, incremental (delta): ``DeltaAggregatedResources``.

Per type URL the stream keeps the subscription (a wildcard flag and explicit names) and what
the proxy holds: name -> version, or ``None`` for "told it does not exist". A response
carries only what differs: resources whose version the proxy does not hold, and in
``removed_resources`` names it holds (or asked for) that the snapshot lacks. Each resource
carries its content hash as version; ``system_version_info`` is the snapshot's per-type
version and is what ``on_sent``/``on_ack``/``on_nack`` report.

The rules, from Envoy's xDS protocol doc:

* ``initial_resource_versions`` on the first request of a type says what a reconnecting
  proxy already holds: resources at those versions are not sent again.
* ``resource_names_subscribe`` adds names and always gets them (re)sent, even at a version
  the proxy seems to hold (it may have forgotten it); a name that does not exist is answered
  in ``removed_resources``. ``resource_names_unsubscribe`` drops names and needs no answer,
  except under a wildcard, where the proxy is told whether the name is still included.
* Wildcard (LDS and CDS only): ``*`` in subscribe / unsubscribe, or (legacy) a first request
  that subscribes to nothing.
* The subscription changes even when the nonce is stale; only ACK/NACK accounting requires
  the latest nonce. An ACK or NACK needs no answer; after a NACK the rejected versions count
  as held, so they are not sent again until they change.
* The first request of a type is always answered, if need be with an empty response, so a
  proxy with nothing to fetch still completes its initial fetch.
* One response in flight per type (Istio's and Consul's flow control; go-control-plane's
  state of the world gets it from its protocol): a snapshot change while the proxy has not
  answered the type's last response is held back, and the proxy's ACK or NACK, which
  flushes the type, sends what differs then, the changes meanwhile in one response. Under
  churn a proxy gets no more pushes than it can take, and the control plane no more writes
  than the proxy reads. What the proxy asks for (a subscription, its first request) is
  answered at once.
* An EDS cluster the proxy already had, updated over CDS, warms until its load assignment
  arrives, and Envoy (1.40, delta) does not ask for it again: the name stays subscribed by
  the old cluster. So its ClusterLoadAssignment is sent again right after the CDS response,
  or the updated cluster would warm until ``initial_fetch_timeout`` (15 s) and then serve
  with no endpoints.

Subscriptions accumulate over requests, so the names subscribed to per type are capped
(``max_resource_names``, :mod:`.limits`) after each request, besides the cap per request.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from trellis_proxy_cp import types
from trellis_proxy_cp.cache.references import eds_service_name
from trellis_proxy_cp.cache.snapshot import Snapshot, push_order
from trellis_proxy_cp.cache.store import SnapshotSource
from trellis_proxy_cp.transport import limits
from trellis_proxy_cp.transport.ads_sotw import WILDCARD, WILDCARD_TYPES
from trellis_proxy_cp.transport.limits import StreamLimits
from trellis_proxy_cp.transport.streamhooks import StreamHooks
from trellis_proxy_cp.transport.streams import (
    Outgoing,
    ProxyStream,
    Send,
    StreamRunner,
    TypeState,
    short,
)
from trellis_proxy_cp.types import CLUSTER, ENDPOINT, TypeUrl

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Held:
    """Delta-only bookkeeping of one type, next to the shared :class:`TypeState`."""

    versions: dict[str, str | None] = dataclasses.field(default_factory=dict)
    """What the proxy holds: name -> version, ``None`` once told the name does not exist."""
    force: set[str] = dataclasses.field(default_factory=set)
    """Names to answer even if the proxy holds them at the current version."""
    answered: bool = False
    owed: bool = False
    """A response is due even if nothing differs (first request of the type)."""


class DeltaMachine:
    """The incremental protocol for one stream (see the module docstring)."""

    def __init__(
        self,
        stream: ProxyStream,
        source: SnapshotSource,
        hooks: StreamHooks,
        send: Send,
        stream_limits: StreamLimits | None = None,
    ) -> None:
        self._stream = stream
        self._source = source
        self._hooks = hooks
        self._send = send
        self._limits = stream_limits if stream_limits is not None else StreamLimits()
        self._held: dict[TypeUrl, _Held] = {}
        self._nonces = itertools.count(1)

    def on_request(self, request: Any) -> None:
        type_url = types.type_url(request.type_url)
        first = type_url not in self._held
        state = self._stream.state(type_url)
        held = self._held.setdefault(type_url, _Held())
        nonce = request.response_nonce
        if nonce and nonce == state.nonce and not held.answered:
            held.answered = True
            if request.HasField("error_detail"):
                self._nack(type_url, state, request.error_detail.message)
            else:
                self._ack(type_url, state)
        elif nonce and nonce != state.nonce:
            log.debug(
                "ads.stale proxy=%s type=%s nonce=%s", self._stream.proxy_id, short(type_url), nonce
            )
        if first:
            held.versions.update(request.initial_resource_versions)
            held.owed = True
        self._subscribe(type_url, state, held, request, first)
        self._flush(type_url, state, held, self._source.get(self._stream.key))

    def on_snapshot(self) -> None:
        snapshot = self._source.get(self._stream.key)
        for type_url in push_order(self._held):
            state, held = self._stream.types[type_url], self._held[type_url]
            if state.nonce and not held.answered and not (held.force or held.owed):
                continue  # one response in flight per type: the proxy's answer flushes this
            self._flush(type_url, state, held, snapshot)

    def _subscribe(
        self, type_url: TypeUrl, state: TypeState, held: _Held, request: Any, first: bool
    ) -> None:
        subscribe = set(request.resource_names_subscribe)
        unsubscribe = set(request.resource_names_unsubscribe)
        if type_url in WILDCARD_TYPES:
            if first and not subscribe and not unsubscribe:
                state.wildcard = True
            if WILDCARD in subscribe:
                state.wildcard = True
            if WILDCARD in unsubscribe:
                state.wildcard = False
            subscribe.discard(WILDCARD)
            unsubscribe.discard(WILDCARD)
        state.names = (state.names | subscribe) - unsubscribe
        limits.check_subscription(type_url, len(state.names), self._limits)
        if not first:
            held.force |= subscribe
        for name in unsubscribe:
            if state.wildcard:
                held.force.add(name)
            else:
                held.force.discard(name)
        if not state.wildcard:
            held.versions = {n: v for n, v in held.versions.items() if n in state.names}

    def _flush(
        self, type_url: TypeUrl, state: TypeState, held: _Held, snapshot: Snapshot | None
    ) -> None:
        if snapshot is None:
            return
        available = snapshot.of_type(type_url)
        candidates = set(state.names) | held.force
        if state.wildcard:
            candidates |= set(available) | set(held.versions)
        changed, removed = [], []
        for name in sorted(candidates):
            interested = state.wildcard or name in state.names
            resource = available.get(name)
            if resource is not None:
                if name in held.force or (
                    interested and held.versions.get(name) != resource.version
                ):
                    changed.append(resource)
            elif name in held.force or (interested and held.versions.get(name, "") is not None):
                removed.append(name)
        if not (changed or removed or held.owed):
            return
        version = snapshot.version_of(type_url)
        nonce = str(next(self._nonces))
        head = discovery_pb2.DeltaDiscoveryResponse(
            system_version_info=version, type_url=type_url, nonce=nonce, removed_resources=removed
        )
        # serialized here: the resources are their delta entries, each encoded once
        response = head.SerializeToString() + b"".join(r.delta_entry for r in changed)
        rewarm = self._rewarming(type_url, held, changed)
        for resource in changed:
            held.versions[resource.name] = resource.version
        for name in removed:
            held.versions[name] = None
        held.force.clear()
        held.owed, held.answered = False, False
        state.sent_version, state.nonce = version, nonce
        log.debug(
            "ads.respond proxy=%s type=%s version=%s nonce=%s resources=%d removed=%d",
            self._stream.proxy_id,
            short(type_url),
            version,
            nonce,
            len(changed),
            len(removed),
        )
        self._send(Outgoing(response, type_url, version))
        if rewarm:
            endpoints = self._held[ENDPOINT]
            endpoints.force |= rewarm
            self._flush(ENDPOINT, self._stream.state(ENDPOINT), endpoints, snapshot)

    def _rewarming(self, type_url: TypeUrl, held: _Held, changed: list[Any]) -> set[str]:
        """The load assignments of EDS clusters this CDS response updates (not adds) and the
        proxy subscribes to: they must follow (see the module docstring)."""
        if type_url != CLUSTER or ENDPOINT not in self._held:
            return set()
        subscribed = self._stream.state(ENDPOINT).names
        found = set()
        for resource in changed:
            if held.versions.get(resource.name) is None:
                continue  # a new cluster: Envoy subscribes to its assignment itself
            name = eds_service_name(resource.body)
            if name is not None and name in subscribed:
                found.add(name)
        return found

    def _ack(self, type_url: TypeUrl, state: TypeState) -> None:
        version = state.sent_version or ""
        state.acked_version, state.last_error = version, None
        log.debug(
            "ads.ack proxy=%s type=%s version=%s", self._stream.proxy_id, short(type_url), version
        )
        self._hooks.on_ack(self._stream, type_url, version)

    def _nack(self, type_url: TypeUrl, state: TypeState, message: str) -> None:
        version = state.sent_version or ""
        state.nack_count += 1
        state.last_error = message
        log.warning(
            "ads.nack proxy=%s type=%s version=%s error=%r",
            self._stream.proxy_id,
            short(type_url),
            version,
            message,
        )
        self._hooks.on_nack(self._stream, type_url, version, message)


class DeltaServer:
    """The ``DeltaAggregatedResources`` handler; :class:`AdsServicer` registers it."""

    def __init__(self, runner: StreamRunner) -> None:
        self._runner = runner

    async def DeltaAggregatedResources(
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        runner = self._runner

        def make(stream: ProxyStream, send: Send) -> DeltaMachine:
            return DeltaMachine(stream, runner.source, runner.hooks, send, runner.limits)

        await runner.run("delta", request_iterator, context, make)

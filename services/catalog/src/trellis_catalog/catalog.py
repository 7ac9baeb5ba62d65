"""The mesh catalog: inputs in, versioned resources out, incrementally and in batches.

Inputs: the specification (documents), what each endpoints provider reports, the proxies
expected (a proxy certificate was issued) and connected, and the service certificates.
Every input marks what it touches as dirty and wakes one recompute loop, which flushes at
once (the leading edge: a lone change never waits for a quiet period), and coalesces what
arrives while a flush is built into the next flush, which follows at once: under churn a
change waits for at most one flush, however steady the stream. The recompute rebuilds
what the dirty inputs touched (services, clusters, policies), the resource store
(:mod:`~trellis_catalog.domain.publish.resources`) gives a new version to each policy,
slice and destination that changed, as one revision, and every watcher (``WatchChanges``,
proxy-cp's) is woken at once (:meth:`Catalog.moved_after`) to send what moved since its
last answer (:meth:`Catalog.changes_since`). Certificates are not among the resources:
they reach proxy-cp from certmanager, on one path.
A flush runs in steps (between services and between identities) and gives the event loop
back every :data:`STEP_SECONDS` of work, so a full build never stalls the APIs.

Replicas run active-active: each computes the same views from the same inputs (the spec,
the providers' reports, certmanager's proxy records: each replica follows them all), and
every version a consumer compares (policies, slices, destinations) is a digest of the
content (:mod:`~trellis_catalog.domain.model.contentversion`), equal on every replica and across
restarts. Only the cursor is a replica's own: another's gets a full listing, from which
proxy-cp refetches only the resources whose version differs from the one it holds. A
proxy-cp watches one replica at a time. The rule for a replica that lags (it applied an
input a moment after the other): versions carry no order, so a consumer that switched to
it in that moment may take the older resource, then the newer one on its next flush,
which answers the watch again; the flap lasts one flush of the lagging replica, and is
accepted rather than ordered by input revisions (the spec directory has none). What a
replica knows alone: the proxies connected to the proxy-cps that talk to it
(``RegisterProxy``; a proxy-cp registers them all again with a replica it switches to),
and, while the proxies of one identity run under several accounts, which was established
first (onboarding order as this replica heard it).

:class:`Catalog` is the façade over the parts, each its own domain module:
:class:`~trellis_catalog.domain.index.reports.ProviderReports` (the provider merge),
:class:`~trellis_catalog.domain.index.proxies.Proxies` (the proxy registry),
:class:`~trellis_catalog.domain.changes.recompute.Recompute` (dirty tracking, the service index,
clusters and policies), :class:`~trellis_catalog.domain.publish.destinations.Destinations` and
:class:`~trellis_catalog.domain.publish.resources.ResourceStore` (versions, the change log).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from trellis_catalog.domain.access.policy import PolicyBuilder
from trellis_catalog.domain.changes.recompute import Recompute
from trellis_catalog.domain.index import services as svc
from trellis_catalog.domain.index.proxies import Proxies, ProxyRecord, UnknownProxy
from trellis_catalog.domain.index.reports import ProviderReports
from trellis_catalog.domain.model import contentversion
from trellis_catalog.domain.model.views import ClusterState, Identity, IdentityPolicy
from trellis_catalog.domain.publish.destinations import Destination, Destinations
from trellis_catalog.domain.publish.resources import Published, ResourceStore, policy_name
from trellis_common.documents.base import Document, DocumentError
from trellis_common.model import MeshService
from trellis_runtime import lifecycle
from trellis_runtime.follow import describe
from trellis_runtime.health import Health
from trellis_spec import mesh as meshspec
from trellis_spec import statuses
from trellis_spec.steps import Steps, drain, full_collections_paused, run_in_steps

__all__ = [
    "Catalog",
    "CertificateRef",
    "ProxyRecord",
    "Published",
    "UnknownProxy",
]

log = logging.getLogger(__name__)

#: The ``/v1/status`` source of services whose proxies run under several accounts.
ACCOUNT_CONFLICT = "proxy-account"

STEP_SECONDS = 0.005  # the longest a flush holds the event loop between two steps
#: How often the catalog forgets the proxies gone for good (:meth:`Catalog.sweep_proxies`).
PROXY_SWEEP_SECONDS = 60.0
FREEZE_AFTER = 0.05  # seconds of work: a flush this big freezes what it built (flush_in_steps)


@dataclass(frozen=True, slots=True)
class CertificateRef:
    common_name: str
    serial: str
    trust_bundle_fingerprint: str = ""


class Catalog:
    """The façade: takes the inputs, answers the queries, runs the batching loop and
    flushes; the work is the parts' (see the module's docstring)."""

    def __init__(
        self,
        trust_domain: str = "cluster.local",
        cluster_domain: str = "cluster.local",
        health: Health | None = None,
        clock: Callable[[], float] = time.time,
        freeze_heap: bool = False,
    ) -> None:
        self._freeze_heap = freeze_heap  # the service's: see flush_in_steps
        self.health = health if health is not None else Health()
        self.reports = ProviderReports()
        self.proxies = Proxies(clock, self._proxies_changed, self._onboarded)
        self._recompute = Recompute(
            self.reports, self.proxies, trust_domain, cluster_domain, self._verdict
        )
        self.resources = ResourceStore()
        self.destinations = Destinations()
        self.certificates: dict[Identity, CertificateRef] = {}
        self._wake = asyncio.Event()
        self._flushing = asyncio.Lock()  # one flush at a time: a flush yields in steps
        self.ready = asyncio.Event()
        self._moved = asyncio.Event()  # rung, and replaced, by each flush that moved a resource
        self.last_flush_seconds = 0.0
        self.certs_wanted = asyncio.Event()
        #: the account conflicts last reported (``_report_conflicts``)
        self._conflicts: dict[Identity, tuple[str, tuple[str, ...]]] = {}

    # -- the parts' state, read-only -------------------------------------------------

    @property
    def spec(self) -> meshspec.MeshSpec:
        return self._recompute.spec

    @property
    def services(self) -> Mapping[MeshService, svc.KnownService]:
        return self._recompute.services

    @property
    def clusters(self) -> Mapping[str, ClusterState]:
        return self._recompute.clusters.states

    @property
    def policies(self) -> Mapping[Identity, IdentityPolicy]:
        return self._recompute.policies

    @property
    def last_recomputed(self) -> int:
        """Identities whose policy the last flush recomputed."""
        return self._recompute.last_recomputed

    @property
    def spec_updates(self) -> Mapping[str, int]:
        """How often the spec was ``built`` from every document or ``patched`` (an edit of
        access policy alone, at the cost of what it touches)."""
        return self._recompute.spec_updates

    def view_versions(self) -> dict[Identity, str]:
        """Each identity with a policy, and its view's version (:meth:`view_version`)."""
        return {i: self.view_version(i) for i in self.policies}

    @property
    def revision(self) -> int:
        return self.resources.revision

    # -- inputs ------------------------------------------------------------------------

    def set_documents(self, documents: Iterable[Document], errors: Iterable[DocumentError]) -> None:
        self._recompute.set_documents(documents, errors)
        self._wake.set()

    def set_provider_services(self, provider: str, reports: Iterable[svc.ProvidedService]) -> None:
        """Replace everything ``provider`` reported (a full list, after (re)connecting)."""
        self.reports.replace(provider, reports)
        self._mark(services=True)

    def update_provider_service(
        self, provider: str, namespace: str, key: str, report: svc.ProvidedService | None
    ) -> None:
        """One service (``key``: the provider's name for it) changed at one provider: only
        that service is re-indexed."""
        service = self.reports.forget((provider, namespace, key))
        if service is not None:
            self._recompute.changed(service)
        if report is not None:
            self._recompute.changed(self.reports.keep(provider, report))
        self._wake.set()

    def remove_provider_service(self, provider: str, namespace: str, key: str) -> None:
        self.update_provider_service(provider, namespace, key, None)

    def drop_provider(self, provider: str) -> None:
        self.set_provider_services(provider, [])

    def providers(self) -> set[str]:
        return self.reports.providers()

    def expect_proxy(
        self, common_name: str, service_account: str = "", not_after: float = 0.0, serial: str = ""
    ) -> ProxyRecord:
        """A proxy certificate was issued: the proxy may connect. Raises
        :class:`UnknownProxy` for a malformed common name or service account."""
        return self.proxies.expect(common_name, service_account, not_after, serial)

    def expect_only(self, common_names: Iterable[str]) -> None:
        """Certmanager's full list of proxy certificates (see :meth:`Proxies.expect_only`)."""
        self.proxies.expect_only(common_names)

    def prune_proxies(self) -> int:
        return self.proxies.prune()

    async def sweep_proxies(
        self, stop: asyncio.Event, interval: float = PROXY_SWEEP_SECONDS
    ) -> None:
        """Every ``interval`` seconds, forget the proxies gone for good: disconnected, with a
        certificate that expired (a pod deleted a day ago). certmanager prunes their records
        without a signal, so without this sweep they would stay expected, and keep their
        identities' policies, until the next full listing of certificates."""

        async def sweep() -> None:
            if pruned := self.prune_proxies():
                log.info("proxies.pruned count=%d reason=disconnected-certificate-expired", pruned)

        await lifecycle.every(stop, interval, sweep, "proxies.sweep")

    def register_proxy(
        self, common_name: str, proxy_cp: str = "", address: str = ""
    ) -> ProxyRecord:
        return self.proxies.register(common_name, proxy_cp, address)

    def unregister_proxy(self, common_name: str) -> ProxyRecord:
        return self.proxies.unregister(common_name)

    def set_certificate(self, identity: Identity, ref: CertificateRef) -> None:
        """Record the service certificate issued for ``identity`` (the issuer's state).

        It is no resource of proxy-cp's: proxy-cp takes certificates and keys from
        certmanager, over one path, so a rotation rebuilds a proxy's snapshot once.
        """
        self.certificates[identity] = ref

    def identities_with_proxies(self) -> dict[Identity, str]:
        return self.proxies.accounts()

    def _mark(self, *, spec: bool = False, services: bool = False, policies: bool = False) -> None:
        self._recompute.mark(spec=spec, services=services, policies=policies)
        self._wake.set()

    def _proxies_changed(self) -> None:
        self._mark(policies=True)
        self._report_conflicts()

    def account_conflicts(self) -> list[statuses.Status]:
        """Services whose proxies run under several accounts, as ``trellis spec list``
        shows them (a warning on the Service: the established account is kept)."""
        return [
            statuses.Status(
                key=f"Service/{identity}#proxies",
                kind="Service",
                namespace=identity.namespace,
                name=identity.service,
                state="warning",
                reason=f"its proxies run as {established} (established, kept: peers check it) "
                f"and as {', '.join(others)} (refused by peers): run them under one account",
                field="proxies.serviceAccount",
                source=ACCOUNT_CONFLICT,
            )
            for identity, (established, others) in sorted(self.proxies.conflicts().items())
        ]

    def _report_conflicts(self) -> None:
        """A service whose proxies run under several accounts is shown in ``/v1/status``
        (source ``proxy-account``) and ``trellis spec list`` until they agree again.
        Reported when they change: each is rejected (logged, counted) once, not again at
        every other proxy's onboarding."""
        now = self.proxies.conflicts()
        if now == self._conflicts:
            return
        self._conflicts = now
        conflicts = self.account_conflicts()
        rejections = self.health.rejections
        for status in conflicts:
            rejections.reject(ACCOUNT_CONFLICT, f"{status.namespace}/{status.name}", status.reason)
        rejections.accept_all(ACCOUNT_CONFLICT, {f"{s.namespace}/{s.name}" for s in conflicts})

    def _onboarded(self, record: ProxyRecord) -> None:
        self.certs_wanted.set()

    def _verdict(self, identity: Identity, error: Exception | None) -> None:
        if error is None:
            self.health.rejections.accept("catalog", f"view {identity}")
        else:
            self.health.rejections.reject("catalog", f"view {identity}", describe(error))

    # -- queries -----------------------------------------------------------------------

    def account_of(self, service: MeshService) -> str:
        return self._recompute.account_of(service)

    def account_of_identity(self, identity: Identity) -> str:
        return self.account_of(MeshService(*identity))

    def identities(self) -> list[Identity]:
        return self._recompute.identities()

    def policy_for(self, identity: Identity, service_account: str = "") -> IdentityPolicy:
        """The policy of ``identity``, computed on demand if it is not known yet."""
        return self._recompute.policy_for(identity, service_account)

    def view_version(self, identity: Identity) -> str:
        """The version of the identity's whole view: a digest of its policy's version and
        its slices' ("0" while it has no policy)."""
        resources = self.resources
        policy = resources.versions.get(policy_name(identity))
        if policy is None:
            return "0"
        slices = resources.slices_of(identity)
        return contentversion.of((policy, tuple(resources.versions.get(n, "") for n in slices)))

    def participant(self, record: ProxyRecord) -> bool:
        """Expected, connected, and its service has a discovered endpoint (at its address,
        when the proxy's address is known): the design's definition of a mesh participant."""
        if not (record.expected and record.connected):
            return False
        known = self.services.get(MeshService(*record.identity))
        if known is None or not known.endpoints:
            return False
        return not record.address or any(e.address == record.address for e in known.endpoints)

    def builder(self) -> PolicyBuilder:
        return self._recompute.builder()

    # -- flush -------------------------------------------------------------------------

    def flush(self) -> Published | None:
        """Apply every pending input now; returns what was published (None: nothing moved)."""
        return drain(self._flush_steps())

    async def flush_in_steps(self) -> Published | None:
        """:meth:`flush`, giving the event loop back every :data:`STEP_SECONDS` of work, so
        that a big recompute (a full build takes hundreds of milliseconds at a thousand
        services) never holds up the gRPC API, the admin server or the followers."""
        async with self._flushing:
            if self._freeze_heap:  # the service's: the collector is its own
                with full_collections_paused():
                    batch = await run_in_steps(self._flush_steps(), STEP_SECONDS)
            else:
                batch = await run_in_steps(self._flush_steps(), STEP_SECONDS)
        if self._freeze_heap and self.last_flush_seconds >= FREEZE_AFTER:
            # What a big flush built lives long: out of the collector's sight (after the
            # young garbage is collected), so a full collection (a pause that grows with
            # the heap: 150 ms and more at a thousand services) scans only what is newer.
            # Refcounting still frees frozen objects; a cycle among them would wait, so
            # small flushes (churn) never freeze: their garbage is the collector's.
            gc.collect(1)
            gc.freeze()
        return batch

    async def settled(self) -> None:
        """Wait for the flush in progress, if any: a reader of views, clusters or
        destinations then sees one flush's whole result, never a half-built one."""
        if self._flushing.locked():
            async with self._flushing:
                return

    def _flush_steps(self) -> Steps[Published | None]:
        """The flush's work in steps; ``last_flush_seconds`` is the time spent in them (the
        waits between steps, when others ran, left out)."""
        work, busy = self._flush_work(), 0.0
        while True:
            resumed = time.perf_counter()
            try:
                next(work)
            except StopIteration as done:
                self.last_flush_seconds = busy + time.perf_counter() - resumed
                batch: Published | None = done.value
                return batch
            busy += time.perf_counter() - resumed
            yield

    def _flush_work(self) -> Steps[Published | None]:
        self._wake.clear()
        result = yield from self._recompute.apply_steps()
        scope = result.services
        if scope is None:
            scope = set(self.services) | set(self.destinations.records)
        moved = yield from self.destinations.update_steps(
            scope, self.services, self.clusters, self._destination
        )
        published = yield from self.resources.publish_steps(
            result.identities, result.clusters, self.policies, self.clusters, moved
        )
        self.ready.set()
        if published is not None:
            rung, self._moved = self._moved, asyncio.Event()
            rung.set()
        return published

    async def moved_after(self, cursor: str) -> None:
        """Return once a flush moved the cursor past ``cursor`` (at once if it has)."""
        while self.resources.cursor == cursor:
            await self._moved.wait()

    async def run(self, stop: asyncio.Event) -> None:
        """The batching loop: flush on the first input, wake the watchers, and go again at
        once if more came meanwhile (see the module's docstring).

        A flush that fails is reported (a rejection ``catalog/flush`` with the reason, in
        ``/v1/status``) and retried on the next input; the last good views stay in force.
        """
        while not stop.is_set():
            waiter = asyncio.create_task(self._wake.wait())
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            stopper.cancel()
            if stop.is_set():
                return
            # one turn of the loop, no timer: the inputs of the same moment (a provider's
            # fetch delivering several services) go out together
            await asyncio.sleep(0)
            try:
                await self.flush_and_announce()
                self.health.rejections.accept("catalog", "flush")
            except Exception as exc:
                log.exception("catalog.flush_failed")
                self.health.rejections.reject("catalog", "flush", describe(exc))

    def _destination(self, known: svc.KnownService) -> Destination:
        return self._recompute.destination(known)

    async def flush_and_announce(self) -> Published | None:
        """Flush; when any resource moved, the watchers were woken by the flush (they send
        what moved since their cursor), and it is logged."""
        published = await self.flush_in_steps()
        if published is None:
            return None
        log.debug(  # per flush: at 100 endpoint changes/s, info would be 100 lines/s
            "catalog.resources_changed cursor=%s resources=%d took_ms=%.1f",
            self.resources.cursor,
            len(published.changes),
            self.last_flush_seconds * 1000,
        )
        return published

    def changes_since(self, cursor: str) -> tuple[str, bool, list[tuple[str, str]]]:
        """(next cursor, full?, [(name, version)]): see :meth:`ResourceStore.since`."""
        return self.resources.since(cursor)

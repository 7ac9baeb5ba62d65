"""The mesh catalog: inputs in, per-identity views out, incrementally and debounced.

Inputs: the specification (documents), what each endpoints provider reports, the proxies
expected (a proxy certificate was issued) and connected, and the service certificates.
Every input marks what it touches as dirty and wakes one recompute loop, which waits for a
quiet period (with a hard maximum) and then:

1. rebuilds the service index and the clusters whose endpoints changed (a changed cluster
   gets a new version; its content is shared by every view that references it);
2. recomputes policies only when the specification, a service's ports or accounts, or the
   proxies changed, and keeps the old policy object when the new one is equal;
3. gives a new version to each identity whose policy or referenced clusters changed, and
   announces them in one batch (bus revision + watchers). A certificate rotation does not
   re-version a view: certificates reach proxy-cp from certmanager, on one path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from trellis_catalog.domain import services as svc
from trellis_catalog.domain import spec as meshspec
from trellis_catalog.domain.policy import PolicyBuilder
from trellis_catalog.domain.reports import ProviderReports
from trellis_catalog.domain.views import ClusterState, Identity, IdentityPolicy
from trellis_common.documents.base import Document, DocumentError, DocumentKey
from trellis_common.follow import describe
from trellis_common.health import Health
from trellis_common.ids import InvalidIdentifier, ProxyCommonName, validate_dns_subdomain
from trellis_common.model import MeshService, ServiceAccount

log = logging.getLogger(__name__)

#: Signals (kind, key) on the ``views`` topic; an owner's ``Outbox.signal`` bound to it.
Announce = Callable[[str, str], Awaitable[int]]
TOPIC = "views"
TARGET = "TrafficTarget"
POLICY_KINDS = frozenset({TARGET, "HTTPRouteGroup", "TCPRoute"})


@dataclass(frozen=True, slots=True)
class CertificateRef:
    common_name: str
    serial: str
    trust_bundle_fingerprint: str = ""


@dataclass
class ProxyRecord:
    common_name: str
    identity: Identity
    service_account: str
    expected: bool = False
    connected: bool = False
    proxy_cp: str = ""
    address: str = ""
    seq: int = 0  # onboarding order: the latest proxy's account is the identity's
    not_after: float = 0.0  # its certificate's expiry (epoch seconds), when known


@dataclass(frozen=True, slots=True)
class ViewBatch:
    revision: int
    identities: tuple[tuple[str, str], ...]  # (identity, version); version "" = removed


@dataclass
class _Dirty:
    spec: bool = False
    services: bool = False  # every service: re-index all
    policies: bool = False
    identities: set[Identity] = field(default_factory=set)
    changed: set[MeshService] = field(default_factory=set)  # only these services
    documents: dict[DocumentKey, Any] = field(default_factory=dict)  # changed: old resource

    def any(self) -> bool:
        return self.spec or self.services or self.policies or bool(self.identities or self.changed)


class UnknownProxy(ValueError):
    pass


class Catalog:
    def __init__(
        self,
        announce: Announce,
        trust_domain: str = "cluster.local",
        cluster_domain: str = "cluster.local",
        quiet: float = 0.02,
        max_delay: float = 0.2,
        health: Health | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._announce = announce
        self.health = health if health is not None else Health()
        self._clock = clock
        self._trust_domain = trust_domain
        self._cluster_domain = cluster_domain
        self._quiet = quiet
        self._max_delay = max_delay
        self._documents: list[Document] = []
        self._resources: dict[DocumentKey, Any] = {}
        self._errors: list[DocumentError] = []
        self.spec = meshspec.build([])
        self.reports = ProviderReports()
        self.services: dict[MeshService, svc.KnownService] = {}
        self.clusters: dict[str, ClusterState] = {}
        self._clusters_of: dict[MeshService, set[str]] = {}
        self._clusters_trust = ""
        self.policies: dict[Identity, IdentityPolicy] = {}
        self.versions: dict[Identity, str] = {}
        self._view_key: dict[Identity, tuple[object, ...]] = {}
        self._referenced_by: dict[str, set[Identity]] = {}
        self.proxies: dict[str, ProxyRecord] = {}
        self._seq = 0
        self._last_accounts: dict[MeshService, str] = {}
        self._proxy_accounts: dict[Identity, str] = {}  # the latest onboarded proxy's
        self.certificates: dict[Identity, CertificateRef] = {}
        self.revision = 0
        # Versions are "<epoch>-<revision>": a restarted catalog never reuses a version.
        self._epoch = format(int(time.time() * 1000), "x")
        self._dirty = _Dirty(spec=True)
        self._wake = asyncio.Event()
        self._changed_at: dict[str, int] = {}  # identity -> last announced change (removed too)
        self.ready = asyncio.Event()
        self.last_flush_seconds = 0.0
        self.last_recomputed = 0  # identities whose policy the last flush recomputed
        self.certs_wanted = asyncio.Event()

    # -- inputs ------------------------------------------------------------------------

    def set_documents(self, documents: Iterable[Document], errors: Iterable[DocumentError]) -> None:
        self._documents = list(documents)
        self._errors = list(errors)
        resources = {d.key: d.resource for d in self._documents}
        for key in resources.keys() | self._resources.keys():
            if resources.get(key) != self._resources.get(key):
                self._dirty.documents.setdefault(key, self._resources.get(key))
        self._resources = resources
        self._mark(spec=True)

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
            self._dirty.changed.add(service)
        if report is not None:
            self._dirty.changed.add(self.reports.keep(provider, report))
        self._wake.set()

    def remove_provider_service(self, provider: str, namespace: str, key: str) -> None:
        self.update_provider_service(provider, namespace, key, None)

    def drop_provider(self, provider: str) -> None:
        self.set_provider_services(provider, [])

    def providers(self) -> set[str]:
        return self.reports.providers()

    def expect_proxy(
        self, common_name: str, service_account: str = "", not_after: float = 0.0
    ) -> ProxyRecord:
        """A proxy certificate was issued: the proxy may connect. Raises
        :class:`UnknownProxy` for a malformed common name or service account."""
        record = self._proxy(common_name, service_account)
        record.expected = True
        if not_after:
            record.not_after = not_after
        return record

    def expect_only(self, common_names: Iterable[str]) -> None:
        """Certmanager's full list of proxy certificates: any other proxy is no longer
        expected (its record was pruned or revoked), and is forgotten once disconnected."""
        keep = set(common_names)
        for record in list(self.proxies.values()):
            if record.expected and record.common_name not in keep:
                record.expected = False
        self.prune_proxies()

    def prune_proxies(self) -> int:
        """Forget proxies that are gone: neither connected nor expected, or whose
        certificate expired while they were disconnected. Returns how many."""
        now = self._clock()
        gone = [
            r
            for r in self.proxies.values()
            if not r.connected and (not r.expected or (r.not_after and r.not_after < now))
        ]
        for record in gone:
            del self.proxies[record.common_name]
            log.debug("proxy.pruned proxy=%s", record.common_name)
        if gone:
            identities = {r.identity for r in self.proxies.values()}
            for record in gone:
                if record.identity not in identities:
                    self._proxy_accounts.pop(record.identity, None)
            self._mark(policies=True)
        return len(gone)

    def register_proxy(
        self, common_name: str, proxy_cp: str = "", address: str = ""
    ) -> ProxyRecord:
        record = self._proxy(common_name, "")
        record.connected, record.proxy_cp, record.address = True, proxy_cp, address
        return record

    def unregister_proxy(self, common_name: str) -> ProxyRecord:
        record = self.proxies.get(common_name)
        if record is None:
            raise UnknownProxy(f"no proxy {common_name!r} is known")
        record.connected = False
        if not record.expected:
            self.prune_proxies()
        return record

    def _proxy(self, common_name: str, service_account: str) -> ProxyRecord:
        try:
            cn = ProxyCommonName.parse(common_name)
            if service_account:  # it becomes a SPIFFE id in every policy recompute
                validate_dns_subdomain(service_account, "service account")
        except InvalidIdentifier as exc:
            raise UnknownProxy(str(exc)) from exc
        identity = Identity(cn.namespace, cn.service)
        record = self.proxies.get(common_name)
        if record is None:
            self._seq += 1
            record = self.proxies[common_name] = ProxyRecord(
                common_name, identity, service_account or cn.service, seq=self._seq
            )
            self._proxy_accounts[identity] = record.service_account
            others = {
                r.service_account
                for r in self.proxies.values()
                if r.identity == identity and r is not record
            }
            if others - {record.service_account}:
                log.warning(
                    "proxy.account_conflict identity=%s proxy=%s account=%s others=%s "
                    "action='the latest proxy's account is used'",
                    identity,
                    common_name,
                    record.service_account,
                    ",".join(sorted(others)),
                )
            self._mark(policies=True)
            self.certs_wanted.set()
        elif service_account and service_account != record.service_account:
            record.service_account = service_account
            latest = max(
                (r for r in self.proxies.values() if r.identity == identity), key=lambda r: r.seq
            )
            self._proxy_accounts[identity] = latest.service_account
            self._mark(policies=True)
        return record

    def set_certificate(self, identity: Identity, ref: CertificateRef) -> None:
        """Record the service certificate ``identity``'s proxies present (shown in its view).

        It does not re-version the view: proxy-cp takes certificates and keys from
        certmanager, over one path, so a rotation rebuilds a proxy's snapshot once.
        """
        self.certificates[identity] = ref

    def identities_with_proxies(self) -> dict[Identity, str]:
        return {r.identity: r.service_account for r in self.proxies.values()}

    def _mark(self, *, spec: bool = False, services: bool = False, policies: bool = False) -> None:
        self._dirty.spec |= spec
        self._dirty.services |= services
        self._dirty.policies |= policies
        self._wake.set()

    # -- identities and accounts -------------------------------------------------------

    def account_of(self, service: MeshService) -> str:
        latest = self._proxy_accounts.get(Identity(service.namespace, service.name))
        if latest:
            return latest
        known = self.services.get(service)
        if known is not None:
            accounts = Counter(e.service_account for e in known.endpoints if e.service_account)
            if accounts:
                account = accounts.most_common(1)[0][0]
                self._last_accounts[service] = account
                return account
        # With no proxy and no endpoint (all deregistered for a moment), the account stays
        # the last one known: policies do not flip while workloads come and go.
        return self._last_accounts.get(service, service.name)

    def account_of_identity(self, identity: Identity) -> str:
        return self.account_of(MeshService(*identity))

    def identities(self) -> list[Identity]:
        found = {Identity(s.namespace, s.name) for s, k in self.services.items() if not k.external}
        found |= {r.identity for r in self.proxies.values()}
        return sorted(found)

    def policy_for(self, identity: Identity, service_account: str = "") -> IdentityPolicy:
        """The policy of ``identity``, computed on demand if it is not known yet."""
        policy = self.policies.get(identity)
        if policy is None or (service_account and service_account != policy.service_account):
            builder = self._builder()
            account = service_account or self.account_of(MeshService(*identity))
            policy = builder.build(identity, account)
        return policy

    def version_of(self, identity: Identity) -> str:
        return self.versions.get(identity, "0")

    # -- recompute ---------------------------------------------------------------------

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
        return self._builder()

    def _builder(self) -> PolicyBuilder:
        return PolicyBuilder(
            self.spec, self.services, self.account_of, self._trust_domain, self._cluster_domain
        )

    def flush(self) -> ViewBatch | None:
        """Apply every pending input now; returns the batch of changed identities."""
        started = time.perf_counter()
        dirty, self._dirty = self._dirty, _Dirty()
        self._wake.clear()
        recompute_policies = dirty.spec or dirty.policies
        changed_shape = False
        if dirty.spec:
            self.spec = meshspec.build(self._documents, self._errors)
        changed_clusters: set[str] = set()
        if dirty.services:
            scope = set(self.services) | set(self.spec.services) | self.reports.services()
        elif dirty.spec:
            # only Service documents feed the index; policies and the rest do not
            scope = dirty.changed | {
                MeshService(k.namespace, k.name) for k in dirty.documents if k.kind == "Service"
            }
        else:
            scope = dirty.changed
        if scope or dirty.spec:
            before = {s: self._shape(s) for s in scope}
            for service in scope:
                known = svc.known_service(
                    service,
                    self.spec.services.get(service),
                    self.reports.of(service).values(),
                )
                if known is None:
                    self.services.pop(service, None)
                else:
                    self.services[service] = known
            if any(before[s] != self._shape(s) for s in scope):
                recompute_policies = True  # ports, accounts or reachability moved
                changed_shape = True
            changed_clusters = self._rebuild_clusters(scope)
        touched: set[Identity] = set(dirty.identities)
        if recompute_policies:
            builder = self._builder()
            targeted = None if dirty.policies or changed_shape else self._concerned(dirty)
            identities = self.identities() if targeted is None else targeted
            if targeted is None:
                for identity in set(self.policies) - set(identities):
                    del self.policies[identity]
                    touched.add(identity)
            self.last_recomputed = len(identities)
            for identity in identities:
                try:
                    account = self.account_of(MeshService(*identity))
                    policy = builder.build(identity, account)
                except Exception as exc:  # one identity's bad input never stops the others
                    log.exception("catalog.view_failed identity=%s", identity)
                    self.health.rejections.reject("catalog", f"view {identity}", describe(exc))
                    continue  # its last good view, if any, stays in force
                self.health.rejections.accept("catalog", f"view {identity}")
                if policy != self.policies.get(identity):
                    self.policies[identity] = policy
                    touched.add(identity)
            self._index_references()
        for name in changed_clusters:
            touched |= self._referenced_by.get(name, set())
        batch = self._version(touched)
        self.last_flush_seconds = time.perf_counter() - started
        self.ready.set()
        return batch

    def _concerned(self, dirty: _Dirty) -> list[Identity] | None:
        """The identities an edit of access policy concerns, or None for "all of them".

        When only TrafficTargets, HTTPRouteGroups and TCPRoutes changed, only the accounts
        they name (old and new versions) can see their policy change: sources gain or lose
        destinations, destinations gain or lose inbound rules. Anything else (Services,
        splits, ServiceEntries, MeshConfig) may move every identity's view.
        """
        if not dirty.documents or any(k.kind not in POLICY_KINDS for k in dirty.documents):
            return None
        routes = {(k.namespace, k.kind, k.name) for k in dirty.documents if k.kind != TARGET}
        targets: list[Any] = [old for k, old in dirty.documents.items() if k.kind == TARGET]
        for key, resource in self._resources.items():
            if key.kind != TARGET:
                continue
            if key in dirty.documents or any(
                (key.namespace, rule.kind, rule.name) in routes for rule in resource.spec.rules
            ):
                targets.append(resource)
        accounts: set[ServiceAccount] = set()
        for target in targets:
            if target is not None:
                accounts.add(target.destination_account())
                accounts.update(target.source_accounts())
        return [
            identity
            for identity in self.identities()
            if ServiceAccount(identity.namespace, self.account_of_identity(identity)) in accounts
        ]

    def _shape(self, service: MeshService) -> tuple[object, ...] | None:
        """What a policy depends on of a service (not its endpoints' addresses)."""
        known = self.services.get(service)
        if known is None:
            return None
        return (
            known.ports,
            known.location,
            known.export_to,
            known.hosts,
            bool(known.endpoints),
            self.account_of(service),
        )

    def _trust(self) -> str:
        settings = self.spec.settings
        return settings.trust_domain if settings and settings.trust_domain else self._trust_domain

    def _rebuild_clusters(self, scope: set[MeshService]) -> set[str]:
        """Rebuild the clusters of the services in ``scope``; returns the names that changed."""
        changed: set[str] = set()
        trust_domain = self._trust()
        if trust_domain != self._clusters_trust:
            scope = set(self.services) | set(self._clusters_of)  # SPIFFE ids change everywhere
            self._clusters_trust = trust_domain
        for service in scope:
            wanted: dict[str, ClusterState] = {}
            known = self.services.get(service)
            if known is not None:
                for port in known.ports:
                    state = svc.cluster(known, port, trust_domain)
                    wanted[state.ref.name] = state
            for name in self._clusters_of.get(service, set()) - set(wanted):
                del self.clusters[name]
                changed.add(name)
            for name, state in wanted.items():
                old = self.clusters.get(name)
                if old is None or (old.ref, old.endpoints, old.spiffe_ids) != (
                    state.ref,
                    state.endpoints,
                    state.spiffe_ids,
                ):
                    version = (old.version + 1) if old else 1
                    self.clusters[name] = ClusterState(
                        state.ref, state.endpoints, state.spiffe_ids, version
                    )
                    changed.add(name)
            if wanted:
                self._clusters_of[service] = set(wanted)
            else:
                self._clusters_of.pop(service, None)
        return changed

    def _index_references(self) -> None:
        referenced: dict[str, set[Identity]] = {}
        for identity, policy in self.policies.items():
            for name in policy.cluster_names:
                referenced.setdefault(name, set()).add(identity)
        self._referenced_by = referenced

    def _version(self, touched: set[Identity]) -> ViewBatch | None:
        changed: list[tuple[str, str]] = []
        for identity in sorted(touched):
            policy = self.policies.get(identity)
            if policy is None:
                if self.versions.pop(identity, None) is not None:
                    self._view_key.pop(identity, None)
                    changed.append((str(identity), ""))
                continue
            key = (
                id(policy),
                tuple(
                    self.clusters[n].version if n in self.clusters else 0
                    for n in policy.cluster_names
                ),
            )
            if self._view_key.get(identity) != key:
                self._view_key[identity] = key
                changed.append((str(identity), ""))
        if not changed:
            return None
        self.revision += 1
        stamped = []
        for identity_text, _ in changed:
            identity = Identity.parse(identity_text)
            if identity in self.policies:
                version = f"{self._epoch}-{self.revision}"
                self.versions[identity] = version
                stamped.append((identity_text, version))
            else:
                stamped.append((identity_text, ""))
        return ViewBatch(self.revision, tuple(stamped))

    async def run(self, stop: asyncio.Event) -> None:
        """The debounce loop: wait for inputs, let them settle, flush, announce.

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
            deadline = time.monotonic() + self._max_delay
            while time.monotonic() < deadline:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self._quiet)
                    continue
                break
            try:
                await self.flush_and_announce()
                self.health.rejections.accept("catalog", "flush")
            except Exception as exc:
                log.exception("catalog.flush_failed")
                self.health.rejections.reject("catalog", "flush", describe(exc))

    async def flush_and_announce(self) -> ViewBatch | None:
        """Flush, then signal ``views``/``changed`` with the cursor after the flush."""
        batch = self.flush()
        if batch is None:
            return None
        for identity, _ in batch.identities:
            self._changed_at[identity] = batch.revision
        cursor = f"{self._epoch}-{batch.revision}"
        try:
            await self._announce("changed", cursor)
        except Exception as exc:  # noqa: BLE001 (a lost bell costs consumers a resync)
            log.warning("catalog.announce_failed cursor=%s error=%r", cursor, exc)
        log.info(
            "catalog.views_changed cursor=%s identities=%d took_ms=%.1f",
            cursor,
            len(batch.identities),
            self.last_flush_seconds * 1000,
        )
        return batch

    def views_since(self, cursor: str) -> tuple[str, bool, list[tuple[str, str]]]:
        """(next cursor, full?, [(identity, version)]): what changed after ``cursor``.

        Version "" means removed. A cursor that is empty, malformed, from another epoch
        (a restarted catalog) or ahead of this one gets every identity (``full``).
        """
        epoch, _, revision = cursor.rpartition("-")
        since = int(revision) if revision.isascii() and revision.isdigit() else -1
        now = f"{self._epoch}-{self.revision}"
        if epoch != self._epoch or not 0 <= since <= self.revision:
            return now, True, sorted((str(i), v) for i, v in self.versions.items())
        changed = sorted(i for i, at in self._changed_at.items() if at > since)
        return now, False, [(i, self.versions.get(Identity.parse(i), "")) for i in changed]

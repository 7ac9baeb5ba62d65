"""The proxies the catalog knows: expected (a certificate was issued), connected, or both.

A proxy is named by its certificate's common name, which holds its identity
(``<uuid>.<service>.<namespace>``). Its service account becomes a SPIFFE id in every policy
of the mesh, so the registry keeps, per identity, its **established** account: that of its
earliest proxy still known. A later proxy under another account does not move it (a pod
with another ServiceAccount would otherwise take the service's policy with it); the
identity is listed in :meth:`Proxies.conflicts` until its proxies agree again, and that
proxy, whose own workload certificate names its own account, is refused by peers that
check the established one.

:class:`Proxies` is a read-only mapping of common name to :class:`ProxyRecord`; its
changes go through its methods, which report to two callbacks: ``changed`` when the set of
identities or their accounts moved (policies depend on them), ``onboarded`` when a proxy
was seen for the first time (its identity may need a certificate).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from trellis_catalog.domain.model.views import Identity
from trellis_common.ids import InvalidIdentifier, ProxyCommonName, validate_dns_subdomain

log = logging.getLogger(__name__)


class UnknownProxy(ValueError):
    """A malformed common name or service account, or a proxy the registry does not know."""


@dataclass
class ProxyRecord:
    common_name: str
    identity: Identity
    service_account: str
    expected: bool = False
    connected: bool = False
    proxy_cp: str = ""
    address: str = ""
    seq: int = 0  # onboarding order: the earliest proxy's account is the identity's
    not_after: float = 0.0  # its certificate's expiry (epoch seconds), when known
    serial: str = ""  # its current certificate's serial (hex), when known


def _nothing() -> None:
    return None


def _ignore(record: ProxyRecord) -> None:
    return None


class Proxies(Mapping[str, ProxyRecord]):
    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        changed: Callable[[], None] = _nothing,
        onboarded: Callable[[ProxyRecord], None] = _ignore,
    ) -> None:
        self._clock = clock
        self._changed = changed
        self._onboarded = onboarded
        self._records: dict[str, ProxyRecord] = {}
        self._seq = 0
        self._accounts: dict[Identity, str] = {}  # the established: the earliest proxy's
        #: each identity's proxies in onboarding order (``seq``): the first is the earliest
        self._by_identity: dict[Identity, dict[str, ProxyRecord]] = {}
        #: how many of each identity's proxies run under each account
        self._counts: dict[Identity, dict[str, int]] = {}
        #: the identities whose proxies run under more than one account
        self._mixed: set[Identity] = set()

    # -- the mapping -------------------------------------------------------------------

    def __getitem__(self, common_name: str) -> ProxyRecord:
        return self._records[common_name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    # -- changes -----------------------------------------------------------------------

    def expect(
        self, common_name: str, service_account: str = "", not_after: float = 0.0, serial: str = ""
    ) -> ProxyRecord:
        """A proxy certificate was issued (or rotated: ``serial`` is the current one): the
        proxy may connect with it. Raises :class:`UnknownProxy` for a malformed common name
        or service account."""
        record = self._proxy(common_name, service_account)
        record.expected = True
        if not_after:
            record.not_after = not_after
        if serial:
            record.serial = serial
        return record

    def expect_only(self, common_names: Iterable[str]) -> None:
        """Certmanager's full list of proxy certificates: any other proxy is no longer
        expected (its record was pruned or revoked), and is forgotten once disconnected."""
        keep = set(common_names)
        for record in list(self._records.values()):
            if record.expected and record.common_name not in keep:
                record.expected = False
        self.prune()

    def prune(self) -> int:
        """Forget proxies that are gone: neither connected nor expected, or whose
        certificate expired while they were disconnected. Returns how many."""
        now = self._clock()
        gone = [
            r
            for r in self._records.values()
            if not r.connected and (not r.expected or (r.not_after and r.not_after < now))
        ]
        for record in gone:
            self._forget(record)
        if gone:
            self._changed()
        return len(gone)

    def _forget(self, record: ProxyRecord) -> None:
        del self._records[record.common_name]
        same = self._by_identity[record.identity]
        del same[record.common_name]
        if not same:
            del self._by_identity[record.identity]
        self._count(record.identity, record.service_account, -1)
        self._establish(record.identity)
        log.debug("proxy.pruned proxy=%s", record.common_name)

    def register(self, common_name: str, proxy_cp: str = "", address: str = "") -> ProxyRecord:
        """The proxy connected to ``proxy_cp`` (from ``address``, when known)."""
        record = self._proxy(common_name, "")
        record.connected, record.proxy_cp, record.address = True, proxy_cp, address
        return record

    def unregister(self, common_name: str) -> ProxyRecord:
        """The proxy disconnected; it is forgotten at once unless it is still expected."""
        record = self._records.get(common_name)
        if record is None:
            raise UnknownProxy(f"no proxy {common_name!r} is known")
        record.connected = False
        if not record.expected:
            self.prune()
        return record

    # -- queries -----------------------------------------------------------------------

    def account(self, identity: Identity) -> str | None:
        """``identity``'s established account (its earliest proxy's), if it has a proxy."""
        return self._accounts.get(identity)

    def conflicts(self) -> dict[Identity, tuple[str, tuple[str, ...]]]:
        """Identities whose proxies run under more than one account: (the established
        account, the others)."""
        found = {}
        for identity in self._mixed:
            established = self._accounts[identity]
            others = tuple(sorted(a for a in self._counts[identity] if a != established))
            found[identity] = (established, others)
        return found

    def _count(self, identity: Identity, account: str, by: int) -> None:
        """``by`` more (or fewer) of ``identity``'s proxies run under ``account``."""
        counts = self._counts.setdefault(identity, {})
        counts[account] = counts.get(account, 0) + by
        if not counts[account]:
            del counts[account]
        if len(counts) > 1:
            self._mixed.add(identity)
        else:
            self._mixed.discard(identity)
            if not counts:
                del self._counts[identity]

    def _warn_conflict(self, record: ProxyRecord) -> None:
        established = self._accounts[record.identity]
        if record.service_account != established:
            log.warning(
                "proxy.account_conflict identity=%s proxy=%s account=%s established=%s "
                "action='the established account is kept: peers that check it refuse this "
                "proxy until the service's proxies run under one account'",
                record.identity,
                record.common_name,
                record.service_account,
                established,
            )

    def _establish(self, identity: Identity) -> None:
        same = self._by_identity.get(identity)
        if not same:
            self._accounts.pop(identity, None)
            return
        self._accounts[identity] = next(iter(same.values())).service_account  # the earliest

    def identities(self) -> set[Identity]:
        return set(self._by_identity)

    def accounts(self) -> dict[Identity, str]:
        """Each identity with a proxy, and its established account."""
        return dict(self._accounts)

    def _proxy(self, common_name: str, service_account: str) -> ProxyRecord:
        try:
            cn = ProxyCommonName.parse(common_name)
            if service_account:  # it becomes a SPIFFE id in every policy recompute
                validate_dns_subdomain(service_account, "service account")
        except InvalidIdentifier as exc:
            raise UnknownProxy(str(exc)) from exc
        identity = Identity(cn.namespace, cn.service)
        record = self._records.get(common_name)
        if record is None:
            self._seq += 1
            record = self._records[common_name] = ProxyRecord(
                common_name, identity, service_account or cn.service, seq=self._seq
            )
            same = self._by_identity.setdefault(identity, {})
            same[common_name] = record
            self._count(identity, record.service_account, 1)
            self._establish(identity)
            self._warn_conflict(record)
            self._changed()
            self._onboarded(record)
        elif service_account and service_account != record.service_account:
            self._count(identity, record.service_account, -1)
            self._count(identity, service_account, 1)
            record.service_account = service_account
            self._establish(identity)
            self._warn_conflict(record)
            self._changed()
        return record

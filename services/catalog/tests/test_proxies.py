"""The proxy registry alone: expected and connected proxies, accounts, pruning, callbacks."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trellis_catalog.domain.index.proxies import Proxies, ProxyRecord, UnknownProxy
from trellis_catalog.domain.model.views import Identity

SHOP_API = Identity("shop", "api")


def cn(n: int, service: str = "api", namespace: str = "shop") -> str:
    return f"00000000-0000-4000-8000-{n:012d}.{service}.{namespace}"


class Recorder:
    """The registry's two callbacks, counted."""

    def __init__(self) -> None:
        self.changed = 0
        self.onboarded: list[str] = []

    def proxies(self, now: float = 1000.0) -> Proxies:
        return Proxies(lambda: now, self.on_changed, self.on_onboarded)

    def on_changed(self) -> None:
        self.changed += 1

    def on_onboarded(self, record: ProxyRecord) -> None:
        self.onboarded.append(record.common_name)


def test_an_expected_proxy_is_onboarded_once_with_its_services_name_as_account() -> None:
    seen = Recorder()
    proxies = seen.proxies()
    record = proxies.expect(cn(1))
    assert record == ProxyRecord(cn(1), SHOP_API, "api", expected=True, seq=1)
    assert proxies.expect(cn(1)) is record  # again: nothing new
    assert (seen.changed, seen.onboarded) == (1, [cn(1)])
    assert dict(proxies) == {cn(1): record}
    assert proxies.account(SHOP_API) == "api"
    assert proxies.identities() == {SHOP_API}


@pytest.mark.parametrize(
    ("common_name", "account"),
    [("not-a-proxy-cn", ""), (cn(1), "Bad Name!")],
)
def test_a_malformed_name_or_account_is_refused_and_changes_nothing(
    common_name: str, account: str
) -> None:
    seen = Recorder()
    proxies = seen.proxies()
    with pytest.raises(UnknownProxy):
        proxies.expect(common_name, account)
    assert proxies == {}
    assert (seen.changed, seen.onboarded) == (0, [])


def test_the_earliest_proxys_account_is_kept_and_a_conflict_is_listed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen = Recorder()
    proxies = seen.proxies()
    proxies.expect(cn(1), "old")
    with caplog.at_level(logging.WARNING):
        proxies.expect(cn(2), "new")  # a pod under another ServiceAccount
    assert proxies.account(SHOP_API) == "old"  # it does not take the service with it
    assert "proxy.account_conflict identity=shop/api" in caplog.text
    assert "established=old" in caplog.text
    assert proxies.conflicts() == {SHOP_API: ("old", ("new",))}
    # the established proxy itself moves to another account: the identity follows it
    proxies.expect(cn(1), "third")
    assert proxies.account(SHOP_API) == "third"
    assert proxies.conflicts() == {SHOP_API: ("third", ("new",))}
    proxies.expect(cn(2), "third")  # they agree again
    assert proxies.conflicts() == {}
    assert seen.changed == 4
    assert proxies.accounts() == {SHOP_API: "third"}


def test_when_the_established_proxy_goes_the_next_earliest_one_decides() -> None:
    proxies = Recorder().proxies()
    proxies.expect(cn(1), "old")
    proxies.expect(cn(2), "new")
    proxies.expect_only([cn(2)])  # the first proxy's certificate is gone
    assert proxies.account(SHOP_API) == "new"
    assert proxies.conflicts() == {}


def test_a_proxy_connects_and_is_forgotten_once_neither_connected_nor_expected() -> None:
    seen = Recorder()
    proxies = seen.proxies()
    record = proxies.register(cn(1), "proxy-cp-0", "10.0.0.1")
    assert (record.connected, record.expected, record.proxy_cp, record.address) == (
        True,
        False,
        "proxy-cp-0",
        "10.0.0.1",
    )
    proxies.expect(cn(2))
    proxies.unregister(cn(2))  # still expected: kept
    assert set(proxies) == {cn(1), cn(2)}
    proxies.unregister(cn(1))  # never expected: gone at once
    assert set(proxies) == {cn(2)}
    with pytest.raises(UnknownProxy, match="no proxy"):
        proxies.unregister(cn(1))


def test_expect_only_unexpects_the_others_and_a_connected_one_stays_until_it_leaves() -> None:
    seen = Recorder()
    proxies = seen.proxies()
    proxies.expect(cn(1))
    proxies.expect(cn(2))
    proxies.expect(cn(3, "web"))
    proxies.register(cn(2))
    proxies.expect_only([cn(1)])
    assert set(proxies) == {cn(1), cn(2)}  # cn(2) is connected
    assert proxies.account(Identity("shop", "web")) is None  # its last proxy went
    assert not proxies[cn(2)].expected
    proxies.unregister(cn(2))
    assert set(proxies) == {cn(1)}
    assert proxies.account(SHOP_API) == "api"  # cn(1) is still there


def test_a_disconnected_proxy_whose_certificate_expired_is_pruned() -> None:
    seen = Recorder()
    proxies = seen.proxies(now=1000.0)
    proxies.expect(cn(1), not_after=999.0)
    proxies.expect(cn(2), not_after=2000.0)
    proxies.expect(cn(3), not_after=999.0)
    proxies.register(cn(3))
    changed = seen.changed
    assert proxies.prune() == 1
    assert set(proxies) == {cn(2), cn(3)}
    assert seen.changed == changed + 1
    assert proxies.prune() == 0
    assert seen.changed == changed + 1  # nothing gone, nothing changed


# what any sequence of changes leaves, computed from scratch from the records: the
# registry keeps it incrementally (a proxy's onboarding reads its own identity only)
OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["expect", "register", "unregister", "expect_only", "prune"]),
        st.integers(1, 6),  # the proxy
        st.sampled_from(["api", "web"]),  # its service
        st.sampled_from(["", "a", "b", "c"]),  # the account it asks for ("": keep)
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(OPERATIONS)
def test_accounts_and_conflicts_match_the_records_after_any_changes(
    operations: list[tuple[str, int, str, str]],
) -> None:
    proxies = Recorder().proxies()
    for operation, n, service, account in operations:
        name = cn(n, service)
        if operation == "expect":
            proxies.expect(name, account)
        elif operation == "register":
            proxies.register(name)
        elif operation == "unregister" and name in proxies:
            proxies.unregister(name)
        elif operation == "expect_only":
            proxies.expect_only([r for r in proxies if r != name])
        elif operation == "prune":
            proxies.prune()
        by_identity: dict[Identity, list[ProxyRecord]] = {}
        for record in proxies.values():
            by_identity.setdefault(record.identity, []).append(record)
        established = {
            identity: min(records, key=lambda r: r.seq).service_account
            for identity, records in by_identity.items()
        }
        assert proxies.accounts() == established
        others = {
            identity: tuple(sorted({r.service_account for r in records} - {established[identity]}))
            for identity, records in by_identity.items()
        }
        assert proxies.conflicts() == {
            identity: (established[identity], extra) for identity, extra in others.items() if extra
        }

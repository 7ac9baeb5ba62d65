"""The provider merge: a ServiceEntry's hosts, reported under their own keys, are one service."""

from __future__ import annotations

from trellis_catalog.domain.index.reports import ProviderReports
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_common.model import MeshService

PAYMENTS = MeshService("shop", "payments")


def host(name: str, address: str) -> ProvidedService:
    return ProvidedService(
        provider="vm",
        namespace="shop",
        name="payments",
        key=name,
        ports=(("https", 443, "HTTPS", 0),),
        endpoints=(ProvidedEndpoint(address, (("https", 443),)),),
        hosts=(name,),
        source="ServiceEntry shop/payments",
    )


def test_hosts_of_one_entry_merge_and_leave_one_by_one() -> None:
    reports = ProviderReports()
    reports.replace(
        "vm", [host("payments.example.com", "1.1.1.1"), host("pay.example.com", "2.2.2.2")]
    )

    merged = reports.of(PAYMENTS)["vm"]
    assert merged.hosts == ("pay.example.com", "payments.example.com")
    assert [e.address for e in merged.endpoints] == ["2.2.2.2", "1.1.1.1"]

    assert reports.forget(("vm", "shop", "pay.example.com")) == PAYMENTS
    assert reports.of(PAYMENTS)["vm"].hosts == ("payments.example.com",)
    reports.replace("vm", [])
    assert reports.services() == set()
    assert reports.providers() == set()

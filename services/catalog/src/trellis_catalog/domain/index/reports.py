"""What each endpoints provider reports, by service: the provider merge.

A provider reports services under its own keys: a Kubernetes-style name, or, for a
ServiceEntry, one key per host (``shop/payments.example.com``), which the catalog names
after the entry (``shop/payments``). :class:`ProviderReports` keeps every report by
``(provider, namespace, key)`` and, for each service, one merged report per provider (all
the hosts and endpoints of its keys), which is what the service index reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from trellis_catalog.domain.index.services import ProvidedService, merge_reports
from trellis_common.model import MeshService

ReportKey = tuple[str, str, str]  # provider, namespace, the provider's key


class ProviderReports:
    def __init__(self) -> None:
        self._provided: dict[ReportKey, ProvidedService] = {}
        self._merged: dict[MeshService, dict[str, ProvidedService]] = {}
        self._keys_of: dict[tuple[str, MeshService], set[ReportKey]] = {}

    def replace(self, provider: str, reports: Iterable[ProvidedService]) -> None:
        """Everything ``provider`` reports now (a full list, after it (re)connected)."""
        for key in [k for k in self._provided if k[0] == provider]:
            self.forget(key)
        for report in reports:
            self.keep(provider, report)

    def keep(self, provider: str, report: ProvidedService) -> MeshService:
        """Keep ``report``; returns the service it belongs to."""
        key = (provider, report.namespace, report.provider_key)
        self.forget(key)
        self._provided[key] = report
        self._keys_of.setdefault((provider, report.service), set()).add(key)
        self._merge(provider, report.service)
        return report.service

    def forget(self, key: ReportKey) -> MeshService | None:
        """Forget one report; returns the service it belonged to, if it was known."""
        report = self._provided.pop(key, None)
        if report is None:
            return None
        self._keys_of.get((key[0], report.service), set()).discard(key)
        self._merge(key[0], report.service)
        return report.service

    def _merge(self, provider: str, service: MeshService) -> None:
        keys = self._keys_of.get((provider, service), set())
        by_provider = self._merged.setdefault(service, {})
        if keys:
            by_provider[provider] = merge_reports([self._provided[k] for k in sorted(keys)])
            return
        self._keys_of.pop((provider, service), None)
        by_provider.pop(provider, None)
        if not by_provider:
            self._merged.pop(service, None)

    def of(self, service: MeshService) -> Mapping[str, ProvidedService]:
        """Each provider's (merged) report of ``service``."""
        return self._merged.get(service, {})

    def services(self) -> set[MeshService]:
        return set(self._merged)

    def providers(self) -> set[str]:
        return {k[0] for k in self._provided}

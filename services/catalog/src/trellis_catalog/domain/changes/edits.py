"""What an edit of the documents touches, when it is an edit of access policy alone.

TrafficTargets, HTTPRouteGroups and TCPRoutes decide who may call whom, on which routes;
nothing else reads them but policies, destinations' routes and statuses. An edit of those
alone can patch the spec (:func:`~trellis_spec.mesh.patch`) instead of building it again,
and concerns only the identities the touched targets name and the destinations of their
destination accounts: :class:`AccessEdit` says which.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trellis_catalog.domain.access.policy import PolicyBuilder
from trellis_catalog.domain.model.views import Identity
from trellis_common.documents.base import Document, DocumentKey
from trellis_common.model import MeshService, ServiceAccount
from trellis_spec import mesh as meshspec
from trellis_spec import statuses

TARGET = "TrafficTarget"
GROUP = "HTTPRouteGroup"
KINDS = meshspec.PATCHED_KINDS  # access policy: TrafficTargets and their routes


@dataclass(frozen=True, slots=True)
class AccessEdit:
    """``edited``: each edited document's old resource (None: it is new); ``current``:
    the documents after the edit."""

    edited: Mapping[DocumentKey, Any]
    current: Mapping[DocumentKey, Document]

    @property
    def of_access(self) -> bool:
        """Something was edited, and only access policy."""
        return bool(self.edited) and all(k.kind in KINDS for k in self.edited)

    def _groups(self) -> set[tuple[str, str]]:
        return {(k.namespace, k.name) for k in self.edited if k.kind == GROUP}

    def patch(
        self, spec: meshspec.MeshSpec, errors: Sequence[statuses.Status]
    ) -> dict[DocumentKey, Document | None] | None:
        """The edited documents, each new one or None, when ``spec`` can be patched rather
        than built again; else None. Not when a document error names an edited document
        (errors are laid over statuses by key), nor when an Egress names an edited
        HTTPRouteGroup (an Egress's status says whether its groups exist)."""
        if not self.of_access:
            return None
        edited = {str(k) for k in self.edited}
        if any(s.key.removesuffix(" (rejected edit)") in edited for s in errors):
            return None
        if self._groups() & spec.egress_route_groups():
            return None
        return {key: self.current.get(key) for key in self.edited}

    def _targets(self, spec: meshspec.MeshSpec) -> list[Any]:
        """The TrafficTargets (old and new versions) the edit touches: those edited, and
        those whose rules name an edited HTTPRouteGroup or TCPRoute."""
        routes = {(k.namespace, k.kind, k.name) for k in self.edited if k.kind != TARGET}
        keys = {k for k in self.edited if k.kind == TARGET} | spec.grants.naming(routes)
        found = [self.edited.get(key) for key in keys]
        found += [self.current[key].resource for key in keys if key in self.current]
        return [target for target in found if target is not None]

    def concerned(
        self, spec: meshspec.MeshSpec, by_account: Mapping[ServiceAccount, set[Identity]]
    ) -> list[Identity] | None:
        """The identities the edit concerns, or None for "all of them".

        Only the accounts the touched targets name (old and new versions) can see their
        policy change: sources gain or lose destinations, destinations gain or lose inbound
        rules. An HTTPRouteGroup that a TrafficSplit's ``matches`` names shapes the routes
        of every caller of the split's root, and one an Egress names the routes of its
        sources: their edit concerns everyone. Any other edit (Services, splits,
        ServiceEntries, MeshConfig) may move every identity's view."""
        if not self.of_access:
            return None
        if self._groups() & (spec.split_route_groups() | spec.egress_route_groups()):
            return None
        accounts: set[ServiceAccount] = set()
        for target in self._targets(spec):
            accounts.add(target.destination_account())
            accounts.update(target.source_accounts())
        return sorted({i for account in accounts for i in by_account.get(account, ())})

    def destinations(self, spec: meshspec.MeshSpec, builder: PolicyBuilder) -> set[MeshService]:
        """The services whose destination the edit may move: those running as a touched
        target's destination account (their routes are its HTTP matches), and the roots of
        the splits whose ``matches`` name an edited HTTPRouteGroup."""
        found = builder.running_as({t.destination_account() for t in self._targets(spec)})
        groups = self._groups()
        if groups:
            found.update(
                root
                for root, split in spec.splits.items()
                if any((root.namespace, m.name) in groups for m in split.spec.matches)
            )
        return found

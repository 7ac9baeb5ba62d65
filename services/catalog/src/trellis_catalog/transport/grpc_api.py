"""The ``trellis.catalog.v1.Catalog`` servicer: versioned resources, policy, proxies.

proxy-cp follows the resources on one watch (``WatchChanges(since=<its cursor>)``: an
answer after every flush that moved a resource, the moved slices and destinations inline),
and asks ``GetResources`` for the other names it holds or wants, in one call; a one-off
reader lists with ``ListChanges``. A watch answer is joined from bytes: the slices and
destinations in it are encoded once per version (:mod:`.encoded`). Every version in an answer
(a policy's, a slice's, a destination's) is a digest of its content, the same from every
catalog replica; the cursors and the ``revision`` fields are the answering replica's own
(see :mod:`trellis_catalog.catalog`). The messages are made in :mod:`.protos`.

Requests are checked first (:mod:`.grpc_requests`); a bad field is refused through the
service's :class:`~trellis_runtime.grpcrequests.RequestGate`: INVALID_ARGUMENT naming the
field, logged, counted and shown in ``/v1/status``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc

from trellis_api import catalog_pb2 as pb
from trellis_api import catalog_pb2_grpc as pb_grpc
from trellis_catalog.catalog import Catalog, UnknownProxy
from trellis_catalog.domain.access.explain import explain
from trellis_catalog.domain.model import contentversion
from trellis_catalog.domain.model.views import Identity
from trellis_catalog.domain.publish.resources import POLICY
from trellis_catalog.transport import grpc_requests
from trellis_catalog.transport.encoded import INLINE_FIELD, EncodedResources
from trellis_catalog.transport.protos import match_proto, policy_proto, to_proto
from trellis_common import messages
from trellis_runtime.grpcrequests import InvalidField, RequestGate, rpc
from trellis_runtime.health import Rejections
from trellis_spec.mesh import MeshSpec

__all__ = ["SERVICE_NAME", "CatalogServicer", "to_proto"]

Context = grpc.aio.ServicerContext[Any, Any]
#: Resources a watch answer carries inline at most; the consumer fetches the rest.
INLINE = 1000
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Catalog"].full_name


def _sidecar(spec: MeshSpec) -> pb.SidecarSettings:
    """MeshConfig's settings of every sidecar (the injector applies them to a new pod)."""
    settings = spec.settings
    if settings is None:
        return pb.SidecarSettings()
    return pb.SidecarSettings(
        log_level=settings.sidecar_log_level or "",
        inbound_port_exclusions=settings.inbound_port_exclusions,
        outbound_port_exclusions=settings.outbound_port_exclusions,
        outbound_ip_range_exclusions=settings.outbound_ip_range_exclusions,
    )


@contextlib.contextmanager
def _named_proxy() -> Iterator[None]:
    """UnknownProxy as the request's fault: the request checks should have caught the name."""
    try:
        yield
    except UnknownProxy as exc:
        raise InvalidField("common_name", str(exc)) from None


def _listing(cursor: str, full: bool, changed: list[tuple[str, str]]) -> pb.ListChangesResponse:
    return pb.ListChangesResponse(
        cursor=cursor,
        full=full,
        changes=[pb.ResourceVersion(name=n, version=v) for n, v in changed],
    )


class CatalogServicer(pb_grpc.CatalogServicer):
    def __init__(self, catalog: Catalog, rejections: Rejections | None = None) -> None:
        self._catalog = catalog
        self.gate = RequestGate(rejections)
        self._encoded = EncodedResources(catalog)

    async def ListChanges(
        self, request: pb.ListChangesRequest, context: Context
    ) -> pb.ListChangesResponse:
        await self._catalog.settled()
        cursor, full, changed = self._catalog.changes_since(grpc_requests.cursor(request))
        return _listing(cursor, full, changed)

    async def WatchChanges(  # type: ignore[override]  # serialized answers: sent as they are
        self, request: pb.ListChangesRequest, context: Context
    ) -> AsyncIterator[bytes]:
        """ListChanges' answer, then one after every flush that moved a resource (what moved
        since the answer before), with the moved slices and destinations inline; each
        answer serialized here (a ``ListChangesResponse``), from the encoded resources."""
        catalog = self._catalog
        since = grpc_requests.cursor(request)
        first = True
        while True:
            await catalog.settled()
            cursor, full, changed = catalog.changes_since(since)
            if first or changed:
                answer = _listing(cursor, full, changed).SerializeToString()
                if not full:
                    inline = (messages.field(INLINE_FIELD, r) for r in self._inline(changed))
                    answer += b"".join(inline)
                yield answer
            first, since = False, cursor
            await catalog.moved_after(cursor)

    def _inline(self, changed: list[tuple[str, str]]) -> Iterator[bytes]:
        """The moved slices and destinations that are not gone, up to :data:`INLINE`."""
        self._encoded.prune()
        sent = 0
        for name, version in changed:
            if sent == INLINE:
                return
            if version:
                found = self._encoded.get(name)
                if found is not None:
                    sent += 1
                    yield found

    @rpc(grpc_requests.resources)
    async def GetResources(
        self, asked: grpc_requests.ResourceRequest, context: Context
    ) -> pb.GetResourcesResponse:
        await self._catalog.settled()
        self._encoded.prune()
        answer = pb.GetResourcesResponse()
        for name in dict.fromkeys(asked.names):
            found = self._resource(name, asked.service_accounts)
            if found is None:
                answer.missing.append(name)
            else:
                answer.resources.append(found)
        return answer

    def _resource(self, name: str, accounts: dict[Identity, str]) -> pb.Resource | None:
        catalog = self._catalog
        kind, _, rest = name.partition("/")
        if kind == POLICY:
            identity = Identity.parse(rest)
            policy = catalog.policy_for(identity, accounts.get(identity, ""))
            version = catalog.resources.versions.get(name)
            if version is None or catalog.policies.get(identity) is not policy:
                version = contentversion.Digests().policy(policy)  # computed on demand
            return pb.Resource(
                name=name,
                version=version,
                policy=policy_proto(policy, version, catalog.revision),
            )
        encoded = self._encoded.get(name)
        return pb.Resource.FromString(encoded) if encoded is not None else None

    @rpc(grpc_requests.view)
    async def GetView(self, asked: grpc_requests.ViewRequest, context: Context) -> pb.View:
        await self._catalog.settled()
        catalog = self._catalog
        policy = catalog.policy_for(asked.identity, asked.service_account)
        return to_proto(
            policy,
            catalog.clusters,
            catalog.view_version(asked.identity),
            catalog.revision,
            self._encoded.slices,
        )

    @rpc(grpc_requests.namespace_filter)
    async def ListServices(self, namespace: str, context: Context) -> pb.ListServicesResponse:
        await self._catalog.settled()
        return pb.ListServicesResponse(
            services=[
                pb.ServiceSummary(
                    namespace=s.namespace,
                    name=s.name,
                    providers=k.providers,
                    endpoints=len(k.endpoints),
                    ports=[p.port for p in k.ports],
                    declared=k.declared,
                )
                for s, k in self._catalog.services.items()
                if not namespace or s.namespace == namespace
            ],
            revision=self._catalog.revision,
        )

    @rpc(grpc_requests.policy_question)
    async def CheckPolicy(
        self, question: grpc_requests.PolicyQuestion, context: Context
    ) -> pb.CheckPolicyResponse:
        await self._catalog.settled()
        decision = explain(self._catalog.builder(), question.source, question.destination)
        return pb.CheckPolicyResponse(
            allowed=decision.allowed,
            reason=decision.reason,
            policies=decision.policies,
            routes=[match_proto(r) for r in decision.routes],
            permissive=decision.permissive,
            conflicts=decision.conflicts,
            shaped_by=decision.shaped_by,
        )

    @rpc(grpc_requests.expected_proxy)
    async def ExpectProxy(self, asked: grpc_requests.ProxyRequest, context: Context) -> pb.ProxyAck:
        with _named_proxy():
            record = self._catalog.expect_proxy(asked.common_name, asked.service_account)
        return pb.ProxyAck(
            identity=str(record.identity), expected=True, sidecar=_sidecar(self._catalog.spec)
        )

    async def GetSidecarSettings(
        self, request: pb.GetSidecarSettingsRequest, context: Context
    ) -> pb.SidecarSettings:
        return _sidecar(self._catalog.spec)

    @rpc(grpc_requests.registered_proxy)
    async def RegisterProxy(
        self, asked: grpc_requests.ProxyRequest, context: Context
    ) -> pb.ProxyAck:
        with _named_proxy():
            record = self._catalog.register_proxy(asked.common_name, asked.proxy_cp, asked.address)
        return pb.ProxyAck(identity=str(record.identity), expected=record.expected)

    @rpc(grpc_requests.unregistered_proxy, statuses={UnknownProxy: grpc.StatusCode.NOT_FOUND})
    async def UnregisterProxy(self, common_name: str, context: Context) -> pb.ProxyAck:
        record = self._catalog.unregister_proxy(common_name)
        return pb.ProxyAck(identity=str(record.identity), expected=record.expected)

    async def ListProxies(
        self, request: pb.ListProxiesRequest, context: Context
    ) -> pb.ListProxiesResponse:
        return pb.ListProxiesResponse(
            proxies=[
                pb.ProxyStatus(
                    common_name=p.common_name,
                    identity=str(p.identity),
                    service_account=p.service_account,
                    expected=p.expected,
                    connected=p.connected,
                    participant=self._catalog.participant(p),
                    proxy_cp=p.proxy_cp,
                    serial=p.serial,
                )
                for p in sorted(self._catalog.proxies.values(), key=lambda p: p.common_name)
            ]
        )

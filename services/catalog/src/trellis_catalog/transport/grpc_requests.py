"""What each ``Catalog`` RPC accepts: checked values, or ``InvalidField``.

Identities are ``<namespace>/<service>`` (DNS labels), service accounts DNS subdomains,
proxies named by their certificate's CN ``<proxy-uuid>.<service>.<namespace>``. The
catalog builds SPIFFE ids and Envoy names from these, so a value that breaks the rules is
refused here rather than stored and met again in every recompute.
"""

from __future__ import annotations

from dataclasses import dataclass

from trellis_api import catalog_pb2 as pb
from trellis_catalog.domain.views import Identity
from trellis_common import grpcrequests as check
from trellis_common.model import MeshService, ServiceAccount

_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class ViewRequest:
    """GetView, checked: whose view, as which service account."""

    identity: Identity
    service_account: str  # "" means the account the catalog knows


@dataclass(frozen=True, slots=True)
class PolicyQuestion:
    """CheckPolicy, checked: may ``source`` call ``destination``?"""

    source: ServiceAccount
    destination: MeshService


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    """ExpectProxy or RegisterProxy, checked: the proxy's common name and what it says."""

    common_name: str
    service_account: str = ""
    proxy_cp: str = ""
    address: str = ""


def view(request: pb.GetViewRequest) -> ViewRequest:
    namespace, service = check.namespaced("identity", request.identity)
    account = check.service_account("service_account", request.service_account)
    return ViewRequest(Identity(namespace, service), account)


def view_cursor(request: pb.ListViewVersionsRequest | pb.ListDestinationsRequest) -> str:
    """The cursor to list changes after; "" (list everything) for anything not a cursor.

    A cursor is the catalog's own ``<epoch>-<revision>``, handed back as it was. One that
    is not (a consumer's bug, a cursor of some other service) is not refused: the caller
    gets the full listing, which is always a correct answer, only a larger one.
    """
    epoch, dash, revision = request.since.partition("-")
    well_formed = (
        bool(dash and epoch)
        and len(request.since) <= check.MAX_TEXT
        and all(c in _HEX for c in epoch)
        and revision.isascii()
        and revision.isdigit()
    )
    return request.since if well_formed else ""


def namespace_filter(request: pb.ListServicesRequest) -> str:
    return check.dns_label("namespace", request.namespace, optional=True)


def policy_question(request: pb.CheckPolicyRequest) -> PolicyQuestion:
    source = ServiceAccount(
        check.dns_label("source_namespace", request.source_namespace),
        check.service_account(
            "source_service_account", request.source_service_account, optional=False
        ),
    )
    destination = MeshService(
        check.dns_label("destination_namespace", request.destination_namespace),
        check.dns_label("destination_service", request.destination_service),
    )
    return PolicyQuestion(source, destination)


def expected_proxy(request: pb.ExpectProxyRequest) -> ProxyRequest:
    check.proxy_common_name("common_name", request.common_name)
    account = check.service_account("service_account", request.service_account)
    return ProxyRequest(request.common_name, service_account=account)


def registered_proxy(request: pb.RegisterProxyRequest) -> ProxyRequest:
    check.proxy_common_name("common_name", request.common_name)
    return ProxyRequest(
        request.common_name,
        proxy_cp=check.text("proxy_cp", request.proxy_cp, optional=True),
        address=check.ip_address("address", request.address, optional=True),
    )


def unregistered_proxy(request: pb.UnregisterProxyRequest) -> str:
    check.proxy_common_name("common_name", request.common_name)
    return request.common_name

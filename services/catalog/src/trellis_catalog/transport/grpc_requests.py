"""What each ``Catalog`` RPC accepts: checked values, or ``InvalidField``.

Identities are ``<namespace>/<service>`` (DNS labels), service accounts DNS subdomains,
proxies named by their certificate's CN ``<proxy-uuid>.<service>.<namespace>``. The
catalog builds SPIFFE ids and Envoy names from these, so a value that breaks the rules is
refused here rather than stored and met again in every recompute.
"""

from __future__ import annotations

from dataclasses import dataclass

from trellis_api import catalog_pb2 as pb
from trellis_catalog.domain.model.views import Identity
from trellis_common.model import MeshService, ServiceAccount
from trellis_runtime import grpcrequests as check

_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class ViewRequest:
    """GetView, checked: whose view, as which service account."""

    identity: Identity
    service_account: str  # "" means the account the catalog knows


@dataclass(frozen=True, slots=True)
class ResourceRequest:
    """GetResources, checked: the names (each of a known kind), and the accounts of
    identities the catalog may not know yet."""

    names: tuple[str, ...]
    service_accounts: dict[Identity, str]


#: The most names one GetResources may ask for.
MAX_NAMES = 10_000
_KINDS = ("policy/", "slice/", "destination/")


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


def cursor(request: pb.ListChangesRequest) -> str:
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


def resources(request: pb.GetResourcesRequest) -> ResourceRequest:
    if len(request.names) > MAX_NAMES:
        raise check.InvalidField("names", f"{len(request.names)} names; at most {MAX_NAMES}")
    for position, name in enumerate(request.names):
        check.text(f"names[{position}]", name)
        if not name.startswith(_KINDS):
            raise check.InvalidField(
                f"names[{position}]", f"{name!r} is not a policy/, slice/ or destination/ name"
            )
        if name.startswith("policy/"):
            check.namespaced(f"names[{position}]", name.removeprefix("policy/"))
        elif name.startswith("destination/"):
            check.namespaced(f"names[{position}]", name.removeprefix("destination/"))
        elif name.endswith("@"):
            raise check.InvalidField(
                f"names[{position}]", f"{name!r} names no accounts after '@' (leave it out)"
            )
    accounts: dict[Identity, str] = {}
    for identity, account in sorted(request.service_accounts.items()):
        namespace, service = check.namespaced(f"service_accounts[{identity!r}]", identity)
        accounts[Identity(namespace, service)] = check.service_account(
            f"service_accounts[{identity!r}]", account
        )
    return ResourceRequest(tuple(request.names), accounts)


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

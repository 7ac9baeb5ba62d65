"""The control plane's own identities: one per component, in one namespace.

Each service has the identity ``spiffe://<trust-domain>/ns/trellis-system/sa/<component>``
(the Kubernetes service account it runs as in the Helm chart has the component's name).
Its certificate also names the component's in-cluster DNS names, so a client checks that
the server it reached is the component it meant (``<component>.trellis-system.svc``), and
no name another component's certificate carries: certmanager puts these names in that
component's certificate only, so a name checked is the identity checked
(:mod:`trellis_identity.servercheck`). proxy-cp's alone also names ``localhost`` and the
loopback addresses, for the proxyless clients of a local run (certmanager's
``proxy_cp_extra_sans``). :func:`component_of` is the reverse: the component a peer's
SPIFFE id names, or ``None`` for anything else (a proxy, a workload, another trust domain).
"""

from __future__ import annotations

from trellis_common.ids import InvalidIdentifier, SpiffeId

CONTROL_PLANE_NAMESPACE = "trellis-system"

CERTMANAGER = "certmanager"
CATALOG = "catalog"
PROXY_CP = "proxy-cp"
INJECTOR = "injector"
ENDPOINTS_VM = "endpoints-vm"
ENDPOINTS_K8S = "endpoints-k8s"

#: Every component that may hold an identity (the registry kinds of the services).
COMPONENTS = (CERTMANAGER, CATALOG, PROXY_CP, INJECTOR, ENDPOINTS_VM, ENDPOINTS_K8S)
#: The order a mesh starts them in (``trellis up``), which listings follow: certmanager
#: first (the others join with it), the providers before the catalog that reads them, and
#: proxy-cp and the injector after the catalog they serve from.
START_ORDER = (CERTMANAGER, ENDPOINTS_VM, ENDPOINTS_K8S, CATALOG, PROXY_CP, INJECTOR)


class UnknownComponent(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"{name!r} is not a control plane component: one of {COMPONENTS}")
        self.name = name


def checked(component: str) -> str:
    if component not in COMPONENTS:
        raise UnknownComponent(component)
    return component


def of_instance(name: str) -> str:
    """The component an instance name belongs to: a component's own name, or a replica's
    ``<component>-<n>`` (``proxy-cp-2``), as ``trellis up --proxy-cp-replicas`` names them."""
    if name in COMPONENTS:
        return name
    base, _, number = name.rpartition("-")
    if number.isdigit() and base in COMPONENTS:
        return base
    raise UnknownComponent(name)


def spiffe_id(trust_domain: str, component: str) -> SpiffeId:
    return SpiffeId(trust_domain, CONTROL_PLANE_NAMESPACE, checked(component))


def server_name(component: str) -> str:
    """The name a client checks the component's certificate against."""
    return f"{checked(component)}.{CONTROL_PLANE_NAMESPACE}.svc"


def dns_names(component: str, cluster_domain: str) -> tuple[str, ...]:
    """The component's in-cluster DNS names: its own, no other component's."""
    namespaced = f"{checked(component)}.{CONTROL_PLANE_NAMESPACE}"
    return (
        component,
        namespaced,
        f"{namespaced}.svc",
        f"{namespaced}.svc.{cluster_domain}",
    )


def component_of(uri: str, trust_domain: str) -> str | None:
    """The component ``uri`` (a peer's SPIFFE id) names in ``trust_domain``, else ``None``."""
    try:
        parsed = SpiffeId.parse(uri)
    except InvalidIdentifier:
        return None
    if (
        parsed.trust_domain != trust_domain
        or parsed.namespace != CONTROL_PLANE_NAMESPACE
        or parsed.service_account not in COMPONENTS
    ):
        return None
    return parsed.service_account

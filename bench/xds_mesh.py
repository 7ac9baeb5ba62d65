"""The configuration the xDS benchmark serves: one synthetic catalog view per proxy group.

Both servers of :mod:`bench.xds` serve the same resources, built here the way proxy-cp
builds them (:func:`~trellis_proxy_cp.translate.proxy.translate`, then
:func:`~trellis_proxy_cp.cache.snapshot.make_resource` per message and
:meth:`~trellis_proxy_cp.cache.snapshot.Snapshot.of`), so their responses have the same
resources, versions and sizes.

A group is one client identity, ``bench/client-<g>``: its proxies share one snapshot. Each
view has :data:`OUTBOUND` outbound HTTP services ``mesh/svc-<j>`` (8 hostnames, one route,
one mTLS EDS cluster of :data:`ENDPOINTS` endpoints over two zones) and one inbound HTTP
port with two allow rules. Every proxy runs as an injected sidecar does, with its own
workload certificate in its pod agent's folder (:data:`SETTINGS`): ``service-cert`` names
those files (proxy-cp sends no key, and refuses a snapshot whose clusters name a secret it
lacks), and the mesh CA travels inline. This makes 21 clusters (20 EDS, 1 inbound), 20
ClusterLoadAssignments, 2 listeners, 2 route configurations and 2 secrets per snapshot
(SotW responses of 8.2, 7.9, 1.3, 5.0 and 1.1 kB).

The change the benchmark measures is :func:`view` with ``change=k``: one endpoint of
``svc-0`` moves to a new address. Every group calls ``svc-0``, so one such change touches
every group, and of each snapshot only that one ClusterLoadAssignment (so only the EDS
version) changes. proxy-cp gets it as the catalog publishes it: one slice
(:func:`changed_slices`); the groups' policies (:func:`inputs`) do not move.
"""

from __future__ import annotations

from envoy.service.discovery.v3 import discovery_pb2

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp import types
from trellis_proxy_cp.cache.inputs import Inputs, split
from trellis_proxy_cp.cache.snapshot import Resource, Snapshot, make_resource
from trellis_proxy_cp.translate.endpoints import LoadAssignments
from trellis_proxy_cp.translate.proxy import translate
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.translate.settings import ProxySettings

OUTBOUND = 20
ENDPOINTS = 10
NAMESPACE = "bench"
MESH_NAMESPACE = "mesh"
TRUST_DOMAIN = "cluster.local"
PORT = 8080
#: every benchmark proxy's settings: a sidecar whose agent keeps its certificate on disk
SETTINGS = ProxySettings(workload_dir="/etc/trellis/proxy")


def identity(group: int) -> str:
    return f"{NAMESPACE}/client-{group}"


def account(group: int) -> str:
    return f"client-{group}"


def node_id(stream: int, groups: int) -> str:
    """Stream ``i``'s node id, a proxy common name of group ``i % groups``."""
    return f"proxy-{stream}.client-{stream % groups}.{NAMESPACE}"


def group_of(node: str) -> int:
    """The group in a :func:`node_id` (``ValueError`` for anything else)."""
    service = node.split(".")[1]
    if not service.startswith("client-"):
        raise ValueError(f"not a benchmark node id: {node!r}")
    return int(service.removeprefix("client-"))


def _spiffe(namespace: str, account: str) -> str:
    return f"spiffe://{TRUST_DOMAIN}/ns/{namespace}/sa/{account}"


def _pem(kind: str, size: int) -> bytes:
    """PEM-shaped bytes of about ``size`` bytes (the content is never parsed)."""
    body = ("A" * 64 + "\n") * (size // 65)
    return f"-----BEGIN {kind}-----\n{body}-----END {kind}-----\n".encode()


def material() -> SecretMaterial:
    """A certificate chain, key and trust bundle of realistic sizes (P-256 leaf and CA)."""
    return SecretMaterial(
        cert_chain_pem=_pem("CERTIFICATE", 1400),
        key_pem=_pem("PRIVATE KEY", 240),
        trust_bundle_pem=_pem("CERTIFICATE", 700),
        serial="1",
    )


def _address(service: int, endpoint: int, change: int) -> str:
    if service == 0 and endpoint == 0 and change:
        return f"10.250.{change // 256 % 256}.{change % 256}"
    return f"10.1.{service}.{endpoint + 1}"


def view(group: int, change: int = 0) -> pb.View:
    """Group ``group``'s view; ``change`` > 0 moves one endpoint of ``svc-0`` (see module)."""
    outbound: list[pb.OutboundService] = []
    clusters: list[pb.Cluster] = []
    for j in range(OUTBOUND):
        name = f"svc-{j}"
        cluster = f"{MESH_NAMESPACE}/{name}|{PORT}"
        short = [name, f"{name}.{MESH_NAMESPACE}", f"{name}.{MESH_NAMESPACE}.svc"]
        short.append(f"{name}.{MESH_NAMESPACE}.svc.{TRUST_DOMAIN}")
        spiffe = [_spiffe(MESH_NAMESPACE, name)]
        outbound.append(
            pb.OutboundService(
                namespace=MESH_NAMESPACE,
                name=name,
                port=PORT,
                protocol="http",
                hostnames=short + [f"{h}:{PORT}" for h in short],
                routes=[
                    pb.Route(
                        name="default",
                        match=pb.HttpMatch(path_regex=".*"),
                        clusters=[pb.WeightedCluster(cluster=cluster, weight=100)],
                    )
                ],
                spiffe_ids=spiffe,
            )
        )
        clusters.append(
            pb.Cluster(
                name=cluster,
                namespace=MESH_NAMESPACE,
                service=name,
                port=PORT,
                protocol="http",
                discovery="STATIC",
                mesh_tls=True,
                spiffe_ids=spiffe,
                endpoints=[
                    pb.ClusterEndpoint(
                        address=_address(j, k, change),
                        port=PORT,
                        weight=1,
                        locality=f"eu/west-{k % 2}",
                        service_account=name,
                    )
                    for k in range(ENDPOINTS)
                ],
            )
        )
    rules = [
        pb.InboundRule(
            policy=f"{NAMESPACE}/allow-{source}",
            source_spiffe_ids=[_spiffe(MESH_NAMESPACE, source)],
            http=[pb.HttpMatch(path_regex=".*", methods=["GET", "POST"])],
        )
        for source in ("svc-1", "svc-2")
    ]
    return pb.View(
        identity=identity(group),
        namespace=NAMESPACE,
        service=account(group),
        service_account=account(group),
        spiffe_id=_spiffe(NAMESPACE, account(group)),
        version=f"c{change}",
        mesh=pb.MeshSettings(trust_domain=TRUST_DOMAIN),
        outbound=outbound,
        inbound=[pb.InboundPort(port=PORT, target_port=PORT, protocol="http", rules=rules)],
        clusters=clusters,
    )


#: shared by every group's snapshot, as one control plane shares it (ProxyControlPlane)
_ASSIGNMENTS = LoadAssignments()
#: the slice every group's policy names whose endpoints a change moves
CHANGED_SLICE = f"slice/{MESH_NAMESPACE}/svc-0|{PORT}"


def inputs(group: int, change: int = 0) -> Inputs:
    """Group ``group``'s policy and slices, as the catalog publishes them: the slices are
    named by cluster, so every group's policy names the same ones."""
    return split(view(group, change))


def changed_slices(change: int) -> dict[str, pb.ClusterSlice | None]:
    """What change ``change`` publishes: one slice, ``svc-0``'s, with one endpoint moved."""
    return {CHANGED_SLICE: inputs(0, change).slices[CHANGED_SLICE]}


def snapshot(group: int, change: int = 0) -> Snapshot:
    """What proxy-cp's core makes of :func:`view` (``ProxyControlPlane._build``)."""
    built = translate(view(group, change), SETTINGS, material(), _ASSIGNMENTS)
    resources: list[Resource] = [
        *(make_resource(types.LISTENER, m) for m in built.listeners),
        *(make_resource(types.ROUTE, m) for m in built.routes),
        *(make_resource(types.CLUSTER, m) for m in built.clusters),
        *(make_resource(types.ENDPOINT, m) for m in built.endpoints),
        *(make_resource(types.SECRET, m) for m in built.secrets),
    ]
    return Snapshot.of(f"c{change}/1", resources)


def response(snapshot: Snapshot, type_url: types.TypeUrl, nonce: str) -> bytes:
    """The serialized state-of-the-world response with every resource of one type."""
    chosen = snapshot.of_type(type_url)
    data: bytes = discovery_pb2.DiscoveryResponse(
        version_info=snapshot.version_of(type_url),
        resources=[chosen[name].any for name in sorted(chosen)],
        type_url=type_url,
        nonce=nonce,
    ).SerializeToString()
    return data

"""The Linkerd Destination API against running services, with upstream's generated client.

Redis, certmanager, endpoints-vm, catalog and proxy-cp run as processes on the bookstore
example. The client is Python generated from upstream's own protos (``dst.py``), in a
process of its own, holding a proxy certificate as ``trellis vm bootstrap`` writes it (CN
only), of ``bookbuyer``. Workloads come and go through endpoints-vm's REST API, as VM agents
do. The API answers a caller only about what its identity may reach: ``mesh`` runs the
example in permissive mode (its tests are about the answers), ``strict_mesh`` under the
example's own policy (bookbuyer may call what runs as the ``bookstore`` account).
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.dst import ClientFiles, DstClient, Endpoints, generate_upstream
from trellis_testing import RedisServer, eventually
from trellis_testing.baseline import Baseline, restored, shared_mesh
from trellis_testing.mesh import Mesh
from trellis_testing.ports import free_port

# the permissive mesh is one for the module: its tests run on one xdist worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("linkerd-destination")]

ROOT = Path(__file__).resolve().parents[2]
V1 = "bookstore-v1.bookstore.svc.cluster.local:14001"
SPIFFE = "spiffe://cluster.local/ns/bookstore/sa/bookstore"


class DstMesh(Mesh):
    def __init__(self, tmp: Path, state_dir: Path, redis: RedisServer, spec_dir: Path) -> None:
        self.dst_port = free_port()
        super().__init__(
            tmp,
            state_dir,
            redis,
            spec_dir,
            vm_spec_dir=True,  # endpoints-vm reads the ServiceEntries there
            env={
                "TRELLIS_PROXY_CP_DESTINATION_PORT": str(self.dst_port),
                "TRELLIS_PROXY_CP_DESTINATION_UPDATE_INTERVAL": "0.5",
            },
        )
        self.generated = generate_upstream(tmp / "upstream")
        self._files: ClientFiles | None = None
        self.common_name = ""  # of the clients' proxy certificate
        self.clients: list[DstClient] = []

    @property
    def files(self) -> ClientFiles:
        if self._files is None:
            certificate, key = self.proxy_certificate("bookbuyer", "bookbuyer", "bookbuyer")
            self.common_name = certificate.info.common_name
            written = self.write_files("dst-client", certificate, key)
            self._files = ClientFiles(written.cert_chain, written.key, written.trust_bundle)
        return self._files

    def forget_files(self) -> None:
        self._files = None

    def client(self, path: str, **kwargs: Any) -> DstClient:
        client = DstClient(self.generated, self.files, f"127.0.0.1:{self.dst_port}", path, **kwargs)
        self.clients.append(client)
        return client

    def workload(
        self,
        name: str,
        service: str,
        port: int,
        address: str = "127.0.0.1",
        account: str = "bookstore",
    ) -> None:
        body = {
            "namespace": "bookstore",
            "name": name,
            "services": [service],
            "address": address,
            "ports": [{"name": "http", "number": port}],
            "service_account": account,
            "ttl": 600,
        }
        response = self.processes["endpoints-vm"].post(
            "/v1/workloads", json=body, headers=self.admin()
        )
        assert response.status_code == 201, response.text

    def gone(self, name: str) -> None:
        response = self.processes["endpoints-vm"].delete(
            f"/v1/workloads/bookstore/{name}", headers=self.admin()
        )
        assert response.status_code in (200, 204), response.text

    def admin(self) -> dict[str, str]:
        token = (self.state_dir / "admin-token").read_text().strip()
        return {"Authorization": f"Bearer {token}"}

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        super().stop()


def bookstore_spec(folder: Path, permissive: bool) -> Path:
    """The bookstore example's documents, in permissive mode or under their own policy."""
    shutil.copytree(ROOT / "examples" / "bookstore", folder)
    if permissive:
        config = folder / "meshconfig.yaml"
        text = config.read_text()
        assert "enablePermissiveTrafficPolicyMode: false" in text
        config.write_text(text.replace("PolicyMode: false", "PolicyMode: true"))
    return folder


def permissive_spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bookstore_spec(tmp_path_factory.mktemp("dst-spec") / "spec", permissive=True)


class DstBaseline(Baseline):
    """The shared mesh's baseline, with what this module's tests change besides: the
    clients they opened, a proxy-cp they stopped, and proxy-cp's destination table."""

    def __init__(self, mesh: DstMesh) -> None:
        self.dst = mesh
        asyncio.run(eventually(lambda: bool(proxy_cp_table(mesh)), timeout=30, interval=0.1))
        # the tests register bookstore-v1's workloads as ``bookstore``
        super().__init__(mesh, registered=(("baseline", "bookstore-v1"),))

    def answers(self) -> dict[str, Any]:
        return {**super().answers(), "destinations": sorted(proxy_cp_table(self.dst))}

    def undo(self) -> None:
        mesh = self.dst
        for client in mesh.clients:
            client.close()
        mesh.clients.clear()
        first, *replicas = mesh.proxy_cps  # a test may have stopped them: started as it does
        if first.process is None or first.process.poll() is not None:
            first.start(ports=(0, 0))
        for replica in replicas:
            if replica.process is None or replica.process.poll() is not None:
                replica.start(ports=(mesh.xds_port, 0))
        super().undo()  # the clients' proxy files and certificate go too: made anew on use
        mesh.forget_files()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DstMesh, Baseline]]:
    """The bookstore in permissive mode, started once for the module's tests."""
    with shared_mesh(
        tmp_path_factory.mktemp("dst"), permissive_spec(tmp_path_factory), DstMesh, DstBaseline
    ) as started:
        yield started


@pytest.fixture
def mesh(shared: tuple[DstMesh, Baseline]) -> Iterator[DstMesh]:
    """The shared permissive mesh, as the module's first test found it: the client may ask
    about every service. What the test changed is undone after it."""
    yield from restored(shared)


@pytest.fixture
def strict_mesh(tmp_path: Path, redis_server: RedisServer) -> Iterator[DstMesh]:
    """The bookstore under its own policy: bookbuyer may call what runs as ``bookstore``."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    spec_dir = bookstore_spec(tmp_path / "spec", permissive=False)
    mesh = DstMesh(tmp_path, state_dir, redis_server, spec_dir)
    mesh.start()
    try:
        yield mesh
    finally:
        mesh.stop()


def test_get_follows_each_rule_of_the_seed(mesh: DstMesh) -> None:
    # a service that does not exist: no_endpoints{exists:false}, the seed's answer
    missing = mesh.client("reports.bookstore.svc.cluster.local:8080")
    assert missing.next() == {"no_endpoints": {}}  # exists=false: proto3 leaves it out
    # a declared Service with no endpoint yet: no_endpoints{exists:true}
    v1 = mesh.client(V1)
    assert v1.next() == {"no_endpoints": {"exists": True}}

    mesh.workload("v1-a", "bookstore-v1", 8081)
    added = v1.next()["add"]
    assert added["metric_labels"] == {"namespace": "bookstore", "service": "bookstore-v1"}
    [addr] = added["addrs"]
    assert addr["addr"] == {"ip": {"ipv4": 0x7F000001}, "port": 8081}
    assert addr["weight"] == 10000
    assert addr["tls_identity"] == {
        "uri_like_identity": {"uri": SPIFFE},
        "server_name": {"name": "bookstore-v1.bookstore.svc.cluster.local"},
    }
    assert addr["metric_labels"]["serviceaccount"] == "bookstore"
    assert addr["metric_labels"]["workload"] == "v1-a"
    assert addr["resource_ref"] == {
        "resource": {"kind": "Workload", "name": "v1-a", "namespace": "bookstore"}
    }

    # a stream opened on a service with endpoints starts with add, never no_endpoints
    late = mesh.client(V1)
    assert list(late.next()) == ["add"]

    # diffs: a second endpoint is one add; a removal is one remove
    state = Endpoints()
    state.apply({"add": added})
    mesh.workload("v1-b", "bookstore-v1", 8082)
    state.follow(v1, {"127.0.0.1:8081", "127.0.0.1:8082"})
    mesh.gone("v1-a")
    state.follow(v1, {"127.0.0.1:8082"})
    assert state.kinds == ["add", "add", "remove"]
    # the last endpoint going is no_endpoints{exists:true}: the service still exists
    mesh.gone("v1-b")
    assert v1.next() == {"no_endpoints": {"exists": True}}

    # a service known only from VM registrations resolves like any other, and stops
    # existing when its last workload goes
    mesh.workload("reports-1", "reports", 8080)
    assert [a["addr"]["port"] for a in missing.next()["add"]["addrs"]] == [8080]
    mesh.gone("reports-1")
    assert missing.next() == {"no_endpoints": {}}


INVALID_AUTHORITY = (
    'trellis_proxy_cp_destination_refused_total{code="INVALID_ARGUMENT",reason="invalid_authority"}'
)


def test_lookups_by_ip_and_port_and_malformed_names(mesh: DstMesh) -> None:
    refused_before = mesh.proxy_cp_counter(INVALID_AUTHORITY)
    mesh.workload("v1-a", "bookstore-v1", 8081)
    # upstream's rules: GetProfile answers an IP address, Get refuses it
    by_ip = mesh.client("127.0.0.1:8081", rpc="GetProfile")
    addr = by_ip.next()["endpoint"]
    assert addr["tls_identity"]["uri_like_identity"]["uri"] == SPIFFE
    for path, reason in (
        ("127.0.0.1:8081", "IP queries not supported by Get API"),
        ("10.255.0.1:80", "IP queries not supported by Get API"),
        ("bookstore-v1.bookstore:14001", "nor a ServiceEntry host"),  # not a full name
        ("elsewhere.example.com:443", "nor a ServiceEntry host"),
        ("Bad_Name.bookstore:80", "not a valid DNS-1123 label"),
        ("bookstore-v1.bookstore:99999", "not a number in 1..65535"),
        ("bookstore-v1", "names no namespace"),
    ):
        ended = mesh.client(path).end()
        assert ended["status"] == "INVALID_ARGUMENT", ended
        assert reason in ended["details"]
    assert mesh.proxy_cp_counter(INVALID_AUTHORITY) - refused_before == 7


SERVICE_ENTRIES = """\
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: payments, namespace: shop}
spec:
  hosts: [payments.example.com]
  ports: [{number: 443, name: https, protocol: HTTPS}]
  location: MESH_EXTERNAL
  resolution: DNS
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ledger, namespace: shop}
spec:
  hosts: [ledger.example.com]
  ports: [{number: 5432, name: tcp-pg, protocol: TCP}]
  location: MESH_EXTERNAL
  resolution: STATIC
  endpoints: [{address: 192.0.2.10}]
"""


def test_service_entries_answer_addresses_or_let_the_client_use_dns(mesh: DstMesh) -> None:
    (mesh.spec_dir / "service-entries.yaml").write_text(SERVICE_ENTRIES)
    asyncio.run(eventually(lambda: "shop/ledger" in proxy_cp_table(mesh), timeout=30, interval=0.2))
    # resolved by DNS: exists false, so a Linkerd client falls back to DNS (exists true
    # would tell it not to, and black-hole its traffic)
    assert mesh.client("payments.example.com:443").next() == {"no_endpoints": {}}
    [addr] = mesh.client("ledger.example.com:5432").next()["add"]["addrs"]
    assert addr["addr"] == {"ip": {"ipv4": 0xC000020A}, "port": 5432}
    profile = mesh.client("ledger.example.com:5432", rpc="GetProfile").next()
    # no Service of that name exists: the seed says leave them out
    assert "fully_qualified_name" not in profile
    assert "parent_ref" not in profile
    assert profile["opaque_protocol"] is True


def test_get_profile_routes_split_overrides_and_updates(mesh: DstMesh) -> None:
    profile = mesh.client("bookstore.bookstore.svc.cluster.local:14001", rpc="GetProfile")
    first = profile.next()
    assert first["fully_qualified_name"] == "bookstore.bookstore.svc.cluster.local"
    assert first["retry_budget"] == {
        "retry_ratio": pytest.approx(0.2),
        "min_retries_per_second": 10,
        "ttl": "10s",
    }
    assert [(d["authority"], d["weight"]) for d in first["dst_overrides"]] == [
        ("bookstore-v1.bookstore.svc.cluster.local:14001", 8000),
        ("bookstore-v2.bookstore.svc.cluster.local:14001", 2000),
    ]
    assert first["profile_ref"]["resource"]["kind"] == "TrafficSplit"
    routes = {r["metrics_labels"]["route"]: r for r in first["routes"]}
    assert routes["books-bought"]["condition"] == {
        "all": {
            "matches": [
                {"path": {"regex": "/books-bought"}},
                {"method": {"registered": "GET"}},
            ]
        }
    }
    assert routes["books-bought"]["response_classes"] == [
        {"condition": {"status": {"min": 500, "max": 599}}, "is_failure": True}
    ]

    # an edit of the split reaches the open stream
    split = mesh.spec_dir / "traffic-split.yaml"
    split.write_text(
        split.read_text().replace("weight: 80", "weight: 50").replace("weight: 20", "weight: 50")
    )
    updated = profile.next()
    assert [d["weight"] for d in updated["dst_overrides"]] == [5000, 5000]

    # an endpoint's own profile, asked by IP
    mesh.workload("v1-a", "bookstore-v1", 8081)
    endpoint = mesh.client("127.0.0.1:8081", rpc="GetProfile")
    answer = endpoint.next()
    assert answer["endpoint"]["addr"] == {"ip": {"ipv4": 0x7F000001}, "port": 8081}
    assert "fully_qualified_name" not in answer
    unknown = mesh.client("nothing.bookstore.svc.cluster.local:80", rpc="GetProfile").next()
    assert "fully_qualified_name" not in unknown
    assert "retry_budget" in unknown


HTTP_ROUTE = """\
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: bookstore, namespace: bookstore}
spec:
  parentRefs: [{group: "", kind: Service, name: bookstore, port: 14001}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /books}, method: GET}]
    timeouts: {request: 3s}
    backendRefs:
    - {name: bookstore-v1, port: 14001, weight: 9}
    - {name: bookstore-v2, port: 14001, weight: 1}
"""


def test_get_profile_follows_an_httproutes_rules(mesh: DstMesh) -> None:
    profile = mesh.client("bookstore.bookstore.svc.cluster.local:14001", rpc="GetProfile")
    assert profile.next()["profile_ref"]["resource"]["kind"] == "TrafficSplit"
    (mesh.spec_dir / "route.yaml").write_text(HTTP_ROUTE)
    routed = profile.next(timeout=30)
    first = routed["routes"][0]
    assert first["metrics_labels"] == {"route": "HTTPRoute bookstore/bookstore rule 0"}
    assert first["timeout"] == "3s"
    assert first["condition"] == {
        "all": {
            "matches": [
                {"path": {"regex": "/books(?:/.*)?"}},
                {"method": {"registered": "GET"}},
            ]
        }
    }
    # the route's backends take over from the TrafficSplit, as they do for Envoy
    assert [(d["authority"], d["weight"]) for d in routed["dst_overrides"]] == [
        ("bookstore-v1.bookstore.svc.cluster.local:14001", 9000),
        ("bookstore-v2.bookstore.svc.cluster.local:14001", 1000),
    ]
    assert "profile_ref" not in routed


def test_trellis_dst_prints_what_a_client_would_receive(mesh: DstMesh) -> None:
    mesh.workload("v1-a", "bookstore-v1", 8081)
    mesh.workload("v1-b", "bookstore-v1", 8082)
    client = mesh.client(V1)
    streamed = client.next()
    shown = mesh.trellis("dst", "get", V1, "--json")
    assert shown.returncode == 0, shown.stderr
    [update] = json.loads(shown.stdout)["updates"]
    assert [a["addr"]["text"] for a in update["add"]["addrs"]] == [
        "127.0.0.1:8081",
        "127.0.0.1:8082",
    ]
    for addr in update["add"]["addrs"]:
        del addr["addr"]["text"]
    assert update == streamed  # what the stream sent, field for field
    table = mesh.trellis("dst", "get", V1)
    assert "127.0.0.1:8081" in table.stdout
    assert SPIFFE in table.stdout
    profile = mesh.trellis("dst", "profile", "bookstore.bookstore.svc.cluster.local:14001")
    assert profile.returncode == 0, profile.stderr
    assert "bookstore-v1.bookstore.svc.cluster.local:14001" in profile.stdout
    assert "80.00%" in profile.stdout
    assert "books-bought" in profile.stdout
    bad = mesh.trellis("dst", "get", "no_such:1")
    assert bad.returncode != 0
    assert "not a valid DNS-1123 label" in bad.stderr


def test_the_conduit_api_sees_the_same_endpoints_and_hears_from_us_every_interval(
    mesh: DstMesh,
) -> None:
    mesh.workload("v1-a", "bookstore-v1", 8081)
    new = mesh.client(V1)
    old = mesh.client(V1, api="conduit")
    assert [a["addr"] for a in old.next()["add"]["addrs"]] == [
        a["addr"] for a in new.next()["add"]["addrs"]
    ]
    # nothing changes: the conduit stream still gets an empty add every interval (0.5 s
    # here), the new API none
    assert old.next(timeout=3) == {"add": {}}
    assert old.next(timeout=3) == {"add": {}}
    assert new.quiet(1.0)
    mesh.workload("v1-b", "bookstore-v1", 8082)
    state = Endpoints()
    state.apply({"add": {"addrs": [{"addr": {"ip": {"ipv4": 0x7F000001}, "port": 8081}}]}})
    state.follow(old, {"127.0.0.1:8081", "127.0.0.1:8082"})


def test_a_reconnecting_client_gets_the_whole_set_again(mesh: DstMesh) -> None:
    mesh.workload("v1-a", "bookstore-v1", 8081)
    mesh.workload("v1-b", "bookstore-v1", 8082)
    before = mesh.client(V1)
    state = Endpoints()
    state.follow(before, {"127.0.0.1:8081", "127.0.0.1:8082"})
    for replica in mesh.proxy_cps:  # every one: the client may be on any
        replica.stop()
    assert before.end()["status"] in ("UNAVAILABLE", "CANCELLED", "OK")
    mesh.processes["proxy-cp"].start(ports=(0, 0))
    for replica in mesh.replicas:
        replica.start(ports=(mesh.xds_port, 0))
    after = mesh.client(V1)
    first = after.next()
    assert sorted(a["addr"]["port"] for a in first["add"]["addrs"]) == [8081, 8082]


@pytest.mark.timeout(300)  # 1,000 changes through every service: 100 s on a loaded CI machine
def test_diffs_under_rapid_churn_always_rebuild_the_catalogs_set(mesh: DstMesh) -> None:
    client = mesh.client(V1)
    state = Endpoints()
    state.apply(client.next())
    rng = random.Random(15)
    live: set[int] = set()
    for change in range(1, 1001):
        port = 9000 + rng.randrange(40)
        if port in live:
            mesh.gone(f"w-{port}")
            live.discard(port)
        else:
            mesh.workload(f"w-{port}", "bookstore-v1", port)
            live.add(port)
        if change % 100 == 0:
            wanted = {f"127.0.0.1:{p}" for p in live}
            asyncio.run(eventually(lambda: catalog_set(mesh) == wanted, timeout=20))  # noqa: B023
            state.follow(client, wanted, timeout=20)
            assert set(state.addresses) == catalog_set(mesh), change
    assert state.kinds.count("remove") > 100
    assert all(not k.startswith("no_endpoints(false") for k in state.kinds)


def test_a_caller_is_answered_only_about_what_its_policy_lets_it_reach(
    strict_mesh: DstMesh,
) -> None:
    mesh = strict_mesh
    mesh.workload("v1-a", "bookstore-v1", 8081)
    mesh.workload("ledger-1", "ledger", 9090, account="ledger")  # no TrafficTarget to it

    def reaches_v1() -> bool:
        return catalog_set(mesh) == {"127.0.0.1:8081"}

    asyncio.run(eventually(reaches_v1, timeout=20, interval=0.2))
    asyncio.run(
        eventually(lambda: "bookstore/ledger" in proxy_cp_table(mesh), timeout=20, interval=0.2)
    )

    allowed = mesh.client(V1)
    Endpoints().follow(allowed, {"127.0.0.1:8081"})
    for path, rpc in (
        ("ledger.bookstore.svc.cluster.local:9090", "Get"),
        ("127.0.0.1:9090", "GetProfile"),
    ):
        refused = mesh.client(path, rpc=rpc).end()
        assert refused["status"] == "PERMISSION_DENIED", refused
        assert f"proxy {mesh.common_name} (identity bookbuyer/bookbuyer)" in refused["details"]
        assert "may not reach bookstore/ledger" in refused["details"]
    assert mesh.proxy_cp_counter(NOT_REACHABLE) == 2
    logged = f"destination.refused peer={mesh.common_name} reason=not_reachable"
    asyncio.run(eventually(lambda: logged in mesh.processes["proxy-cp"].logs()))

    # the policy goes: the open stream ends; once it is back, the caller may ask again
    access = mesh.spec_dir / "access.yaml"
    policy = access.read_text()
    access.write_text(policy.split("---")[0])  # the routes, without the TrafficTarget
    ended = allowed.end(timeout=30)
    assert ended["status"] == "PERMISSION_DENIED", ended
    assert "its access policy changed" in ended["details"]
    assert mesh.proxy_cp_counter(NOT_REACHABLE) == 3
    access.write_text(policy)
    asyncio.run(eventually(reaches_v1, timeout=30, interval=0.2))
    Endpoints().follow(mesh.client(V1), {"127.0.0.1:8081"})


NOT_REACHABLE = (
    'trellis_proxy_cp_destination_refused_total{code="PERMISSION_DENIED",reason="not_reachable"}'
)


def proxy_cp_table(mesh: DstMesh) -> list[str]:
    """The destinations proxy-cp's table holds (its admin API)."""
    listed = mesh.processes["proxy-cp"].get("/v1/destinations", headers=mesh.admin())
    names: list[str] = listed.json()["names"]
    return names


def catalog_set(mesh: DstMesh) -> set[str]:
    """The endpoints of bookstore-v1's port as the catalog has them in bookbuyer's view
    (none while the view does not reach it)."""
    asked = mesh.processes["catalog"].get("/v1/views/bookbuyer/bookbuyer", headers=mesh.admin())
    view = asked.json()
    clusters = [c for c in view.get("clusters", []) if c["name"] == "bookstore/bookstore-v1|14001"]
    return {f"{e['address']}:{e['port']}" for c in clusters for e in c.get("endpoints", [])}

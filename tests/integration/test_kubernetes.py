"""endpoints-k8s against the test API server, with the catalog taking it in unconfigured.

Everything but the cluster is real: Redis, certmanager, endpoints-k8s and the catalog as
processes; the official ``kubernetes`` client writes the objects a cluster would hold
(namespaces, Services, EndpointSlices, Pods) to the test API server
(:mod:`trellis_testing.kube`), which endpoints-k8s lists and watches through a
kubeconfig. Each test changes the cluster and waits for the catalog (or endpoints-k8s) to
show it; the watch faults are the server's (a dropped watch, a compacted history).

The services, their Redis and the API server start once for the module (the group
``kubernetes-mesh``: one xdist worker), not once per test: after each test, :func:`services`
deletes what the test stored, starts a killed endpoints-k8s again, and waits until the mesh
is back at the baseline taken at start (:func:`snapshot`). The `trellis up` test runs its own
mesh and API server (group ``fixed-ports``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.integration.k8sobjects import cart_service, endpoint_slice, pod
from trellis_common import statefile
from trellis_kube.client import api_client
from trellis_runtime import adminhttp
from trellis_testing import RedisServer, redis_backend
from trellis_testing.baseline import back_to, stored_names
from trellis_testing.kube import KubeApi
from trellis_testing.services import ServiceProcess, start_mesh, stop_together
from trellis_testing.waiting import eventually

pytestmark = pytest.mark.integration

MONITORED = {"trellis.dev/monitored-by": "trellis"}


#: The mesh and API server the tests in this group share (the `trellis up` test has its own).
SHARED = pytest.mark.xdist_group("kubernetes-mesh")
#: How long the shared mesh (or a service of it started again) may take to be ready (s).
START_TIMEOUT = 60.0
#: What the tests store in the cluster, by (group, plural): put back after each test.
WRITTEN = {"endpointslices": "discovery.k8s.io", "services": "", "pods": "", "namespaces": ""}


@pytest.fixture
def kube() -> Iterator[KubeApi]:
    """An API server of its own (the `trellis up` test's)."""
    with KubeApi() as api:
        yield api


@pytest.fixture
def core(kube: KubeApi, tmp_path: Path) -> Iterator[Any]:
    api = api_client(kube.write_kubeconfig(tmp_path / "test-kubeconfig"))
    yield client.CoreV1Api(api), client.DiscoveryV1Api(api)
    api.close()  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def mesh_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared mesh's directory: its state directory, Redis and kubeconfigs."""
    return tmp_path_factory.mktemp("kubernetes")


@pytest.fixture(scope="module")
def redis_server(mesh_dir: Path) -> Iterator[RedisServer]:
    """The shared mesh's Redis, one for the module (the shared fixture's is per test)."""
    server = redis_backend.redis_server(mesh_dir / "redis")
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def shared_kube() -> Iterator[KubeApi]:
    """The API server the shared endpoints-k8s watches, one for the module."""
    with KubeApi() as api:
        yield api


@pytest.fixture(scope="module")
def shared_core(shared_kube: KubeApi, mesh_dir: Path) -> Iterator[Any]:
    """The tests' core and discovery clients of :func:`shared_kube`."""
    api = api_client(shared_kube.write_kubeconfig(mesh_dir / "test-kubeconfig"))
    yield client.CoreV1Api(api), client.DiscoveryV1Api(api)
    api.close()  # type: ignore[no-untyped-call]


def stored(kube: KubeApi) -> dict[str, list[tuple[str, str]]]:
    """The (namespace, name) of each object of the kinds the tests write."""
    return stored_names(kube, ((group, plural) for plural, group in WRITTEN.items()))


def snapshot(processes: dict[str, ServiceProcess], kube: KubeApi) -> dict[str, Any]:
    """What the tests read: the objects stored, what endpoints-k8s lists, monitors and
    holds in its informers, and what the catalog lists, which of its loops are up (its
    watch of endpoints-k8s among them) and what it rejected."""
    provider, catalog = processes["endpoints-k8s"], processes["catalog"]
    status = provider.get("/v1/kubernetes").json()
    listed = catalog.get("/v1/services").json()
    health = catalog.get("/v1/status").json()
    return {
        "stored": stored(kube),
        "provider": provider.get("/v1/services").json()["services"],
        "monitored": status["monitored_namespaces"],
        "informers": {name: i["objects"] for name, i in status["informers"].items()},
        "catalog": {
            "providers": listed["providers"],
            "services": sorted(listed["services"], key=lambda s: (s["namespace"], s["name"])),
        },
        "catalog_loops": {loop["name"]: loop["up"] for loop in health["loops"]},
        "rejections": health.get("rejections", []),
    }


@pytest.fixture(scope="module")
def shared_mesh(
    redis_server: RedisServer, shared_kube: KubeApi, mesh_dir: Path
) -> Iterator[tuple[dict[str, ServiceProcess], dict[str, Any]]]:
    """The services, started once, and the baseline each test starts from: taken once
    the catalog watches endpoints-k8s (its provider loop is up)."""
    kubeconfig = str(shared_kube.write_kubeconfig(mesh_dir / "kubeconfig"))
    state_dir = mesh_dir / "state"
    state_dir.mkdir()
    processes = mesh_processes(state_dir, redis_server, kubeconfig)
    # one start serves the group: a slow start on a loaded machine must not fail all of it
    start_mesh(processes.values(), timeout=START_TIMEOUT)
    try:

        def settled() -> dict[str, Any]:  # empty (falsy) until settled
            now = snapshot(processes, shared_kube)
            followed = now["catalog_loops"].get("provider endpoints-k8s")
            return now if followed and all(now["catalog_loops"].values()) else {}

        baseline = asyncio.run(eventually(settled, timeout=START_TIMEOUT, message="settled"))
        yield processes, baseline
    finally:
        stop_together(reversed(list(processes.values())))


@pytest.fixture
def services(
    shared_mesh: tuple[dict[str, ServiceProcess], dict[str, Any]],
    shared_kube: KubeApi,
    shared_core: Any,
) -> Iterator[dict[str, ServiceProcess]]:
    """The shared services. After the test: a killed endpoints-k8s starts again on its
    ports, what the test stored is deleted (namespaces last; the server does not cascade),
    and the fixture waits until :func:`snapshot` is the baseline again."""
    processes, baseline = shared_mesh
    yield processes
    provider = processes["endpoints-k8s"]
    if provider.process is not None and provider.process.poll() is not None:
        provider.restart(timeout=START_TIMEOUT)
    v1, discovery = shared_core
    delete = {
        "endpointslices": discovery.delete_namespaced_endpoint_slice,
        "services": v1.delete_namespaced_service,
        "pods": v1.delete_namespaced_pod,
    }
    now = stored(shared_kube)
    for plural, remove in delete.items():
        for namespace, name in set(now[plural]) - set(baseline["stored"][plural]):
            remove(name, namespace)
    for _, name in set(now["namespaces"]) - set(baseline["stored"]["namespaces"]):
        v1.delete_namespace(name)
    back_to(baseline, lambda: snapshot(processes, shared_kube))


def mesh_processes(
    state_dir: Path, redis_server: RedisServer, kubeconfig: str
) -> dict[str, ServiceProcess]:
    return {
        "certmanager": ServiceProcess(
            "certmanager", "trellis_certmanager.main", state_dir, redis_server
        ),
        "endpoints-k8s": ServiceProcess(
            "endpoints-k8s",
            "trellis_endpoints_k8s.main",
            state_dir,
            redis_server,
            env={
                "TRELLIS_ENDPOINTS_K8S_KUBECONFIG": kubeconfig,
                "TRELLIS_ENDPOINTS_K8S_WATCH_TIMEOUT": "5",
            },
        ),
        "catalog": ServiceProcess(
            "catalog",
            "trellis_catalog.main",
            state_dir,
            redis_server,
            env={"TRELLIS_CATALOG_DISCOVERY_INTERVAL": "0.2"},
        ),
    }


def catalog_cart(catalog: ServiceProcess) -> dict[str, Any] | None:
    listed = catalog.get("/v1/services").json()["services"]
    found = [s for s in listed if (s["namespace"], s["name"]) == ("shop", "cart")]
    return found[0] if found else None


def provider_cart(provider: ServiceProcess) -> dict[str, Any] | None:
    listed = provider.get("/v1/services", params={"namespace": "shop"}).json()["services"]
    return listed[0] if listed else None


async def call(function: Any, *args: Any) -> Any:
    return await asyncio.to_thread(function, *args)


@SHARED
async def test_a_ready_slice_reaches_the_catalog_and_leaves_it_within_a_second(
    services: dict[str, ServiceProcess], shared_core: Any
) -> None:
    v1, discovery = shared_core
    provider, catalog = services["endpoints-k8s"], services["catalog"]
    await call(v1.create_namespace, {"metadata": {"name": "shop", "labels": MONITORED}})
    await call(v1.create_namespaced_service, "shop", cart_service())
    await call(v1.create_namespaced_pod, "shop", pod("cart-1", "10.1.0.1", {"version": "v1"}))
    await call(v1.create_namespaced_pod, "shop", pod("cart-2", "10.1.0.2"))
    slice_ = endpoint_slice(
        "cart-abc", [("cart-1", "10.1.0.1", True), ("cart-2", "10.1.0.2", False)]
    )
    await call(discovery.create_namespaced_endpoint_slice, "shop", slice_)

    def in_catalog() -> bool:
        found = catalog_cart(catalog)
        return found is not None and found["endpoints"] == 1

    await eventually(in_catalog, timeout=15, message="cart's ready endpoint in the catalog")
    found = catalog_cart(catalog)
    assert found is not None
    # the provider's registry name: swapped in by running it, no catalog setting
    assert found["providers"] == ["endpoints-k8s"]
    cart = provider_cart(provider)
    assert cart is not None
    [endpoint] = cart["endpoints"]  # the not-ready one is left out
    assert endpoint["address"] == "10.1.0.1"
    assert endpoint["ports"] == {"http": 8080}
    assert (endpoint["service_account"], endpoint["locality"]) == ("cart", "zone-a")
    assert endpoint["labels"] == {"app": "cart", "version": "v1"}
    assert cart["ports"] == [
        {"name": "http", "number": 80, "protocol": "http", "target_port": 8080}
    ]

    await call(discovery.delete_namespaced_endpoint_slice, "cart-abc", "shop")
    deleted = time.monotonic()
    await eventually(lambda: catalog_cart(catalog)["endpoints"] == 0, timeout=5)  # type: ignore[index]
    assert time.monotonic() - deleted < 1.0, "the issue's bar: gone from the catalog within 1 s"


@SHARED
async def test_watches_that_break_resume_and_namespaces_join_and_leave(
    services: dict[str, ServiceProcess], shared_core: Any, shared_kube: KubeApi
) -> None:
    v1, discovery = shared_core
    provider = services["endpoints-k8s"]
    await call(v1.create_namespace, {"metadata": {"name": "shop"}})  # not monitored yet
    await call(v1.create_namespaced_service, "shop", cart_service())
    await call(v1.create_namespaced_pod, "shop", pod("cart-1", "10.1.0.1"))
    await call(
        discovery.create_namespaced_endpoint_slice,
        "shop",
        endpoint_slice("cart-abc", [("cart-1", "10.1.0.1", True)]),
    )
    await eventually(
        lambda: provider.get("/v1/kubernetes").json()["informers"]["endpointslices"]["objects"] == 1
    )
    assert provider_cart(provider) is None  # its namespace is not in the mesh

    await call(v1.patch_namespace, "shop", {"metadata": {"labels": MONITORED}})
    await eventually(lambda: provider_cart(provider) is not None, timeout=10, message="joined")

    # a dropped watch resumes from its revision: the next change is not lost
    await call(shared_kube.drop_watches)
    await call(v1.create_namespaced_pod, "shop", pod("cart-2", "10.1.0.2"))
    await call(
        discovery.create_namespaced_endpoint_slice,
        "shop",
        endpoint_slice("cart-def", [("cart-2", "10.1.0.2", True)]),
    )

    def addresses() -> list[str]:
        cart = provider_cart(provider)
        return [e["address"] for e in cart["endpoints"]] if cart else []

    await eventually(lambda: addresses() == ["10.1.0.1", "10.1.0.2"], timeout=10)

    # a compacted history (410): the informers list again, and what changed meanwhile shows
    # (the counts are the shared mesh's: read before and after)
    before = provider.get("/v1/kubernetes").json()["informers"]["endpointslices"]
    await call(shared_kube.expire)
    await call(discovery.delete_namespaced_endpoint_slice, "cart-abc", "shop")
    await eventually(lambda: addresses() == ["10.1.0.2"], timeout=10, message="after 410")
    after = provider.get("/v1/kubernetes").json()["informers"]["endpointslices"]
    assert after["lists"] > before["lists"] or after["expired"] > before["expired"]

    await call(v1.patch_namespace, "shop", {"metadata": {"labels": None}})
    await eventually(lambda: provider_cart(provider) is None, timeout=10, message="left")


CLAIMED = "5f0c1c9e-8a1b-4c5d-9e2f-0123456789ab"


@SHARED
async def test_a_proxy_uuid_resolves_to_its_pod(
    services: dict[str, ServiceProcess], shared_core: Any
) -> None:
    v1, _ = shared_core
    provider = services["endpoints-k8s"]
    await call(v1.create_namespace, {"metadata": {"name": "shop", "labels": MONITORED}})
    # a label claiming another proxy's UUID is not believed: the pod's uid is its proxy's
    created = await call(
        v1.create_namespaced_pod,
        "shop",
        pod("cart-1", "10.1.0.1", {"trellis.dev/proxy-uuid": CLAIMED}),
    )
    proxy = created.metadata.uid

    def resolved() -> dict[str, Any] | None:
        answer = provider.get(f"/v1/proxies/{proxy}")
        return answer.json() if answer.status_code == 200 else None

    found = await eventually(resolved, timeout=10, message="the pod of the proxy UUID")
    assert found is not None
    assert (found["namespace"], found["pod"], found["service_account"]) == (
        "shop",
        "cart-1",
        "cart",
    )
    assert found["pod_ip"] == "10.1.0.1"
    assert provider.get("/v1/proxies/00000000-0000-4000-8000-000000000000").status_code == 404
    assert provider.get(f"/v1/proxies/{CLAIMED}").status_code == 404


@pytest.mark.timeout(300)
@pytest.mark.xdist_group("fixed-ports")  # `trellis up` binds the default ports
async def test_trellis_up_with_a_kubeconfig_runs_endpoints_k8s_for_the_catalog(
    kube: KubeApi, core: Any, tmp_path: Path
) -> None:
    v1, discovery = core
    state = tmp_path / "state"
    log = tmp_path / "up.log"
    kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
    with log.open("wb") as sink:
        up = subprocess.Popen(  # noqa: ASYNC220  # returns at once: nothing blocks
            [
                sys.executable, "-m", "trellis_cli.main", "--state-dir", str(state), "up",
                "--no-demo", "--quiet", "--kubeconfig", str(kubeconfig),
            ],
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
    try:
        await eventually(
            lambda: "Trellis is up" in log.read_text(errors="replace") or up.poll() is not None,
            timeout=180,
            message="trellis up is up",
        )
        assert up.poll() is None, log.read_text(errors="replace")
        assert "endpoints-k8s" in log.read_text(errors="replace")
        await call(v1.create_namespace, {"metadata": {"name": "shop", "labels": MONITORED}})
        await call(v1.create_namespaced_service, "shop", cart_service())
        await call(v1.create_namespaced_pod, "shop", pod("cart-1", "10.1.0.1"))
        slice_ = endpoint_slice("cart-abc", [("cart-1", "10.1.0.1", True)])
        await call(discovery.create_namespaced_endpoint_slice, "shop", slice_)

        catalog = statefile.read_endpoint(state, "catalog")
        assert catalog is not None

        def catalog_endpoints() -> int | None:
            url = catalog.admin_url + "/v1/services"
            listed = adminhttp.request(state, "catalog", "GET", url, timeout=2).json()["services"]
            found = [s for s in listed if (s["namespace"], s["name"]) == ("shop", "cart")]
            return int(found[0]["endpoints"]) if found else None

        await eventually(lambda: catalog_endpoints() == 1, timeout=30, message="in the catalog")
        await call(discovery.delete_namespaced_endpoint_slice, "cart-abc", "shop")
        deleted = time.monotonic()
        await eventually(lambda: catalog_endpoints() == 0, timeout=10, message="slice gone")
        assert time.monotonic() - deleted < 1.0, "the issue's bar: gone within a second"
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()


@SHARED
async def test_two_endpoints_k8s_replicas_serve_the_watch_and_a_death_loses_nothing(
    services: dict[str, ServiceProcess],
    shared_core: Any,
    redis_server: RedisServer,
) -> None:
    """A second endpoints-k8s on the first one's gRPC port (as the chart's pods behind one
    Service): both keep their informers warm and neither leads (there is nothing to do
    once). When the one the catalog watches is SIGKILLed, the catalog's watch lists the
    other in full, a change made after the death reaches the catalog, and the endpoints
    the catalog had are never dropped. (On the shared mesh: :func:`services` starts the
    killed replica again afterwards.)"""
    v1, discovery = shared_core
    first, catalog = services["endpoints-k8s"], services["catalog"]
    second = ServiceProcess(
        "endpoints-k8s",
        "trellis_endpoints_k8s.main",
        first.state_dir,
        redis_server,
        env=first.env,
        instance="endpoints-k8s-2",
    )
    grpc_port = int(first.endpoint.grpc_address.rsplit(":", 1)[1])
    second.spawn(ports=(grpc_port, 0))
    try:
        second.ready_or_stop()
        await call(v1.create_namespace, {"metadata": {"name": "shop", "labels": MONITORED}})
        await call(v1.create_namespaced_service, "shop", cart_service())
        await call(v1.create_namespaced_pod, "shop", pod("cart-1", "10.1.0.1"))
        slice_ = endpoint_slice("cart-abc", [("cart-1", "10.1.0.1", True)])
        await call(discovery.create_namespaced_endpoint_slice, "shop", slice_)
        await eventually(lambda: (catalog_cart(catalog) or {}).get("endpoints") == 1, timeout=15)
        await eventually(lambda: provider_cart(second) is not None, timeout=10, message="warm")
        for replica in (first, second):  # no election any more
            assert replica.get("/v1/status").json().get("leadership", []) == []

        first.kill()
        assert (catalog_cart(catalog) or {}).get("endpoints") == 1  # nothing dropped meanwhile
        await call(v1.create_namespaced_pod, "shop", pod("cart-2", "10.1.0.2"))
        both = [("cart-1", "10.1.0.1", True), ("cart-2", "10.1.0.2", True)]
        await call(
            discovery.replace_namespaced_endpoint_slice,
            "cart-abc",
            "shop",
            endpoint_slice("cart-abc", both),
        )
        await eventually(
            lambda: (catalog_cart(catalog) or {}).get("endpoints") == 2,
            timeout=20,
            message="a change made after the death, in the catalog",
        )
        assert catalog.get("/v1/status").json().get("rejections", []) == []
    finally:
        second.stop()

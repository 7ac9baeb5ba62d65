"""The catalog's Kubernetes spec source against the test API server (the real client)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes import client

from trellis_catalog.catalog import Catalog
from trellis_catalog.kubesource import MESHCONFIG_KEY, KubeSource, meshconfig_of_configmap
from trellis_catalog.sources import Sources
from trellis_common.documents.base import DocumentError, Origin
from trellis_testing.kube import KubeApi
from trellis_testing.waiting import eventually

SPLITS = ("split.smi-spec.io", "v1alpha2", "trafficsplits")
GROUPS = ("specs.smi-spec.io", "v1alpha4", "httproutegroups")
MONITORED = {"trellis.dev/monitored-by": "trellis"}


@pytest.fixture
def crds(kube: Any) -> Any:
    api, api_client = kube  # the CRDs a cluster with SMI installed serves
    api.declare("split.smi-spec.io/v1alpha2/trafficsplits", kind="TrafficSplit", namespaced=True)
    api.declare(
        "specs.smi-spec.io/v1alpha4/httproutegroups", kind="HTTPRouteGroup", namespaced=True
    )
    return api, api_client


@pytest.fixture
async def source(crds: Any) -> AsyncIterator[tuple[Catalog, KubeSource]]:
    _, api = crds
    catalog = Catalog()
    found = KubeSource(api, "trellis", "trellis-system", catalog, Sources(catalog), watch_timeout=5)
    stop = asyncio.Event()
    task = asyncio.create_task(found.run(stop))
    yield catalog, found
    stop.set()
    await asyncio.wait_for(task, 10)


def split(name: str, service: str) -> dict[str, Any]:
    return {
        "apiVersion": "split.smi-spec.io/v1alpha2",
        "kind": "TrafficSplit",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"service": service, "backends": [{"service": "cart-v1", "weight": 100}]},
    }


async def call(function: Any, *args: Any) -> Any:
    return await asyncio.to_thread(function, *args)


async def create(custom: Any, namespace: str, body: dict[str, Any]) -> None:
    group, version, plural = SPLITS
    await call(custom.create_namespaced_custom_object, group, version, namespace, plural, body)


def accepted(kube: KubeApi, name: str) -> dict[str, Any] | None:
    for obj in kube.objects("split.smi-spec.io", "trafficsplits"):
        if obj["metadata"]["name"] == name:
            for found in (obj.get("status") or {}).get("conditions") or []:
                if found["type"] == "Accepted":
                    return dict(found)
    return None


async def test_documents_of_monitored_namespaces_reach_the_catalog_with_their_status(
    kube: Any, source: Any
) -> None:
    api_server, api = kube
    catalog, kube_source = source
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    await call(core.create_namespace, {"metadata": {"name": "shop", "labels": MONITORED}})
    await call(core.create_namespace, {"metadata": {"name": "elsewhere"}})
    await call(
        custom.create_namespaced_custom_object,
        *SPLITS[:2],
        "shop",
        SPLITS[2],
        split("good", "cart"),
    )
    bad = split("bad", "Not A Name!")
    await create(custom, "shop", bad)
    other = {**split("ignored", "cart"), "metadata": {"name": "ignored", "namespace": "elsewhere"}}
    await create(custom, "elsewhere", other)

    await eventually(lambda: accepted(api_server, "bad") is not None, timeout=10)
    await eventually(lambda: accepted(api_server, "good") is not None, timeout=10)
    good, broken = accepted(api_server, "good"), accepted(api_server, "bad")
    assert good is not None
    assert broken is not None
    assert (good["status"], good["reason"], good["observedGeneration"]) == ("True", "Accepted", 1)
    assert (broken["status"], broken["reason"]) == ("False", "Invalid")
    assert "spec.service" in broken["message"]
    sources = {s.source for s in catalog.spec.statuses.values()}
    assert "k8s:split.smi-spec.io/v1alpha2/TrafficSplit/shop/good" in sources
    assert not any("elsewhere" in s for s in sources)  # not a monitored namespace
    # the HTTPRouteGroup CRD is installed but empty; other kinds' CRDs are not: absent, fine
    described = kube_source.describe()
    assert "httproutegroups.specs.smi-spec.io/v1alpha4" in described["reading"]
    assert "trafficsplits.split.smi-spec.io/v1alpha2" in described["reading"]  # the one served
    assert "TrafficTarget.access.smi-spec.io" in described["absent"]

    # a change elsewhere re-evaluates everything: an unchanged status is not written again
    await eventually(lambda: kube_source.status_writes == 2, timeout=10)
    writes = kube_source.status_writes
    revision = {o["metadata"]["name"]: o["metadata"]["resourceVersion"]
                for o in api_server.objects(*SPLITS[::2])}  # fmt: skip
    await call(
        custom.create_namespaced_custom_object,
        *SPLITS[:2],
        "shop",
        SPLITS[2],
        split("third", "cart"),
    )
    await eventually(lambda: accepted(api_server, "third") is not None, timeout=10)
    # the new split's status, and nothing else (the write is counted once the call returns)
    await eventually(lambda: kube_source.status_writes == writes + 1, timeout=10)
    after = {o["metadata"]["name"]: o["metadata"]["resourceVersion"]
             for o in api_server.objects(*SPLITS[::2])}  # fmt: skip
    assert after["good"] == revision["good"]
    assert after["bad"] == revision["bad"]

    # a spec change (generation 2) is written once more, with the new observedGeneration
    await call(
        custom.patch_namespaced_custom_object, *SPLITS[:2], "shop", SPLITS[2], "bad",
        {"spec": {"service": "cart"}},
    )  # fmt: skip
    await eventually(
        lambda: (accepted(api_server, "bad") or {}).get("status") == "True", timeout=10
    )
    fixed = accepted(api_server, "bad")
    assert fixed is not None
    assert (fixed["reason"], fixed["observedGeneration"]) == ("Accepted", 2)


def _seen_accepted(source: KubeSource, name: str) -> bool:
    """``source``'s informer holds the split ``name`` with an Accepted condition."""
    for informer in source.informers.values():
        for (_, found), obj in informer.objects.items():
            if found == name and any(
                c.get("type") == "Accepted"
                for c in (obj.get("status") or {}).get("conditions") or []
            ):
                return True
    return False


async def test_two_replicas_write_the_same_status_without_fighting(crds: Any) -> None:
    """Two catalogs (active-active) read the same objects and write the same status: an
    object is written at most once by each, and once both have seen it, neither writes it
    again (the content is the same: no write), whoever wrote it."""
    api_server, api = crds
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    await call(core.create_namespace, {"metadata": {"name": "shop", "labels": MONITORED}})
    replicas = []
    stop = asyncio.Event()
    for _ in range(2):
        catalog = Catalog()
        found = KubeSource(
            api, "trellis", "trellis-system", catalog, Sources(catalog), watch_timeout=5
        )
        replicas.append((catalog, found, asyncio.create_task(found.run(stop))))
    try:
        await create(custom, "shop", split("good", "cart"))
        await create(custom, "shop", split("bad", "Not A Name!"))
        for _, found, _ in replicas:
            for name in ("good", "bad"):
                await eventually(functools.partial(_seen_accepted, found, name), timeout=10)
        writes = [found.status_writes for _, found, _ in replicas]
        assert all(w <= 2 for w in writes)  # each object at most once per replica
        assert sum(writes) >= 2
        revision = {o["metadata"]["name"]: o["metadata"]["resourceVersion"]
                    for o in api_server.objects(*SPLITS[::2])}  # fmt: skip

        for catalog, found, _ in replicas:  # each evaluates again, as on any change
            await found.write_statuses(catalog.spec.statuses)

        assert [found.status_writes for _, found, _ in replicas] == writes
        after = {o["metadata"]["name"]: o["metadata"]["resourceVersion"]
                 for o in api_server.objects(*SPLITS[::2])}  # fmt: skip
        assert after == revision
        bad = accepted(api_server, "bad")
        assert bad is not None
        assert (bad["status"], bad["reason"]) == ("False", "Invalid")
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*(task for _, _, task in replicas)), 10)


MESH_CONFIG = """
apiVersion: config.trellis.io/v1alpha1
kind: MeshConfig
metadata:
  name: mesh
spec:
  traffic:
    enablePermissiveTrafficPolicyMode: true
"""


async def test_a_meshconfig_configmap_is_read_and_a_bad_one_named(kube: Any) -> None:
    _, api = kube
    core: Any = client.CoreV1Api(api)
    await call(core.create_namespace, {"metadata": {"name": "trellis-system"}})
    configmap = {"metadata": {"name": "trellis-mesh-config"}, "data": {MESHCONFIG_KEY: MESH_CONFIG}}
    await call(core.create_namespaced_config_map, "trellis-system", configmap)
    other = {"metadata": {"name": "unrelated"}, "data": {MESHCONFIG_KEY: "kind: Nonsense"}}
    await call(core.create_namespaced_config_map, "trellis-system", other)
    catalog = Catalog()
    found = KubeSource(
        api, "trellis", "trellis-system", catalog, Sources(catalog),
        watch_timeout=5, meshconfig_configmap="trellis-mesh-config",
    )  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(found.run(stop))
    try:
        await eventually(lambda: catalog.spec.permissive, timeout=10)
        sources = {s.source for s in catalog.spec.statuses.values()}
        assert "k8s:v1/ConfigMap/trellis-system/trellis-mesh-config" in sources
        assert not any("unrelated" in s for s in sources)  # only the named ConfigMap is read
        assert found.describe()["meshconfig_configmap"].endswith("trellis-mesh-config")

        # a broken edit: the error names the key, and the last good MeshConfig stays
        broken = {"data": {MESHCONFIG_KEY: "kind: [unclosed"}}
        await call(
            core.patch_namespaced_config_map, "trellis-mesh-config", "trellis-system", broken
        )

        def errors() -> list[str]:
            statuses = catalog.spec.statuses.values()
            return [f"{s.field}: {s.reason}" for s in statuses if s.state == "error"]

        await eventually(lambda: any("data.meshconfig.yaml" in e for e in errors()), timeout=10)
        assert catalog.spec.permissive
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_a_meshconfig_outside_the_control_planes_namespace_is_ignored_and_says_so(
    kube: Any,
) -> None:
    api_server, api = kube
    api_server.declare("config.trellis.io/v1alpha1/meshconfigs", kind="MeshConfig", namespaced=True)
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    await call(core.create_namespace, {"metadata": {"name": "shop", "labels": MONITORED}})
    await call(core.create_namespace, {"metadata": {"name": "trellis-system"}})
    tenant = {  # a namespace editor's attempt at allow-all for the whole mesh
        "apiVersion": "config.trellis.io/v1alpha1",
        "kind": "MeshConfig",
        "metadata": {"name": "aaa-mine", "namespace": "shop"},
        "spec": {"traffic": {"enablePermissiveTrafficPolicyMode": True, "enableEgress": True}},
    }
    plural = ("config.trellis.io", "v1alpha1", "shop", "meshconfigs")
    await call(custom.create_namespaced_custom_object, *plural, tenant)
    catalog = Catalog()
    found = KubeSource(api, "trellis", "trellis-system", catalog, Sources(catalog), watch_timeout=5)
    stop = asyncio.Event()
    task = asyncio.create_task(found.run(stop))
    try:
        key = "MeshConfig shop/aaa-mine"
        await eventually(lambda: key in catalog.spec.statuses, timeout=10)
        status = catalog.spec.statuses[key]
        assert status.state == "ignored"
        assert "only from the control plane's namespace 'trellis-system'" in status.reason
        assert not catalog.spec.permissive
        assert not catalog.spec.egress
        # the operator's, in the control plane's namespace, is read
        operator = {**tenant, "metadata": {"name": "mesh", "namespace": "trellis-system"}}
        operator["spec"] = {"traffic": {"enablePermissiveTrafficPolicyMode": True}}
        await call(
            custom.create_namespaced_custom_object,
            "config.trellis.io", "v1alpha1", "trellis-system", "meshconfigs", operator,
        )  # fmt: skip
        await eventually(lambda: catalog.spec.permissive, timeout=10)
        assert not catalog.spec.egress
        reason = (accepted_of(api_server, "aaa-mine") or {}).get("reason")
        assert reason == "Ignored"  # written back: kubectl shows it
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def accepted_of(api_server: KubeApi, name: str) -> dict[str, Any] | None:
    for obj in api_server.objects("config.trellis.io", "meshconfigs"):
        if obj["metadata"]["name"] == name:
            conditions = (obj.get("status") or {}).get("conditions") or []
            return next((c for c in conditions if c["type"] == "Accepted"), None)
    return None


def test_a_configmap_without_a_meshconfig_is_an_error_naming_the_key() -> None:
    origin = Origin("k8s:v1/ConfigMap/trellis-system/mesh")
    cases: dict[str, dict[str, Any]] = {
        "is missing": {"data": {}},
        "exactly one document": {"data": {MESHCONFIG_KEY: "a: 1\n---\nb: 2\n"}},
        "must be MeshConfig, got 'TrafficSplit'": {
            "data": {MESHCONFIG_KEY: "kind: TrafficSplit\napiVersion: split.smi-spec.io/v1alpha2"}
        },
    }
    for reason, obj in cases.items():
        with pytest.raises(DocumentError, match=reason) as caught:
            meshconfig_of_configmap({"metadata": {"name": "mesh"}, **obj}, origin)
        assert "data.meshconfig.yaml" in str(caught.value)
    parsed = meshconfig_of_configmap(
        {
            "metadata": {"name": "cm", "namespace": "trellis-system"},
            "data": {MESHCONFIG_KEY: MESH_CONFIG},
        },
        origin,
    )
    assert (parsed.key.kind, parsed.key.namespace, parsed.key.name) == (
        "MeshConfig", "trellis-system", "mesh",
    )  # fmt: skip


ROUTES = ("gateway.networking.k8s.io", "v1", "grpcroutes")


def route_parents(kube: KubeApi, name: str) -> list[dict[str, Any]]:
    for obj in kube.objects(ROUTES[0], ROUTES[2]):
        if obj["metadata"]["name"] == name:
            return list((obj.get("status") or {}).get("parents") or [])
    return []


async def test_a_grpc_route_gets_status_parents_and_other_controllers_entries_stay(
    crds: Any,
) -> None:
    api_server, api = crds
    api_server.declare(f"{ROUTES[0]}/v1/{ROUTES[2]}", kind="GRPCRoute", namespaced=True)
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    await call(core.create_namespace, {"metadata": {"name": "shop", "labels": MONITORED}})
    for name in ("hello", "hello-v1"):
        service = {"metadata": {"name": name}, "spec": {"ports": [{"name": "api", "port": 9000}]}}
        await call(core.create_namespaced_service, "shop", service)
    gateway_entry = {
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge"},
        "controllerName": "example.com/gateway",
        "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted"}],
    }

    def route(name: str, backend: str, parent: str = "hello") -> dict[str, Any]:
        return {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GRPCRoute",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {
                "parentRefs": [
                    {"group": "", "kind": "Service", "name": parent, "port": 9000},
                    {"name": "edge"},
                ],
                "rules": [{"backendRefs": [{"name": backend, "port": 9000}]}],
            },
            "status": {"parents": [gateway_entry]},
        }

    catalog = Catalog()
    kube_source = KubeSource(
        api, "trellis", "trellis-system", catalog, Sources(catalog), watch_timeout=5
    )
    stop = asyncio.Event()
    task = asyncio.create_task(kube_source.run(stop))
    try:
        for body in (
            route("good", "hello-v1"),
            route("missing", "nowhere"),
            route("bad", "Not A Name!"),
        ):
            await call(custom.create_namespaced_custom_object, *ROUTES[:2], "shop", ROUTES[2], body)

        def ours(name: str) -> dict[str, Any]:
            found = [p for p in route_parents(api_server, name) if "trellis" in p["controllerName"]]
            return found[0] if found else {}

        await eventually(lambda: all(ours(n) for n in ("good", "missing", "bad")), timeout=10)
        good = {c["type"]: c for c in ours("good")["conditions"]}
        assert ours("good")["parentRef"] == {
            "group": "", "kind": "Service", "namespace": "shop", "name": "hello", "port": 9000
        }  # fmt: skip
        assert (good["Accepted"]["status"], good["ResolvedRefs"]["status"]) == ("True", "True")
        missing = {c["type"]: c for c in ours("missing")["conditions"]}
        assert (missing["ResolvedRefs"]["status"], missing["ResolvedRefs"]["reason"]) == (
            "False",
            "BackendNotFound",
        )
        bad = {c["type"]: c for c in ours("bad")["conditions"]}
        assert (bad["Accepted"]["status"], bad["Accepted"]["reason"]) == (
            "False",
            "UnsupportedValue",
        )
        assert "backendRefs[0].name" in bad["Accepted"]["message"]
        for name in ("good", "missing", "bad"):  # the Gateway controller's entry is kept
            assert gateway_entry in route_parents(api_server, name)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)

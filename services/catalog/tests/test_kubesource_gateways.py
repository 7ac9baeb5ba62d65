"""The catalog's Kubernetes source and Gateway API Gateways, against the test API server
(the real ``kubernetes`` client): a GatewayClass of Trellis' controller and its Gateway get
the status the catalog resolved; another controller's class, and a ReferenceGrant, are
never written."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes import client

from trellis_catalog.catalog import Catalog
from trellis_catalog.kubesource import KubeSource, status_body
from trellis_catalog.sources import Sources
from trellis_spec.statuses import GATEWAY_CONTROLLER
from trellis_testing.kube import KubeApi
from trellis_testing.waiting import eventually

GROUP = "gateway.networking.k8s.io"
MONITORED = {"trellis.dev/monitored-by": "trellis"}
THEIRS = {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "mine"}


async def call(function: Any, *args: Any) -> Any:
    return await asyncio.to_thread(function, *args)


@pytest.fixture
async def gateways(kube: Any) -> AsyncIterator[tuple[KubeApi, Any, Catalog, KubeSource]]:
    api_server, api = kube  # a cluster with Gateway API's standard CRDs installed
    api_server.declare(f"{GROUP}/v1/gatewayclasses", kind="GatewayClass", namespaced=False)
    api_server.declare(f"{GROUP}/v1/gateways", kind="Gateway", namespaced=True)
    api_server.declare(f"{GROUP}/v1/referencegrants", kind="ReferenceGrant", namespaced=True)
    catalog = Catalog()
    source = KubeSource(
        api, "trellis", "trellis-system", catalog, Sources(catalog), watch_timeout=5
    )
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(stop))
    yield api_server, api, catalog, source
    stop.set()
    await asyncio.wait_for(task, 10)


def stored(kube: KubeApi, plural: str, name: str) -> dict[str, Any]:
    found = [o for o in kube.objects(GROUP, plural) if o["metadata"]["name"] == name]
    return found[0] if found else {}


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


async def test_a_gateway_class_of_ours_and_its_gateway_get_their_status(gateways: Any) -> None:
    api_server, api, catalog, source = gateways
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    await call(core.create_namespace, {"metadata": {"name": "shop", "labels": MONITORED}})

    def gateway_class(name: str, controller: str) -> dict[str, Any]:
        return {
            "apiVersion": f"{GROUP}/v1",
            "kind": "GatewayClass",
            "metadata": {"name": name},
            "spec": {"controllerName": controller},
        }

    for body in (
        gateway_class("trellis", GATEWAY_CONTROLLER),
        gateway_class("other", "example.com/gateway"),
    ):
        await call(custom.create_cluster_custom_object, GROUP, "v1", "gatewayclasses", body)
    # the other controller's status, written as its controller would
    await call(
        custom.patch_cluster_custom_object_status, GROUP, "v1", "gatewayclasses", "other",
        {"status": {"conditions": [THEIRS]}},
    )  # fmt: skip
    gateway = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Gateway",
        "metadata": {"name": "edge", "namespace": "shop"},
        "spec": {
            "gatewayClassName": "trellis",
            "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}],
        },
    }
    await call(custom.create_namespaced_custom_object, GROUP, "v1", "shop", "gateways", gateway)
    grant = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ReferenceGrant",
        "metadata": {"name": "from-routes", "namespace": "shop"},
        "spec": {
            "from": [{"group": GROUP, "kind": "HTTPRoute", "namespace": "web"}],
            "to": [{"group": "", "kind": "Service"}],
        },
    }
    await call(
        custom.create_namespaced_custom_object, GROUP, "v1", "shop", "referencegrants", grant
    )

    await eventually(
        lambda: "Accepted" in conditions(stored(api_server, "gatewayclasses", "trellis")),
        timeout=10,
    )
    accepted = conditions(stored(api_server, "gatewayclasses", "trellis"))["Accepted"]
    assert accepted["status"] == "True"
    assert accepted["observedGeneration"] == 1
    await eventually(
        lambda: "listeners" in (stored(api_server, "gateways", "edge").get("status") or {}),
        timeout=10,
    )
    edge = stored(api_server, "gateways", "edge")
    assert set(conditions(edge)) >= {"Accepted", "Programmed"}
    [listener] = edge["status"]["listeners"]
    assert listener["name"] == "http"
    assert {"group": GROUP, "kind": "HTTPRoute"} in listener["supportedKinds"]
    assert {c["observedGeneration"] for c in conditions(edge).values()} == {1}

    # once the source has seen its own writes come back, there is nothing more to write
    def settled() -> bool:
        by_source = {s.source: s for s in catalog.spec.statuses.values()}
        for kind in ("GatewayClass", "Gateway"):
            resource = source.active[(GROUP, kind)]
            for (namespace, name), obj in source.informers[(GROUP, kind)].objects.items():
                found = by_source.get(f"k8s:{resource.api_version}/{kind}/{namespace}/{name}")
                if found is not None and status_body(kind, found, obj) is not None:
                    return False
        return True

    await eventually(settled, timeout=10)
    assert stored(api_server, "gatewayclasses", "other")["status"] == {"conditions": [THEIRS]}
    assert "status" not in stored(api_server, "referencegrants", "from-routes")

"""The informer against the test API server, through the real ``kubernetes`` client."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from trellis_kube.client import NoKubernetes, api_client
from trellis_kube.informer import Informer, Object
from trellis_kube.namespaces import MonitoredNamespaces


def service(name: str, port: int = 80) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"ports": [{"name": "http", "port": port}]},
    }


class Running:
    """An informer run in the background, with every change it delivered."""

    def __init__(self, informer: Informer) -> None:
        self.informer = informer
        self.seen: list[tuple[str, str]] = []
        self.changed = asyncio.Event()
        informer.subscribe(self._record)
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def _record(self, kind: str, old: Object | None, new: Object | None) -> None:
        obj = new if new is not None else old
        assert obj is not None
        self.seen.append((kind, obj["metadata"]["name"]))
        self.changed.set()

    def start(self) -> None:
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.informer.run(self.stop))

    async def halt(self) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 10)

    async def until(self, check: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not check():
                self.changed.clear()
                await self.changed.wait()


@pytest.fixture
async def running(kube: Any) -> AsyncIterator[Callable[[Informer], Running]]:
    runs: list[Running] = []

    def make(informer: Informer) -> Running:
        run = Running(informer)
        run.start()
        runs.append(run)
        return run

    yield make
    for run in runs:
        await run.halt()


async def call(function: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(function, *args)


async def test_it_lists_then_follows_every_change(kube: Any, running: Any) -> None:
    _, api = kube
    core: Any = client.CoreV1Api(api)
    await call(core.create_namespaced_service, "shop", service("before"))
    informer = Informer("services", core.list_service_for_all_namespaces, watch_timeout=5)
    run = running(informer)
    await asyncio.wait_for(informer.synced.wait(), 10)
    assert set(informer.objects) == {("shop", "before")}
    await call(core.create_namespaced_service, "shop", service("cart"))
    await call(core.patch_namespaced_service, "cart", "shop", {"spec": {"ports": [{"port": 81}]}})
    await call(core.delete_namespaced_service, "before", "shop")
    await run.until(lambda: len(run.seen) == 4)
    assert run.seen == [
        ("ADDED", "before"),
        ("ADDED", "cart"),
        ("MODIFIED", "cart"),
        ("DELETED", "before"),
    ]
    assert informer.objects[("shop", "cart")]["spec"]["ports"] == [{"port": 81}]
    assert informer.stats.lists == 1


async def test_a_dropped_watch_resumes_without_a_new_list(kube: Any, running: Any) -> None:
    server, api = kube
    core: Any = client.CoreV1Api(api)
    informer = Informer("services", core.list_service_for_all_namespaces, watch_timeout=5)
    run = running(informer)
    await asyncio.wait_for(informer.synced.wait(), 10)
    await call(core.create_namespaced_service, "shop", service("cart"))
    await run.until(lambda: len(run.seen) == 1)
    await call(server.drop_watches)
    await call(core.create_namespaced_service, "shop", service("books"))
    await run.until(lambda: len(run.seen) == 2)
    assert run.seen == [("ADDED", "cart"), ("ADDED", "books")]
    assert informer.stats.lists == 1
    assert informer.stats.watches >= 2


async def test_after_410_a_new_list_delivers_what_happened_in_the_gap(
    kube: Any, running: Any
) -> None:
    server, api = kube
    core: Any = client.CoreV1Api(api)
    for name in ("gone", "changed", "kept"):
        await call(core.create_namespaced_service, "shop", service(name))
    informer = Informer("services", core.list_service_for_all_namespaces, watch_timeout=5)
    run = running(informer)
    await run.until(lambda: len(run.seen) == 3)
    await run.halt()  # as if its loop failed: the supervisor restarts it later
    await call(core.delete_namespaced_service, "gone", "shop")
    await call(core.patch_namespaced_service, "changed", "shop", {"spec": {"ports": [{"port": 1}]}})
    await call(core.create_namespaced_service, "shop", service("new"))
    await call(server.expire)
    run.start()  # resumes from its last revision, which the server no longer has
    await run.until(lambda: len(run.seen) == 6)
    assert sorted(run.seen[3:]) == [("ADDED", "new"), ("DELETED", "gone"), ("MODIFIED", "changed")]
    assert informer.stats.expired == 1
    assert set(informer.objects) == {("shop", "changed"), ("shop", "kept"), ("shop", "new")}


async def test_namespaces_join_and_leave_the_mesh_with_their_label(kube: Any, running: Any) -> None:
    _, api = kube
    core: Any = client.CoreV1Api(api)
    await call(core.create_namespace, {"metadata": {"name": "shop"}})
    await call(
        core.create_namespace,
        {"metadata": {"name": "other", "labels": {"trellis.dev/monitored-by": "another-mesh"}}},
    )
    monitored = MonitoredNamespaces(core, "trellis", watch_timeout=5)
    flips: list[tuple[str, bool]] = []
    monitored.on_change(lambda name, joined: flips.append((name, joined)))
    run = running(monitored.informer)
    await asyncio.wait_for(monitored.synced.wait(), 10)
    assert monitored.names() == set()
    label = {"metadata": {"labels": {"trellis.dev/monitored-by": "trellis"}}}
    await call(core.patch_namespace, "shop", label)
    await run.until(lambda: monitored.monitors("shop"))
    await call(core.patch_namespace, "shop", {"metadata": {"labels": {"team": "a"}}})
    await call(core.patch_namespace, "shop", {"metadata": {"labels": None}})
    await run.until(lambda: not monitored.monitors("shop"))
    assert flips == [("shop", True), ("shop", False)]
    assert not monitored.monitors("other")


async def test_a_resource_the_server_does_not_serve_fails_the_run(kube: Any) -> None:
    _, api = kube
    custom: Any = client.CustomObjectsApi(api)
    listing = functools.partial(
        custom.list_cluster_custom_object, "policy.openservicemesh.io", "v1alpha1", "retries"
    )
    informer = Informer("retries", listing)
    with pytest.raises(ApiException) as failed:
        await asyncio.wait_for(informer.run(asyncio.Event()), 10)
    assert failed.value.status == 404


def test_no_configuration_is_an_error_that_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(NoKubernetes, match="not running in a pod"):
        api_client(None)
    with pytest.raises(NoKubernetes, match="does not exist"):
        api_client(tmp_path / "missing")

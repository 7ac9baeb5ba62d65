"""The test API server keeps the promises our watchers rely on, seen through the real client."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from trellis_testing.kubeselect import Selector


def service(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "shop", "labels": labels or {}},
        "spec": {"ports": [{"name": "http", "port": 80}]},
    }


def test_create_fills_metadata_and_lists_carry_the_revision(kube: Any) -> None:
    _, api_client = kube
    core: Any = client.CoreV1Api(api_client)
    created = core.create_namespaced_service("shop", service("cart"))
    assert created.metadata.uid
    assert created.metadata.creation_timestamp
    assert created.metadata.namespace == "shop"
    first = int(created.metadata.resource_version)
    again = core.create_namespaced_service("shop", service("books"))
    assert int(again.metadata.resource_version) == first + 1
    listed = core.list_namespaced_service("shop")
    assert listed.metadata.resource_version == again.metadata.resource_version
    with pytest.raises(ApiException) as conflict:
        core.create_namespaced_service("shop", service("cart"))
    assert conflict.value.status == 409
    pod = core.create_namespaced_pod(
        "shop",
        {"metadata": {"generateName": "cart-", "namespace": "shop"},
         "spec": {"containers": [{"name": "app", "image": "cart"}]}},
    )  # fmt: skip
    assert pod.metadata.name.startswith("cart-")
    assert len(pod.metadata.name) > len("cart-")


def test_selectors_filter_lists(kube: Any) -> None:
    _, api_client = kube
    core: Any = client.CoreV1Api(api_client)
    core.create_namespaced_service("shop", service("cart", {"tier": "web"}))
    core.create_namespaced_service("shop", service("db", {"tier": "data"}))
    names = [
        s.metadata.name
        for s in core.list_namespaced_service("shop", label_selector="tier=web").items
    ]
    assert names == ["cart"]
    names = [
        s.metadata.name
        for s in core.list_namespaced_service("shop", field_selector="metadata.name=db").items
    ]
    assert names == ["db"]
    assert Selector.parse("a in (x,y),!b,c!=z").matches({"a": "y", "c": "q"})
    assert not Selector.parse("a in (x,y),!b").matches({"a": "y", "b": ""})


def test_namespaces_are_cluster_scoped(kube: Any) -> None:
    _, api_client = kube
    core: Any = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": "shop", "labels": {"team": "a"}}})
    core.patch_namespace("shop", {"metadata": {"labels": {"trellis.dev/monitored-by": "trellis"}}})
    (namespace,) = core.list_namespace(label_selector="trellis.dev/monitored-by=trellis").items
    assert namespace.metadata.labels == {"team": "a", "trellis.dev/monitored-by": "trellis"}
    assert core.read_namespace("shop").metadata.name == "shop"


def events(api_client: client.ApiClient, resource_version: str, **kwargs: Any) -> Iterator[Any]:
    core: Any = client.CoreV1Api(api_client)
    watcher: Any = watch.Watch()  # type: ignore[no-untyped-call]
    return cast(
        Iterator[Any],
        watcher.stream(
            core.list_namespaced_service,
            "shop",
            resource_version=resource_version,
            _request_timeout=(2, 5),
            **kwargs,
        ),
    )


def test_a_watch_resumes_from_its_revision_and_sees_selector_moves(kube: Any) -> None:
    _, api_client = kube
    core: Any = client.CoreV1Api(api_client)
    core.create_namespaced_service("shop", service("old", {"tier": "web"}))
    since = core.list_namespaced_service("shop").metadata.resource_version
    core.create_namespaced_service("shop", service("cart", {"tier": "web"}))
    core.patch_namespaced_service("cart", "shop", {"metadata": {"labels": {"tier": "data"}}})
    core.patch_namespaced_service("cart", "shop", {"metadata": {"labels": {"tier": "web"}}})
    core.delete_namespaced_service("cart", "shop")
    seen = []
    for event in events(api_client, since, label_selector="tier=web"):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 4:
            break
    # "old" is not replayed: it did not change after the revision the watch started from
    assert seen == [("ADDED", "cart"), ("DELETED", "cart"), ("ADDED", "cart"), ("DELETED", "cart")]


def test_a_patch_that_changes_nothing_changes_no_revision(kube: Any) -> None:
    _, api_client = kube
    core: Any = client.CoreV1Api(api_client)
    created = core.create_namespaced_service("shop", service("cart", {"tier": "web"}))
    same = core.patch_namespaced_service("cart", "shop", {"metadata": {"labels": {"tier": "web"}}})
    assert same.metadata.resource_version == created.metadata.resource_version


def test_a_dropped_watch_resumes_from_its_last_revision_without_losing_events(kube: Any) -> None:
    api, api_client = kube
    core: Any = client.CoreV1Api(api_client)
    since = core.list_namespaced_service("shop").metadata.resource_version
    seen: list[str] = []
    first = threading.Event()
    stream = events(api_client, since)

    def drain() -> None:
        for event in stream:
            seen.append(event["object"].metadata.name)
            first.set()
            if len(seen) == 2:
                return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    core.create_namespaced_service("shop", service("cart"))
    assert first.wait(5)
    api.drop_watches()
    core.create_namespaced_service("shop", service("books"))
    reader.join(5)
    assert seen == ["cart", "books"]
    assert api.watches() == 2  # the client came back on its own, from "cart"'s revision


def test_an_expired_revision_gets_410(kube: Any) -> None:
    api, api_client = kube
    core: Any = client.CoreV1Api(api_client)
    since = core.create_namespaced_service("shop", service("cart")).metadata.resource_version
    api.expire()
    with pytest.raises(ApiException) as gone:
        next(iter(events(api_client, since)))
    assert gone.value.status == 410
    # a fresh list gives a revision that watches again
    since = core.list_namespaced_service("shop").metadata.resource_version
    core.create_namespaced_service("shop", service("books"))
    event = next(iter(events(api_client, since)))
    assert (event["type"], event["object"].metadata.name) == ("ADDED", "books")


def test_status_is_its_own_subresource_and_put_checks_the_revision(kube: Any) -> None:
    api, api_client = kube
    api.declare("split.smi-spec.io/v1alpha2/trafficsplits", kind="TrafficSplit", namespaced=True)
    custom: Any = client.CustomObjectsApi(api_client)
    group, version, plural = "split.smi-spec.io", "v1alpha2", "trafficsplits"
    body = {
        "apiVersion": "split.smi-spec.io/v1alpha2",
        "kind": "TrafficSplit",
        "metadata": {"name": "split", "namespace": "shop"},
        "spec": {"service": "cart", "backends": []},
    }
    custom.create_namespaced_custom_object(group, version, "shop", plural, body)
    patched = custom.patch_namespaced_custom_object_status(
        group, version, "shop", plural, "split",
        {"status": {"conditions": [{"type": "Accepted", "status": "True"}]},
         "spec": {"service": "ignored"}},
    )  # fmt: skip
    assert patched["spec"]["service"] == "cart"
    assert patched["metadata"]["generation"] == 1
    changed = custom.patch_namespaced_custom_object(
        group, version, "shop", plural, "split", {"spec": {"service": "books"}}
    )
    assert changed["metadata"]["generation"] == 2
    stale = {**changed, "metadata": {**changed["metadata"], "resourceVersion": "1"}}
    with pytest.raises(ApiException) as conflict:
        custom.replace_namespaced_custom_object_status(
            group, version, "shop", plural, "split", stale
        )
    assert conflict.value.status == 409
    with pytest.raises(ApiException) as unknown:
        custom.list_namespaced_custom_object(
            "policy.openservicemesh.io", "v1alpha1", "shop", "retries"
        )
    assert unknown.value.status == 404

"""The injector's one write, through the real ``kubernetes`` client against the test API
server: the caBundle of the MutatingWebhookConfiguration."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from trellis_injector.kube import CaBundleSync, ca_bundle_patch
from trellis_injector.metrics import InjectorMetrics
from trellis_testing import eventually

GROUP = "admissionregistration.k8s.io"
PLURAL = "mutatingwebhookconfigurations"


def configuration(*hooks: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "trellis-injector"},
        "webhooks": list(hooks),
    }


def webhook(name: str, ca_bundle: str | None = None) -> dict[str, Any]:
    client_config: dict[str, Any] = {
        "service": {"name": "injector", "namespace": "trellis-system", "path": "/mutate"}
    }
    if ca_bundle is not None:
        client_config["caBundle"] = ca_bundle
    return {
        "name": name,
        "clientConfig": client_config,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "NoneOnDryRun",
        "failurePolicy": "Fail",
        "namespaceSelector": {"matchLabels": {"trellis.dev/monitored-by": "trellis"}},
    }


def test_the_patch_sets_only_what_differs() -> None:
    current = configuration(webhook("a.trellis.dev", "QUJD"), webhook("b.trellis.dev"))
    ops = ca_bundle_patch(current, "QUJD")
    assert ops == [
        {"op": "test", "path": "/webhooks/1/name", "value": "b.trellis.dev"},
        {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": "QUJD"},
    ]
    assert ca_bundle_patch(current | {"webhooks": []}, "QUJD") == []


async def test_the_ca_bundle_follows_the_trust_bundle(kube: Any) -> None:
    api, api_client = kube
    admission: Any = client.AdmissionregistrationV1Api(api_client)
    admission.create_mutating_webhook_configuration(
        configuration(webhook("pods.trellis.dev"), webhook("other.trellis.dev", "b2xk"))
    )
    registry = CollectorRegistry()
    bundle = [b"-----BEGIN CERTIFICATE-----\nfirst\n"]
    sync = CaBundleSync(
        api_client, "trellis-injector", lambda: bundle[0], InjectorMetrics(registry), resync=60
    )

    def bundles() -> list[str]:
        [stored] = api.objects(GROUP, PLURAL)
        return [h["clientConfig"].get("caBundle", "") for h in stored["webhooks"]]

    stop = asyncio.Event()
    task = asyncio.create_task(sync.run(stop))
    try:
        first = base64.b64encode(bundle[0]).decode()
        await eventually(lambda: bundles() == [first, first], timeout=10)
        # the CA rotated: the identity's renewal brings the new bundle, and the sync follows
        bundle[0] = b"-----BEGIN CERTIFICATE-----\nsecond\n"
        sync.renewed()
        second = base64.b64encode(bundle[0]).decode()
        await eventually(lambda: bundles() == [second, second], timeout=10)
    finally:
        stop.set()
        await task
    assert (
        registry.get_sample_value(
            "trellis_injector_ca_bundle_patches_total", {"outcome": "patched"}
        )
        or 0
    ) >= 2


async def test_a_missing_configuration_is_said_and_counted_not_a_failure(
    kube: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # a local API server, or a cluster without the chart's configuration: the injector
    # stays ready (a failure would take it out of its Service), and says why nothing changed
    _, api_client = kube
    registry = CollectorRegistry()
    sync = CaBundleSync(api_client, "nope", lambda: b"x", InjectorMetrics(registry))
    await sync.sync()
    assert (
        registry.get_sample_value(
            "trellis_injector_ca_bundle_patches_total", {"outcome": "missing"}
        )
        == 1
    )
    assert "webhook.ca_bundle_missing configuration=nope" in caplog.text

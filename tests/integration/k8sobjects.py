"""Kubernetes objects as ``test_kubernetes.py`` stores them in the test API server: the
``cart`` Service in ``shop``, its pods and their EndpointSlices."""

from __future__ import annotations

from typing import Any


def cart_service() -> dict[str, Any]:
    return {
        "metadata": {"name": "cart", "namespace": "shop"},
        "spec": {
            "clusterIP": "10.96.0.10",
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
        },
    }


def pod(name: str, ip: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "shop",
            "labels": {"app": "cart", **(labels or {})},
        },
        "spec": {"serviceAccountName": "cart", "containers": [{"name": "app", "image": "cart"}]},
        "status": {"podIP": ip},
    }


def endpoint_slice(name: str, endpoints: list[tuple[str, str, bool]]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "shop",
            "labels": {"kubernetes.io/service-name": "cart"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": [ip],
                "conditions": {"ready": ready},
                "zone": "zone-a",
                "targetRef": {"kind": "Pod", "name": pod_name, "namespace": "shop"},
            }
            for pod_name, ip, ready in endpoints
        ],
    }

"""AdmissionReviews as the API server sends them to a mutating webhook, for tests."""

from __future__ import annotations

import uuid
from typing import Any


def pod_review(
    pod: dict[str, Any], namespace: str, uid: str | None = None, **request: Any
) -> dict[str, Any]:
    """The ``admission.k8s.io/v1`` review of ``pod``'s CREATE in ``namespace``, by a
    ReplicaSet controller (``request`` overrides or adds fields: ``dryRun``, ``operation``)."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
            **request,
        },
    }

"""What a cluster shows of the chart's processes (``chartprocs``): their Pods, and the
objects of the rendering that a client of the API server reads.

The ``trellis`` CLI in cluster mode finds each component's pods by the chart's labels and
port-forwards to their ports, and reads the trust bundle, the admin token, the webhook
configuration and the CRDs from the API server. So, for each process, a Pod as the
Deployment's template would make it (its labels, its containers and their ports), Running
and Ready, and the test API server's port-forward map (``kubeportforward``) sends each of
its container ports (admin, grpc, the injector's webhook) to the free port the process
really listens on. The rendered Secrets (or the operator's, ``given``), the
MutatingWebhookConfiguration and the CRDs are created as ``helm install`` would."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from tests.deploy.helmchart import Rendered
from trellis_testing import kubeportforward
from trellis_testing.kube import KubeApi
from trellis_testing.services import ServiceProcess

NAMESPACE = "trellis-system"


def create_objects(
    api: Any, rendered: Rendered, given: Mapping[str, Mapping[str, bytes]] | None = None
) -> None:
    """The Secrets, the webhook configuration and the CRDs of the rendering."""
    core: Any = client.CoreV1Api(api)
    for secret in rendered.all("Secret"):
        core.create_namespaced_secret(NAMESPACE, secret)
    for name, data in (given or {}).items():
        encoded = {key: base64.b64encode(value).decode() for key, value in data.items()}
        body = {"metadata": {"name": name, "namespace": NAMESPACE}, "data": encoded}
        core.create_namespaced_secret(NAMESPACE, body)
    admission: Any = client.AdmissionregistrationV1Api(api)
    for webhook in rendered.all("MutatingWebhookConfiguration"):
        admission.create_mutating_webhook_configuration(webhook, _preload_content=False)
    extensions: Any = client.ApiextensionsV1Api(api)
    for crd in rendered.all("CustomResourceDefinition"):
        extensions.create_custom_resource_definition(crd, _preload_content=False)


def pod_object(rendered: Rendered, process: ServiceProcess, pod_ip: str) -> dict[str, Any]:
    template = rendered.get("Deployment", process.name)["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": process.instance,
            "namespace": NAMESPACE,
            "labels": dict(template["metadata"]["labels"]),
        },
        "spec": template["spec"],
        "status": {"phase": "Pending"},
    }


def listening_ports(process: ServiceProcess) -> dict[str, int]:
    """Container port name -> the port the process really listens on."""
    endpoint = process.endpoint
    ports = {
        "admin": int(endpoint.admin_url.rsplit(":", 1)[1]),
        "grpc": int(endpoint.grpc_address.rsplit(":", 1)[1]),
    }
    if process.name == "injector":
        address = process.get("/v1/webhook").json()["address"]
        ports["webhook"] = int(address.rsplit(":", 1)[1])
    return ports


def publish_pod(
    kube: KubeApi, api: Any, rendered: Rendered, process: ServiceProcess, pod_ip: str
) -> None:
    """The Pod of a ready process, Running and Ready, its ports forwarded to the process's."""
    core: Any = client.CoreV1Api(api)
    body = pod_object(rendered, process, pod_ip)
    core.create_namespaced_pod(NAMESPACE, body)
    real = listening_ports(process)
    for container in body["spec"]["containers"]:
        for port in container.get("ports") or []:
            if port.get("name") in real:
                kubeportforward.forward(
                    kube.server, NAMESPACE, process.instance, int(port["containerPort"]),
                    (pod_ip, real[port["name"]]),
                )  # fmt: skip
    ready = [
        {"type": kind, "status": "True"} for kind in ("Initialized", "ContainersReady", "Ready")
    ]
    status = {"phase": "Running", "podIP": pod_ip, "conditions": ready}
    core.patch_namespaced_pod_status(process.instance, NAMESPACE, {"status": status})

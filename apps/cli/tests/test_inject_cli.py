"""`trellis inject check` with a pod file, -n NS, or both, against the test API server
(through a kubeconfig, as kubectl finds one) and without any."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result
from kubernetes import client, config

from trellis_cli.main import cli
from trellis_testing.kube import KubeApi


@pytest.fixture(autouse=True)
def no_ambient_kubeconfig(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    with KubeApi() as api:
        path = api.write_kubeconfig(tmp_path / "kubeconfig")
        api_client = config.new_client_from_config(config_file=str(path))  # type: ignore[no-untyped-call]
        core: Any = client.CoreV1Api(api_client)
        core.create_namespace(
            {"metadata": {"name": "shop", "labels": {"trellis.dev/monitored-by": "trellis"}}}
        )
        core.create_namespace({"metadata": {"name": "plain"}})
        admission: Any = client.AdmissionregistrationV1Api(api_client)
        admission.create_mutating_webhook_configuration(
            {
                "metadata": {"name": "trellis-injector"},
                "webhooks": [
                    {
                        "name": "pods.trellis.dev",
                        "clientConfig": {
                            "service": {"name": "injector", "namespace": "trellis-system"},
                            "caBundle": "QUJD",
                        },
                        "admissionReviewVersions": ["v1"],
                        "sideEffects": "NoneOnDryRun",
                        "failurePolicy": "Fail",
                        "namespaceSelector": {
                            "matchLabels": {"trellis.dev/monitored-by": "trellis"}
                        },
                    }
                ],
            }
        )
        api_client.close()
        yield path


def trellis(*args: str) -> Result:
    return CliRunner().invoke(cli, ["inject", "check", *args])


def pod_file(tmp_path: Path, annotations: dict[str, str] | None = None, **extra: Any) -> Path:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop", "annotations": annotations or {}},
        "spec": {"containers": [{"name": "web", "image": "nginx"}], **extra},
    }
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    return path


def test_a_pod_in_a_monitored_namespace_would_be_injected(tmp_path: Path, kubeconfig: Path) -> None:
    done = trellis(str(pod_file(tmp_path)), "--kubeconfig", str(kubeconfig))
    assert done.exit_code == 0, done.output
    assert "pod web in namespace shop: would be injected" in done.output
    assert "labelled trellis.dev/monitored-by=trellis" in done.output
    assert "failurePolicy Fail" in done.output


def test_an_unlabelled_namespace_is_the_reason(tmp_path: Path, kubeconfig: Path) -> None:
    done = trellis(
        str(pod_file(tmp_path)), "-n", "plain", "--kubeconfig", str(kubeconfig), "--json"
    )
    assert done.exit_code == 1, done.output
    verdict = json.loads(done.output)
    assert verdict["would_inject"] is False
    checks = {c["name"]: c for c in verdict["checks"]}
    assert checks["namespace"]["ok"] is False
    assert "label it trellis.dev/monitored-by=trellis" in checks["namespace"]["detail"]
    assert checks["pod"]["ok"] is True
    assert verdict["failure_policy"] == "Fail"


def test_the_opt_out_annotation_is_the_reason(
    tmp_path: Path, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))  # found as kubectl finds it
    path = pod_file(tmp_path, {"trellis.dev/sidecar-injection": "disabled"})
    done = trellis(str(path))
    assert done.exit_code == 1
    assert "[NO ] pod: the pod is annotated trellis.dev/sidecar-injection: disabled" in done.output


def test_a_namespace_alone_and_a_missing_configuration(kubeconfig: Path) -> None:
    done = trellis("-n", "shop", "--kubeconfig", str(kubeconfig))
    assert done.exit_code == 0, done.output
    done = trellis("-n", "shop", "--kubeconfig", str(kubeconfig), "--configuration", "gone")
    assert done.exit_code == 1
    assert "MutatingWebhookConfiguration gone does not exist" in done.output


def test_a_deployment_file_is_judged_by_its_pod_template(tmp_path: Path) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "cart", "namespace": "shop"},
        "spec": {
            "template": {
                "metadata": {"annotations": {"trellis.dev/outbound-port-exclusion-list": "5432,x"}},
                "spec": {"containers": [{"name": "cart", "image": "cart"}]},
            }
        },
    }
    path = tmp_path / "deployment.yaml"
    path.write_text(yaml.safe_dump(deployment))
    done = trellis(str(path))  # no kubeconfig: the pod is judged, the namespace is not
    assert done.exit_code == 1
    assert "pod cart-* in namespace shop: would NOT be injected" in done.output
    assert "trellis.dev/outbound-port-exclusion-list" in done.output
    assert "[ ? ] namespace: not checked" in done.output


def test_no_answer_without_a_pod_or_an_api(tmp_path: Path) -> None:
    assert trellis().exit_code == 2
    done = trellis("-n", "shop")
    assert done.exit_code == 2
    assert "no Kubernetes API" in done.output
    (tmp_path / "bad.yaml").write_text("kind: Service\nmetadata: {name: x}\n")
    done = trellis(str(tmp_path / "bad.yaml"))
    assert done.exit_code == 2
    assert "not a Pod or a workload" in done.output

"""``trellis inject check``: would this pod get a sidecar, and if not, why not?

Injection that silently does not happen is the question users ask most, and the answer is
spread over three places: the namespace's label (the webhook configuration's
namespaceSelector: the API server only sends pods of matching namespaces), the webhook
configuration itself (does it exist, whom does it select, what is its failurePolicy, has
the injector set its caBundle), and the pod (its opt-out annotation, an existing ``envoy``
container, ``hostNetwork``, a bad exclusion annotation). The pod's part is judged by the
same function as the webhook's (:func:`trellis_kube.injection.decide`).

With a pod file (a Pod, or a workload whose pod template is checked), the pod is judged
and, when a Kubernetes API is reachable, its namespace and the configuration too; with
``-n NS`` alone, the namespace and the configuration. The API is found as kubectl finds it:
``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config``, else the pod's in-cluster account.
Exit 0: it would be injected; 1: it would not; 2: no answer (no pod and no API, an API
error). What could not be checked is said, never assumed.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
import yaml

from trellis_cli import errors, output
from trellis_kube import client as kube_client
from trellis_kube import injection, objects

WORKLOADS = {"Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job"}


@dataclass
class Check:
    name: str
    ok: bool | None  # None: not checked
    detail: str


@dataclass
class Verdict:
    namespace: str
    pod: str
    checks: list[Check] = field(default_factory=list)
    failure_policy: str = ""

    @property
    def would_inject(self) -> bool:
        return all(c.ok is not False for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "would_inject": self.would_inject}


def pod_template(document: dict[str, Any]) -> dict[str, Any]:
    """The pod of a Pod document, or a workload's pod template (namespace from the workload)."""
    kind = document.get("kind")
    metadata = document.get("metadata") or {}
    if kind == "Pod":
        return document
    spec = document.get("spec") or {}
    if kind == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec")) or {}
    elif kind not in WORKLOADS:
        raise errors.CliError(f"kind {kind!r} is not a Pod or a workload with a pod template")
    template = dict(spec.get("template") or {})
    template_meta = dict(template.get("metadata") or {})
    template_meta.setdefault("namespace", metadata.get("namespace"))
    template_meta.setdefault("generateName", f"{metadata.get('name', '')}-")
    return {**template, "metadata": template_meta}


def load_pod(path: Path) -> dict[str, Any]:
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    except yaml.YAMLError as exc:
        raise errors.CliError(f"{path} is not YAML: {exc}") from exc
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise errors.CliError(f"{path} must hold one Kubernetes object (found {len(documents)})")
    return pod_template(documents[0])


def find_kubeconfig(given: Path | None) -> Path | None:
    if given is not None:
        return given
    for candidate in os.environ.get("KUBECONFIG", "").split(os.pathsep):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    default = Path.home() / ".kube" / "config"
    return default if default.is_file() else None


def judge_pod(verdict: Verdict, pod: dict[str, Any]) -> None:
    decision = injection.decide(pod)
    verdict.checks.append(Check("pod", decision.inject, decision.reason))
    x = decision.exclusions
    if decision.inject and (x.inbound_ports or x.outbound_ports or x.outbound_ranges):
        parts = [
            f"inbound ports {', '.join(map(str, x.inbound_ports)) or '-'}",
            f"outbound ports {', '.join(map(str, x.outbound_ports)) or '-'}",
            f"outbound ranges {', '.join(x.outbound_ranges) or '-'}",
        ]
        verdict.checks.append(Check("exclusions", True, "; ".join(parts)))


def judge_cluster(
    verdict: Verdict, api: Any, configuration: str, mesh_name: str, pod: dict[str, Any] | None
) -> None:
    namespace = objects.read_namespace(api, verdict.namespace)
    labels = injection.labels_of(namespace) if namespace is not None else {}
    label = kube_client.MONITORED_LABEL
    if namespace is None:
        verdict.checks.append(Check("namespace", False, f"namespace {verdict.namespace} not found"))
    else:
        monitored = injection.namespace_selected(labels, label, mesh_name)
        found = labels.get(label)
        says = f"labelled {label}={found}" if found else f"not labelled {label}"
        want = "" if monitored else f" (label it {label}={mesh_name} to join the mesh)"
        verdict.checks.append(Check("namespace", monitored, f"{verdict.namespace} is {says}{want}"))
    config = objects.read_mutating_webhook_configuration(api, configuration)
    if config is None:
        verdict.checks.append(
            Check(
                "webhook",
                False,
                f"MutatingWebhookConfiguration {configuration} does not exist: the API server "
                "calls no injector (is the Helm chart installed?)",
            )
        )
        return
    hooks = [h for h in config.get("webhooks") or [] if isinstance(h, dict)]
    pod_labels = injection.labels_of(pod) if pod is not None else {}
    selecting = [
        h
        for h in hooks
        if injection.selector_matches(h.get("namespaceSelector"), labels)
        and (pod is None or injection.selector_matches(h.get("objectSelector"), pod_labels))
    ]
    policies = sorted({str(h.get("failurePolicy", "Fail")) for h in hooks})
    verdict.failure_policy = ", ".join(policies)
    no_bundle = [
        h.get("name", "?") for h in hooks if not (h.get("clientConfig") or {}).get("caBundle")
    ]
    what = "pod" if pod is not None else "namespace"
    detail = (
        f"{configuration}: {len(hooks)} webhook(s), {len(selecting)} select this {what}; "
        f"failurePolicy {verdict.failure_policy or '-'}"
        " (Fail: a pod the injector cannot serve is refused; Ignore: it runs without a sidecar)"
    )
    if no_bundle:
        detail += f"; no caBundle yet in {', '.join(no_bundle)} (the injector sets it at start)"
    verdict.checks.append(Check("webhook", bool(selecting) and not no_bundle, detail))


def show(verdict: Verdict) -> None:
    answer = "would be injected" if verdict.would_inject else "would NOT be injected"
    click.echo(f"pod {verdict.pod} in namespace {verdict.namespace}: {answer}")
    for check in verdict.checks:
        mark = {True: "ok ", False: "NO ", None: " ? "}[check.ok]
        click.echo(f"  [{mark}] {check.name}: {check.detail}")


@click.group()
def inject() -> None:
    """Sidecar injection on Kubernetes."""


@inject.command()
@click.argument("pod_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-n", "--namespace", help="The namespace (default: the pod's, else 'default').")
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Default: $KUBECONFIG, ~/.kube/config, else in-cluster.",
)
@click.option(
    "--configuration",
    default=injection.WEBHOOK_CONFIGURATION,
    show_default=True,
    help="The MutatingWebhookConfiguration's name.",
)
@click.option("--mesh-name", default=kube_client.DEFAULT_MESH_NAME, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def check(
    pod_file: Path | None,
    namespace: str | None,
    kubeconfig: Path | None,
    configuration: str,
    mesh_name: str,
    as_json: bool,
) -> None:
    """Say whether a pod (POD_FILE) or the pods of a namespace (-n NS) would get a sidecar,
    and why: the namespace's label, the webhook configuration and its failure policy, the
    pod's annotations and containers. Exit 0 yes, 1 no, 2 no answer."""
    if pod_file is None and namespace is None:
        raise click.UsageError("give a pod file, or -n NAMESPACE, or both")
    pod = load_pod(pod_file) if pod_file is not None else None
    pod_meta = (pod or {}).get("metadata") or {}
    ns = namespace or pod_meta.get("namespace") or "default"
    name = pod_meta.get("name") or f"{pod_meta.get('generateName') or ''}*"
    verdict = Verdict(namespace=ns, pod=name)
    if pod is not None:
        judge_pod(verdict, pod)
    path = find_kubeconfig(kubeconfig)
    if path is None and not kube_client.in_cluster():
        if pod is None:
            raise errors.CliError(
                "no Kubernetes API to ask about the namespace: no --kubeconfig, $KUBECONFIG "
                "or ~/.kube/config, and not in a pod"
            )
        verdict.checks.append(
            Check("namespace", None, "not checked: no kubeconfig (the label decides first)")
        )
    else:
        try:
            api = kube_client.api_client(path)
            with api:
                judge_cluster(verdict, api, configuration, mesh_name, pod)
        except kube_client.NoKubernetes as exc:
            raise errors.CliError(str(exc)) from exc
        except objects.ApiError as exc:
            raise errors.CliError(f"the Kubernetes API did not answer: {exc}") from exc
    if as_json:
        output.emit_json(verdict.as_dict())
    else:
        show(verdict)
    if not verdict.would_inject:
        raise SystemExit(errors.NEGATIVE)

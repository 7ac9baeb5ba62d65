"""``trellis check``: is the control plane whole? As ``linkerd check`` asks it.

One line per check, each ``ok``, ``warn`` or ``FAIL`` with what was found; exit 1 when any
fails (a warning does not). In a cluster (:mod:`trellis_cli.cluster`):

* the API server answers, and its version;
* the CRDs the chart ships (Trellis', OSM's, SMI's) exist and serve the versions the chart
  installs; Gateway API's and Istio's, prerequisites the chart does not install by
  default, only warn when absent;
* every pod of every component is ready (its own ``/readyz``, through a port-forward);
* the injector's MutatingWebhookConfiguration exists and its ``caBundle`` verifies the
  certificate the webhook serves (a TLS handshake through a port-forward, with the name the
  API server checks: ``<service>.<namespace>.svc``);
* the root certificates (the trust bundle) and the certificate that issues (the one that
  signed certmanager's own) are not expired, warned under 30 days;
* Redis is reachable: the components' readiness says so (the CLI cannot reach Redis);
* a proxy's configuration is ACKed, when a proxy is connected.

``--pre``, before ``helm install``: the API server, the namespace absent or free of
Trellis, and no CRD of the chart's groups at versions the chart cannot serve. Locally, the
checks that apply to a local mesh run (components, certificates, Redis, proxies).
"""

from __future__ import annotations

import datetime as dt
import socket
import ssl
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import click
import httpx

from trellis_cli import output
from trellis_cli.client import Mesh
from trellis_cli.errors import NEGATIVE, CliError
from trellis_common import components
from trellis_runtime import adminhttp

if TYPE_CHECKING:
    from trellis_cli.cluster import Cluster, ClusterMesh
    from trellis_cli.main import MeshOnDemand

Status = Literal["ok", "warn", "fail"]
#: Certificates closer than this to expiry are a warning.
EXPIRY_WARNING = dt.timedelta(days=30)

#: The CRDs the chart ships (files/crds/trellis) and the version it stores: they must be
#: served. (A deploy test checks this list against the chart.)
CHART_CRDS = {
    "egresses.policy.openservicemesh.io": "v1alpha1",
    "httproutegroups.specs.smi-spec.io": "v1alpha4",
    "ingressbackends.policy.openservicemesh.io": "v1alpha1",
    "meshconfigs.config.openservicemesh.io": "v1alpha2",
    "meshconfigs.config.trellis.io": "v1alpha1",
    "retries.policy.openservicemesh.io": "v1alpha1",
    "tcproutes.specs.smi-spec.io": "v1alpha4",
    "trafficsplits.split.smi-spec.io": "v1alpha4",
    "traffictargets.access.smi-spec.io": "v1alpha3",
    "upstreamtrafficsettings.policy.openservicemesh.io": "v1alpha1",
}
#: Other projects' CRDs the catalog reads, installed by their own projects (or on opt-in).
PREREQUISITE_CRDS = {
    "httproutes.gateway.networking.k8s.io": "v1",
    "grpcroutes.gateway.networking.k8s.io": "v1",
    "gatewayclasses.gateway.networking.k8s.io": "v1",
    "gateways.gateway.networking.k8s.io": "v1",
    "referencegrants.gateway.networking.k8s.io": "v1",
    "tlsroutes.gateway.networking.k8s.io": "v1",
    "serviceentries.networking.istio.io": "v1",
}


@dataclass(frozen=True)
class Result:
    check: str
    status: Status
    detail: str


def _mark(result: Result) -> str:
    return {"ok": "ok", "warn": "warn", "fail": "FAIL"}[result.status]


@click.command(
    help="Check the control plane (as `linkerd check`): one line per check; exit 1 if any fails."
)
@click.option("--pre", is_flag=True, help="Check a cluster before installing Trellis into it.")
@output.format_option
@click.pass_obj
def check(on_demand: MeshOnDemand, pre: bool, fmt: output.Format) -> None:
    target = on_demand.target()
    if pre:
        if target is None:
            raise CliError(
                "--pre checks a cluster before an install: give --kubeconfig or --context "
                "(or run where KUBECONFIG or ~/.kube/config names one)"
            )
        from trellis_cli.cluster import Cluster

        before = Cluster(target)
        try:
            results = list(pre_install(before))
        finally:
            before.close()
    else:
        results = list(installed(on_demand.resolved()))
    if not output.emit(fmt, {"checks": [asdict(r) for r in results]}):
        output.listing(
            fmt,
            "Trellis checks" + (" before install" if pre else ""),
            [
                output.Column("CHECK", lambda r: r.check),
                output.Column("RESULT", _mark),
                output.Column("DETAIL", lambda r: r.detail),
            ],
            results,
        )
    if any(r.status == "fail" for r in results):
        raise SystemExit(NEGATIVE)


def installed(mesh: Mesh) -> Iterator[Result]:
    from trellis_cli.cluster import ClusterMesh

    cluster = mesh.cluster if isinstance(mesh, ClusterMesh) else None
    if cluster is not None:
        yield api_server(cluster)
        yield from crds(cluster)
    answers: dict[str, dict[str, Any]] = {}
    reached: dict[str, list[str]] = {}  # component -> admin URLs of its instances that answered
    for component in components.COMPONENTS:
        yield ready(mesh, component, answers, reached.setdefault(component, []))
    if isinstance(mesh, ClusterMesh):
        yield webhook(mesh)
    yield from certificates(mesh, reached["certmanager"])
    yield redis(answers)
    yield proxies(mesh, reached["proxy-cp"])


def pre_install(cluster: Cluster) -> Iterator[Result]:
    reached = api_server(cluster)
    yield reached
    if reached.status == "fail":
        return
    yield namespace_free(cluster)
    yield from crds(cluster, pre=True)


def _guarded(name: str, probe: Callable[[], Result]) -> Result:
    """``probe``'s result, or a failure saying why it could not be run."""
    try:
        return probe()
    except CliError as exc:
        return Result(name, "fail", exc.format_message())


# -- the cluster ----------------------------------------------------------------------------


def api_server(cluster: Cluster) -> Result:
    def probe() -> Result:
        info = cluster.get("/version") or {}
        return Result("kubernetes-api", "ok", f"reachable, {info.get('gitVersion', '?')}")

    return _guarded("kubernetes-api", probe)


def _served_crds(cluster: Cluster) -> dict[str, list[str]]:
    listed = cluster.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
    return {
        item["metadata"]["name"]: [v["name"] for v in item["spec"]["versions"] if v.get("served")]
        for item in (listed or {}).get("items", [])
    }


def crds(cluster: Cluster, pre: bool = False) -> Iterator[Result]:
    try:
        served = _served_crds(cluster)
    except CliError as exc:
        yield Result("crds", "fail", exc.format_message())
        return
    for name, version in CHART_CRDS.items():
        have = served.get(name)
        if have is None:
            status: Status = "ok" if pre else "fail"
            yield Result(
                f"crd {name}", status, "absent" + (" (the chart installs it)" if pre else "")
            )
        elif version not in have:
            yield Result(
                f"crd {name}", "fail", f"serves {', '.join(have)}; the chart installs {version}"
            )
        else:
            yield Result(
                f"crd {name}", "ok", f"{version} served" + (" (installed already)" if pre else "")
            )
    for name, version in PREREQUISITE_CRDS.items():
        have = served.get(name)
        if have is None:
            yield Result(
                f"crd {name}", "warn", "absent: a prerequisite (install it upstream's way)"
            )
        elif version not in have:
            yield Result(f"crd {name}", "warn", f"serves {', '.join(have)}, not {version}")
        else:
            yield Result(f"crd {name}", "ok", f"{version} served")


def namespace_free(cluster: Cluster) -> Result:
    namespace = cluster.target.namespace

    def probe() -> Result:
        if cluster.get(f"/api/v1/namespaces/{namespace}") is None:
            return Result(
                "namespace", "ok", f"{namespace} absent (`helm install --create-namespace`)"
            )
        running = [p["metadata"]["name"] for c in components.COMPONENTS for p in cluster.pods(c)]
        if running:
            return Result(
                "namespace", "fail", f"Trellis runs in {namespace} already: {', '.join(running)}"
            )
        return Result("namespace", "ok", f"{namespace} exists, no Trellis pod in it")

    return _guarded("namespace", probe)


# -- the components -------------------------------------------------------------------------


def _pod_urls(mesh: Mesh, component: str) -> list[tuple[str, str]]:
    """(instance or pod name, admin URL) of every instance of ``component``."""
    from trellis_cli.cluster import ClusterMesh

    if isinstance(mesh, ClusterMesh):
        return [
            (p["metadata"]["name"], mesh.pod_url(p, component))
            for p in mesh.cluster.pods(component)
        ]
    from trellis_common import statefile

    # the instances on record in the state directory (a process of each); none: the
    # component's default address, as `trellis status` tries it
    recorded = [
        (name, endpoint.admin_url)
        for name, endpoint in statefile.read_endpoints(mesh.state_dir).items()
        if name == component or name.rpartition("-")[0] == component
    ]
    return recorded or [(component, mesh.admin_url(component))]


def ready(
    mesh: Mesh, component: str, answers: dict[str, dict[str, Any]], reached: list[str]
) -> Result:
    """Every instance's ``/readyz``; the answers are kept for :func:`redis`, and the URLs of
    the instances that answered (``reached``) for the checks that follow."""
    name = f"component {component}"
    try:
        instances = _pod_urls(mesh, component)
    except CliError as exc:
        return Result(name, "fail", exc.format_message())
    if not instances:
        return Result(name, "fail", "no pod")
    problems = []
    for instance, url in instances:
        try:
            answer = adminhttp.request(
                mesh.state_dir, component, "GET", url + "/readyz", timeout=5.0
            )
            body = answer.json()
        except (httpx.HTTPError, ValueError, OSError) as exc:
            problems.append(f"{instance} unreachable ({exc.__class__.__name__})")
            continue
        answers[instance] = body
        reached.append(url)
        if answer.status_code != 200:
            reasons = "; ".join(f"{k}: {v}" for k, v in (body.get("reasons") or {}).items())
            problems.append(f"{instance} not ready ({reasons or answer.status_code})")
    if problems:
        return Result(name, "fail", ", ".join(problems))
    return Result(name, "ok", f"{len(instances)}/{len(instances)} ready")


def redis(answers: dict[str, dict[str, Any]]) -> Result:
    said = {name: body.get("checks", {}).get("redis") for name, body in answers.items()}
    said = {name: ok for name, ok in said.items() if ok is not None}
    if not said:
        return Result("redis", "fail", "no component answered to say")
    down = sorted(name for name, ok in said.items() if not ok)
    if down:
        return Result("redis", "fail", f"not reachable from {', '.join(down)}")
    return Result("redis", "ok", f"reachable from all {len(said)} instances that answered")


# -- certificates and the webhook -----------------------------------------------------------


def _peer_certificate(url: str, context: ssl.SSLContext, server_name: str) -> bytes:
    """The certificate served at ``url`` (verified by ``context`` for ``server_name``)."""
    parts = urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or 443)
    with (
        socket.create_connection(address, timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    if der is None:
        raise ssl.SSLError("no certificate served")
    return der


def webhook(mesh: ClusterMesh) -> Result:
    from trellis_cli.cluster import WEBHOOK_CONFIGURATION, WEBHOOK_PATH, _decoded
    from trellis_identity.trustctx import client_context

    name = "injector webhook"
    cluster = mesh.cluster
    try:
        found = cluster.get(WEBHOOK_PATH)
        if found is None:
            return Result(name, "fail", f"no MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION}")
        hook = (found.get("webhooks") or [{}])[0]
        config = hook.get("clientConfig") or {}
        bundle = _decoded(config.get("caBundle"))
        if not bundle:
            return Result(name, "fail", f"{WEBHOOK_CONFIGURATION} has no caBundle")
        service = config.get("service") or {}
        server_name = f"{service.get('name', 'injector')}.{service.get('namespace')}.svc"
        pods = cluster.pods("injector")
        if not pods:
            return Result(name, "fail", "no injector pod to serve it")
        url = mesh.pod_url(pods[0], "injector", port="webhook")
        _peer_certificate(url, client_context(bundle), server_name)
    except CliError as exc:
        return Result(name, "fail", exc.format_message())
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        return Result(name, "fail", f"the caBundle does not verify the webhook's certificate "
                                    f"as {server_name}: {exc}")  # fmt: skip
    return Result(name, "ok", f"caBundle verifies the certificate served as {server_name}")


def _expiry(what: str, subject: str, not_after: dt.datetime, now: dt.datetime) -> Result:
    left = not_after - now
    detail = f"{subject}: expires {not_after:%Y-%m-%d} ({left.days} days)"
    if left <= dt.timedelta(0):
        return Result(what, "fail", f"{subject}: EXPIRED on {not_after:%Y-%m-%d}")
    return Result(what, "warn" if left < EXPIRY_WARNING else "ok", detail)


def certificates(mesh: Mesh, reached: list[str]) -> Iterator[Result]:
    from cryptography import x509

    now = dt.datetime.now(dt.UTC)
    try:
        body = mesh.get_json("certmanager", "/v1/root")
        roots = x509.load_pem_x509_certificates(body["trust_bundle_pem"].encode())
    except (CliError, click.ClickException) as exc:
        yield Result("root certificates", "fail", exc.format_message())
        return
    for root in roots:
        yield _expiry(
            "root certificate", root.subject.rfc4514_string(), root.not_valid_after_utc, now
        )
    # the issuer: what signed certmanager's own serving certificate
    if not reached:
        yield Result("issuer certificate", "fail", "no certmanager instance answered")
        return
    try:
        context = adminhttp.mesh_context(mesh.state_dir)
        leaf = x509.load_der_x509_certificate(
            _peer_certificate(reached[0], context,
                              components.server_name("certmanager"))
        )  # fmt: skip
    except (OSError, ValueError) as exc:
        yield Result("issuer certificate", "fail", f"certmanager's certificate unread: {exc}")
        return
    issuer = next((r for r in roots if r.subject == leaf.issuer), None)
    if issuer is None:
        yield Result(
            "issuer certificate", "warn",
            f"{leaf.issuer.rfc4514_string()} is an intermediate: its expiry is not published",
        )  # fmt: skip
        return
    yield _expiry(
        "issuer certificate", issuer.subject.rfc4514_string(), issuer.not_valid_after_utc, now
    )


# -- proxies --------------------------------------------------------------------------------


def _acked(proxy: dict[str, Any]) -> bool:
    types = proxy.get("types") or {}
    return bool(types) and all(
        not t.get("last_error") and t.get("sent_version") is not None
        and t.get("acked_version") == t.get("sent_version")
        for t in types.values()
    )  # fmt: skip


def proxies(mesh: Mesh, reached: list[str]) -> Result:
    """What every proxy-cp instance that answered lists (each, the proxies connected to it)."""
    name = "proxy config"
    connected: list[dict[str, Any]] = []
    try:
        token = mesh.token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        for url in reached:
            answer = adminhttp.request(
                mesh.state_dir, "proxy-cp", "GET", url + "/v1/proxies", headers=headers
            )
            if answer.status_code != 200:
                return Result(
                    name, "fail", f"proxy-cp answered {answer.status_code}: {answer.text[:200]}"
                )
            connected += answer.json().get("proxies", [])
    except (click.ClickException, httpx.HTTPError, ValueError, OSError) as exc:
        return Result(name, "fail", f"proxy-cp's proxies unread: {exc}")
    if not reached:
        return Result(name, "fail", "no proxy-cp instance answered")
    if not connected:
        return Result(name, "ok", "no proxy connected (nothing to check)")
    acked = [p["proxy"] for p in connected if _acked(p)]
    if not acked:
        return Result(name, "fail", f"none of {len(connected)} proxies has ACKed its config")
    status: Status = "ok" if len(acked) == len(connected) else "warn"
    return Result(name, status, f"{len(acked)}/{len(connected)} proxies ACKed all they were sent")

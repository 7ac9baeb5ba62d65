"""An Envoy sidecar onboarded against the chart's processes (``chartprocs``) with
``trellis vm bootstrap``, for the tests that need a proxy connected to the chart's proxy-cp."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from tests.deploy.chartprocs import ChartControlPlane
from tests.deploy.helmchart import NAMESPACE
from trellis_testing.envoy import Envoy
from trellis_testing.ports import free_port

#: The bootstrap's cluster of proxy-cp (its xDS server).
XDS = "trellis-xds"


def onboard_sidecar(plane: ChartControlPlane, namespace: str, service: str, folder: Path) -> Proxy:
    """An Envoy sidecar of ``namespace/service`` that only calls out, onboarded with
    ``trellis vm bootstrap`` (the admin token; the injector issues its certificate and
    expects it at proxy-cp) and started with the bootstrap the CLI wrote. As for the
    chart's pods, only the Service's address is remapped: proxy-cp's xDS port here."""
    out, outbound = folder / service, free_port()
    done = subprocess.run(
        [
            sys.executable, "-m", "trellis_cli.main",
            "--state-dir", str(plane.state_dir),
            "vm", "bootstrap", "-n", namespace, "--service", service,
            "--app-port", "0", "--inbound-port", str(free_port()),
            "--outbound-port", str(outbound), "--admin-port", str(free_port()),
            "--out", str(out),
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    bootstrap = yaml.safe_load((out / "envoy.yaml").read_text())
    host, _, port = plane.process("proxy-cp").endpoint.grpc_address.rpartition(":")
    [xds] = [c for c in bootstrap["static_resources"]["clusters"] if c["name"] == XDS]
    [group] = xds["load_assignment"]["endpoints"]
    [endpoint] = group["lb_endpoints"]
    address = endpoint["endpoint"]["address"]["socket_address"]
    assert address == {"address": f"proxy-cp.{NAMESPACE}.svc", "port_value": 15128}
    address.update(address=host, port_value=int(port))
    envoy = Envoy(bootstrap, folder / "envoy", service).start()
    envoy.wait_ready()
    return Proxy(envoy, outbound)


@dataclass
class Proxy:
    """An onboarded Envoy sidecar and its outbound listener's port."""

    envoy: Envoy
    outbound_port: int

    def get(self, host: str, path: str) -> httpx.Response:
        """``path`` of ``host`` as the workload asks for it: through its outbound listener."""
        url = f"http://127.0.0.1:{self.outbound_port}{path}"
        return httpx.get(url, headers={"host": host}, timeout=5)

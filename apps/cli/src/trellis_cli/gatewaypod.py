"""A gateway Envoy in a Kubernetes pod: enrolled with its pod's ServiceAccount token.

In a pod there is no admin token, and an onboarding token is good for a few uses only,
while a Deployment's pods come and go. So ``trellis gateway run --enroll`` onboards the way
an injected pod's agent does (:mod:`trellis_cli.agent`, whose code this runs): the key is
made in the pod, and a CSR goes with the pod's projected ServiceAccount token (audience
``trellis``) to proxy-cp's enrollment port; certmanager has the API server review the token,
so the pod's own ServiceAccount is the gateway's identity. The agent's loop writes the
folder, then ``envoy.yaml`` with the node id its proxy certificate names, and re-enrolls
before the certificates expire.

The agent is configured as the injector configures a pod's (``TRELLIS_AGENT_ADDRESS``,
``TRELLIS_AGENT_SERVER_NAME``, ``TRELLIS_AGENT_CA``, ``TRELLIS_AGENT_TOKEN``; the chart sets
them). The bootstrap the injector would give it is built here by the same pure function
(:func:`trellis_common.bootstrap.envoy_bootstrap`), its node marked a gateway
(:func:`.gateway.with_gateway_metadata`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path

import yaml

from trellis_cli import agent
from trellis_cli.errors import CliError
from trellis_cli.gateway import GatewayProxy, free_ports, with_gateway_metadata
from trellis_common.bootstrap import (
    CA_FILE,
    KEY_FILE,
    PROXY_CERT_FILE,
    SDS_FILE,
    BootstrapSpec,
    ProxyFiles,
    envoy_bootstrap,
)

#: The node id until the agent enrolls (the injector's own placeholder for pods).
PENDING_NODE = "enrolling"


def split_address(text: str, option: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port``; a usage error naming ``option`` otherwise."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise CliError(f"{option}: {text!r} is not a host:port address")
    return host, int(port)


def enrollment_bootstrap(
    proxy: GatewayProxy, folder: Path, certs_dir: Path, xds_address: str, proxy_cp_id: str
) -> str:
    """The gateway Envoy's bootstrap, as the injector makes a pod's (before enrollment)."""
    host, port = split_address(xds_address, "--xds-address")
    inbound, outbound = free_ports(2)  # asked for, not used by a gateway (module gateway)
    document = envoy_bootstrap(
        BootstrapSpec(
            node_id=PENDING_NODE,
            namespace=proxy.namespace,
            service=proxy.name,
            files=ProxyFiles(
                cert_chain=folder / PROXY_CERT_FILE,
                key=folder / KEY_FILE,
                trust_bundle=folder / CA_FILE,
                sds=folder / SDS_FILE,
            ),
            xds_host=host,
            xds_port=port,
            proxy_cp_spiffe_id=proxy_cp_id,
            outbound_port=outbound,
            inbound_port=inbound,
            admin_port=proxy.admin_port,
            protocol="delta" if proxy.protocol == "delta" else "sotw",
            stats_port=proxy.stats_port,
            workload_dir=str(folder),
        )
    )
    return yaml.safe_dump(with_gateway_metadata(document, certs_dir), sort_keys=False)


def agent_config(
    proxy: GatewayProxy,
    folder: Path,
    certs_dir: Path,
    xds_address: str,
    proxy_cp_id: str,
    environ: Mapping[str, str] = os.environ,
) -> agent.AgentConfig:
    """The pod agent's configuration: where to enroll and whom to trust from the
    environment, the service, the folder and the bootstrap from the gateway."""
    given = {
        **environ,
        "TRELLIS_AGENT_SERVICE": proxy.name,
        "TRELLIS_AGENT_DIR": str(folder),
        "TRELLIS_AGENT_BOOTSTRAP": enrollment_bootstrap(
            proxy, folder, certs_dir, xds_address, proxy_cp_id
        ),
    }
    try:
        return agent.AgentConfig.from_env(given)
    except (agent.AgentError, ValueError) as exc:
        raise CliError(f"--enroll: {exc}") from exc


def enrolling(config: agent.AgentConfig, stop: threading.Event) -> threading.Thread:
    """The agent's loop (enroll, then renew) on a thread of its own, until ``stop``."""
    thread = threading.Thread(target=agent.run, args=(config, stop), name="enroll", daemon=True)
    thread.start()
    return thread


def wait_enrolled(config: agent.AgentConfig, stop: threading.Event) -> bool:
    """Wait until the agent wrote ``envoy.yaml`` (True), or ``stop`` (False)."""
    bootstrap = config.folder / agent.BOOTSTRAP_FILE
    while not bootstrap.exists():
        if stop.wait(0.2):
            return False
    return True

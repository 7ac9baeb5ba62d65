"""The whole control plane on the bookstore demo, and simulated proxies onboarded into it.

Shared by the benchmarks that run everything for real (:mod:`bench.soak`,
:mod:`bench.propagation` and its :mod:`bench.background` load): :func:`running` starts
Redis, certmanager, endpoints-vm, the catalog and proxy-cp as processes
(:class:`~trellis_testing.mesh.Mesh`, the end-to-end tests' harness) with the
bookstore example's spec directory and its three Envoy sidecars, and stops them all after.

:func:`issue` and :func:`fleet` onboard simulated proxies: a proxy certificate each, issued
by certmanager for a key made here, and an Envoy-like ADS stream each on its own mTLS
connection to proxy-cp (:class:`bench.xds_client.Fleet`). Both find the mesh through its
state directory, so a process that did not start it (the background load) can use them.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from bench import xds_client
from trellis_api import certmanager_pb2 as cm
from trellis_api import certmanager_pb2_grpc as cm_grpc
from trellis_common import components, statefile
from trellis_identity import tokens
from trellis_identity.identity import csr_for, new_key
from trellis_runtime import adminhttp
from trellis_testing.identities import allowed_caller, join_as
from trellis_testing.mesh import Mesh, Sidecar, bookstore
from trellis_testing.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent
ISSUE = "/trellis.certmanager.v1.CertificateManager/IssueCertificate"
ISSUE_IN_FLIGHT = 16

#: (common name, certificate chain, key, trust bundle) of one onboarded proxy
Issued = tuple[str, bytes, bytes, bytes]


@contextmanager
def running(prefix: str) -> Iterator[tuple[Mesh, Sidecar]]:
    """The control plane up with the bookstore demo, served through its Envoys; yields the
    mesh and bookbuyer's sidecar. The spec directory is a copy (``mesh.spec_dir``), so a
    benchmark may edit it."""
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        tmp = Path(folder)
        state, spec = tmp / "state", tmp / "spec"
        state.mkdir()
        shutil.copytree(ROOT / "examples" / "bookstore", spec)
        redis = RedisServer(dir=tmp / "redis")
        redis.start()
        mesh = Mesh(tmp, state, redis, spec)
        try:
            mesh.start()
            _, _, buyer = bookstore(mesh)
            print("control plane up, bookstore served through its Envoys", flush=True)
            yield mesh, buyer
        finally:
            mesh.stop()
            redis.close()


def _endpoint(state_dir: Path, name: str) -> statefile.ServiceEndpoint:
    endpoint = statefile.read_endpoint(state_dir, name)
    if endpoint is None:
        raise RuntimeError(f"{name} has not advertised itself in {state_dir}")
    return endpoint


def endpoints_vm(state_dir: Path) -> dict[str, Any]:
    """What an httpx client (sync or async) of endpoints-vm's REST API needs, as the
    operator's CLI has it: the address, the mesh's CA and the admin token."""
    token = tokens.load_or_create_admin_token(state_dir)
    return {
        "base_url": _endpoint(state_dir, components.ENDPOINTS_VM).admin_url,
        "verify": adminhttp.mesh_context(state_dir, check_name=False),
        "headers": {"Authorization": f"Bearer {token}"},
        "timeout": 30,
    }


async def issue(state_dir: Path, count: int, clients: int) -> list[Issued]:
    """``count`` proxy certificates, each for a key made here; the first ``clients`` are
    bookbuyer's, the rest bookthief's (which bookstore's TrafficTarget leaves out)."""
    example = cm.IssueCertificateRequest(kind=cm.CERTIFICATE_KIND_PROXY)
    identity = join_as(state_dir, allowed_caller(ISSUE, example))
    address = _endpoint(state_dir, components.CERTMANAGER).grpc_address
    slots = asyncio.Semaphore(ISSUE_IN_FLIGHT)
    async with identity.channel(address, components.CERTMANAGER) as channel:
        stub = cm_grpc.CertificateManagerStub(channel)

        async def one(index: int) -> Issued:
            name = "bookbuyer" if index < clients else "bookthief"
            async with slots:
                key_pem, key = new_key()
                issued = await stub.IssueCertificate(
                    cm.IssueCertificateRequest(
                        kind=cm.CERTIFICATE_KIND_PROXY,
                        service=cm.MeshService(namespace=name, name=name),
                        service_account=name,
                        csr_pem=csr_for(key, f"{name}/{name}"),
                    )
                )
                return (
                    issued.info.common_name,
                    issued.cert_chain_pem,
                    key_pem,
                    issued.trust_bundle_pem,
                )

        return list(await asyncio.gather(*(one(i) for i in range(count))))


def fleet(
    state_dir: Path, issued: list[Issued], watch: xds_client.Watcher | None = None
) -> xds_client.Fleet:
    """A fleet of one stream per issued certificate, each on its own mTLS connection to
    proxy-cp, the stream's node id the certificate's common name."""
    target = _endpoint(state_dir, components.PROXY_CP).grpc_address
    server_name = components.server_name(components.PROXY_CP)

    def channel_of(index: int) -> grpc.aio.Channel:
        _, chain, key, bundle = issued[index]
        credentials = grpc.ssl_channel_credentials(bundle, key, chain)
        options = [*xds_client.CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", server_name)]
        return grpc.aio.secure_channel(target, credentials, options)

    return xds_client.Fleet(
        target,
        len(issued),
        1,
        1,
        node_id=lambda i: issued[i][0],
        channel_of=channel_of,
        watch=watch,
    )

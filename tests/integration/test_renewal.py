"""Proxy certificates renewed before expiry, without dropping traffic (issue 11).

Real Envoy sidecars take their proxy certificate over file-based SDS; ``trellis proxy renew``
(the CLI, as a proxy's host runs it) renews one through proxy-cp while bookbuyer sends
requests through it. Envoy reconnects with the new certificate without a restart
(proxy-cp's ``/v1/proxies`` shows the new serial), no request fails meanwhile, and the old
certificate is refused from then on. A proxy asking to renew another proxy's certificate is
refused, logged and counted.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import grpc
import httpx
import pytest
import yaml
from cryptography import x509

from trellis_api import proxy_pb2, proxy_pb2_grpc
from trellis_identity.identity import csr_for, new_key
from trellis_testing import eventually
from trellis_testing.mesh import BOOKSTORE, Mesh, Sidecar, bookstore

pytestmark = pytest.mark.integration


class Load:
    """GETs through bookbuyer's sidecar, back to back, counting statuses and errors."""

    def __init__(self, sidecar: Sidecar) -> None:
        self.sidecar = sidecar
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="renewal load")

    def run(self) -> None:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{self.sidecar.outbound_port}",
            headers={"host": BOOKSTORE},
            timeout=5,
        ) as client:
            while not self.stop.is_set():
                try:
                    self.statuses.append(client.get("/books-bought").status_code)
                except httpx.HTTPError as exc:
                    self.errors.append(repr(exc))
                self.stop.wait(0.02)

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


def folder(mesh: Mesh, name: str) -> Path:
    return mesh.tmp / "proxies" / name


def serial_of(mesh: Mesh, sidecar: Sidecar) -> set[str]:
    return {p["serial"] for p in mesh.proxies() if p["proxy"] == sidecar.common_name}


def in_use(proxy_dir: Path) -> tuple[Path, Path]:
    document = yaml.safe_load((proxy_dir / "proxy-sds.yaml").read_text())
    pair = document["resources"][0]["tls_certificate"]
    return Path(pair["certificate_chain"]["filename"]), Path(pair["private_key"]["filename"])


def renew_call(
    mesh: Mesh, proxy_dir: Path, cert: Path, key: Path, common_name: str = ""
) -> grpc.StatusCode:
    """One Renew call presenting ``cert``/``key``; the status code it ended with."""
    credentials = grpc.ssl_channel_credentials(
        (proxy_dir / "ca.pem").read_bytes(), key.read_bytes(), cert.read_bytes()
    )
    options = [("grpc.ssl_target_name_override", "proxy-cp.trellis-system")]
    with grpc.secure_channel(f"127.0.0.1:{mesh.xds_port}", credentials, options) as channel:
        stub = proxy_pb2_grpc.ProxyCertificatesStub(channel)
        request = proxy_pb2.RenewRequest(
            csr_pem=csr_for(new_key()[1], "x"), common_name=common_name
        )
        try:
            stub.Renew(request, timeout=10)
        except grpc.RpcError as exc:
            return exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    return grpc.StatusCode.OK


def renewals(mesh: Mesh, outcome: str) -> float:
    return mesh.proxy_cp_counter(f'trellis_proxy_cp_renewals_total{{outcome="{outcome}"}}')


def test_a_sidecar_renews_under_load_reconnects_with_the_new_serial_and_the_old_is_refused(
    mesh: Mesh,
) -> None:
    _, _, buyer = bookstore(mesh)
    proxy_dir = folder(mesh, "bookbuyer")
    (old_serial,) = serial_of(mesh, buyer)
    old_cert, old_key = in_use(proxy_dir)
    kept_cert, kept_key = proxy_dir / "old-cert.pem", proxy_dir / "old-key.pem"
    kept_cert.write_bytes(old_cert.read_bytes())
    kept_key.write_bytes(old_key.read_bytes())
    started_at = buyer.envoy.stat("server.uptime")

    with Load(buyer) as load:
        asyncio.run(eventually(lambda: len(load.statuses) >= 20, timeout=15, message="load"))
        done = mesh.trellis("proxy", "renew", "--dir", str(proxy_dir), "--force", "--json")
        assert done.returncode == 0, done.stderr
        renewed = json.loads(done.stdout)
        assert renewed["old_serial"] == old_serial
        asyncio.run(
            eventually(
                lambda: serial_of(mesh, buyer) == {renewed["serial"]},
                timeout=30,
                interval=0.1,
                message="bookbuyer reconnected with the new certificate",
            )
        )
        before = len(load.statuses)
        asyncio.run(
            eventually(lambda: len(load.statuses) >= before + 20, timeout=15, message="more load")
        )

    assert load.errors == []
    assert set(load.statuses) == {200}
    assert buyer.envoy.stat("server.uptime") >= started_at  # the same Envoy, not restarted
    assert in_use(proxy_dir) == (Path(renewed["cert_chain"]), Path(renewed["key"]))
    # one new version of the folder (a ..data swap): the previous key is gone from it
    assert old_key.read_bytes() != kept_key.read_bytes()
    assert [p.name for p in proxy_dir.glob("..2*")] == [os.readlink(proxy_dir / "..data")]
    assert Path(renewed["key"]).stat().st_mode & 0o777 == 0o600
    # its own workload certificate was renewed with it, for the new key, and Envoy serves
    # it (it watches the folder): no restart, no key of the service anywhere
    workload = x509.load_pem_x509_certificate((proxy_dir / "workload.pem").read_bytes())
    proxy_cert = x509.load_pem_x509_certificate(Path(renewed["cert_chain"]).read_bytes())
    assert workload.public_key() == proxy_cert.public_key()

    def serves_the_new_workload_certificate() -> bool:
        served = buyer.envoy.get("/certs").json()["certificates"]
        serials = {
            c["serial_number"].lower().lstrip("0")
            for entry in served
            for c in entry.get("cert_chain", [])
        }
        return f"{workload.serial_number:x}" in serials

    asyncio.run(
        eventually(serves_the_new_workload_certificate, timeout=10, message="Envoy reloaded")
    )
    # the old certificate is revoked: proxy-cp refuses it
    assert renew_call(mesh, proxy_dir, kept_cert, kept_key) == grpc.StatusCode.PERMISSION_DENIED
    assert renewals(mesh, "revoked") >= 1
    # not due yet: a one-shot run without --force leaves it alone
    again = mesh.trellis("proxy", "renew", "--dir", str(proxy_dir), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["renewed"] is False


def test_a_proxy_renewing_another_proxy_s_certificate_is_refused_logged_and_counted(
    mesh: Mesh,
) -> None:
    v1, _, buyer = bookstore(mesh)
    proxy_dir = folder(mesh, "bookbuyer")
    cert, key = in_use(proxy_dir)

    code = renew_call(mesh, proxy_dir, cert, key, common_name=v1.common_name)

    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert renewals(mesh, "other_proxy") == 1
    logs = "".join(replica.logs() for replica in mesh.proxy_cps)  # whichever served the call
    assert f"renew.refused proxy={buyer.common_name} reason=other_proxy" in logs
    assert serial_of(mesh, v1) != set()  # v1's certificate is untouched: still connected
    assert buyer.get(BOOKSTORE, "/books-bought").status_code == 200

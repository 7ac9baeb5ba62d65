"""Onboarding bound to identity, with every service a real process (issue 11).

The attacks, one test each, each asserting the refusal, its log line and its count on the
service's ``/metrics``:

* an onboarding token used for another identity (the injector, and endpoints-vm);
* the admin token on a heartbeat;
* another workload's heartbeat token;
* a missing or bad CSR (422 naming ``csr_pem``).

And, after a whole onboarding (a proxy through ``trellis vm bootstrap`` with a scoped
token, a workload registered and beating): no private key in any output: the services'
logs, REST answers, metrics, Redis values, and the files of the state directory.

The five services (and their Redis and state directory) start once for the module, and
its tests share them, in any order: a test asserts the change its action makes to a
count (read before, acted, read after), names its workloads apart from the other tests',
and looks for log lines that only its action writes (its token id, its workload).
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from cryptography.hazmat.primitives import serialization

from trellis_identity.identity import csr_for, new_key
from trellis_testing import RedisServer, eventually, redis_backend
from trellis_testing.ports import free_port
from trellis_testing.services import ServiceProcess, running

# one mesh for the module (its fixtures): its tests run on one xdist worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("onboarding-mesh")]

ROOT = Path(__file__).resolve().parents[2]
FAST = {"TRELLIS_REGISTRY_TTL": "2"}


class Mesh:
    """certmanager, the catalog, proxy-cp, the injector and endpoints-vm."""

    def __init__(self, tmp: Path, state_dir: Path, redis_server: RedisServer) -> None:
        spec_dir = tmp / "spec"
        shutil.copytree(ROOT / "examples" / "bookstore", spec_dir)
        self.state_dir = state_dir

        def process(name: str, module: str, *args: str) -> ServiceProcess:
            return ServiceProcess(name, module, state_dir, redis_server.url, args=args, env=FAST)

        self.processes = {
            "certmanager": process("certmanager", "trellis_certmanager.main"),
            "catalog": process("catalog", "trellis_catalog.main", "--spec-dir", str(spec_dir)),
            "proxy-cp": process("proxy-cp", "trellis_proxy_cp.main", "--xds-host", "127.0.0.1"),
            "injector": process("injector", "trellis_injector.main"),
            "endpoints-vm": process("endpoints-vm", "trellis_endpoints_vm.main"),
        }

    def __getitem__(self, name: str) -> ServiceProcess:
        return self.processes[name]

    def cli(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "trellis_cli.main", "--state-dir", str(self.state_dir), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )

    def admin_token(self) -> str:
        return (self.state_dir / "admin-token").read_text().strip()

    def metric(self, service: str, line_start: str) -> float:
        """The value of the sample whose line starts with ``line_start`` (0 if absent)."""
        for line in self[service].get("/metrics").text.splitlines():
            if line.startswith(line_start):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@pytest.fixture(scope="module")
def mesh_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's directory: the mesh's spec documents, state directory and Redis."""
    return tmp_path_factory.mktemp("onboarding")


@pytest.fixture(scope="module")
def state_dir(mesh_dir: Path) -> Path:
    """The mesh's state directory, one for the module (the shared fixture's is per test)."""
    path = mesh_dir / "state"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def redis_server(mesh_dir: Path) -> Iterator[RedisServer]:
    """The mesh's Redis, one for the module (the shared fixture's is per test)."""
    server = redis_backend.redis_server(mesh_dir / "redis")
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def mesh(mesh_dir: Path, state_dir: Path, redis_server: RedisServer) -> Iterator[Mesh]:
    """The five services, started once for the module's tests."""
    mesh = Mesh(mesh_dir, state_dir, redis_server)
    with running(mesh.processes):
        yield mesh


def logged(mesh: Mesh, service: str, text: str) -> bool:
    """Wait until ``service`` has logged ``text`` (its log reaches the file a moment later)."""

    def seen() -> bool:
        return text in mesh[service].logs()

    asyncio.run(eventually(seen, timeout=10, interval=0.1, message=f"{service} logs {text!r}"))
    return True


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def make_token(mesh: Mesh, tmp_path: Path, namespace: str, account: str) -> tuple[Path, str]:
    """``trellis token create ... --out``: the token's file and its id (for the service of
    the account's name, one workload)."""
    out = tmp_path / f"token-{namespace}-{account}"
    made = mesh.cli(
        *("token", "create", "-n", namespace, "--service", account),
        *("--service-account", account, "--ttl", "10m"),
        *("--out", str(out), "--json"),
    )
    assert made.returncode == 0, made.stderr
    assert out.read_text().strip() not in made.stdout + made.stderr
    return out, out.read_text().split(".")[1]


def bootstrap(mesh: Mesh, out: Path, service_account: str, token_file: Path) -> Any:
    return mesh.cli(
        *("vm", "bootstrap", "-n", "bookbuyer", "--service", "bookbuyer"),
        *("--service-account", service_account, "--app-port", "0"),
        *("--inbound-port", str(free_port()), "--outbound-port", str(free_port())),
        *("--admin-port", str(free_port()), "--out", str(out), "--token-file", str(token_file)),
        *("--stats-port", "15010"),
    )


def bootstrap_body(**overrides: Any) -> dict[str, Any]:
    return {
        "namespace": "bookbuyer",
        "service": "bookbuyer",
        "inbound_port": 15003,
        "outbound_port": 15001,
        "admin_port": 15000,
        "output_dir": "/srv/bookbuyer-proxy",
        "csr_pem": csr_for(new_key()[1], "bookbuyer").decode(),
        **overrides,
    }


def register(mesh: Mesh, name: str, token: str) -> dict[str, Any]:
    body = {
        "namespace": "bookstore",
        "name": name,
        "services": ["bookstore-v1"],
        "address": "10.9.0.1",
        "ports": [{"name": "http", "number": 8080}],
        "service_account": "bookstore",
        "ttl": 60,
    }
    response = mesh["endpoints-vm"].post("/v1/workloads", json=body, headers=bearer(token))
    assert response.status_code == 201, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_an_onboarding_token_used_for_another_identity_is_refused_logged_and_counted(
    mesh: Mesh, tmp_path: Path
) -> None:
    token_file, token_id = make_token(mesh, tmp_path, "bookbuyer", "bookbuyer")

    # the injector: a proxy of another service account
    wrong = 'trellis_injector_onboarding_refusals_total{reason="wrong-identity"}'
    proxies = 'trellis_certmanager_certificates{kind="proxy"}'
    refusals_before = mesh.metric("injector", wrong)
    proxies_before = mesh.metric("certmanager", proxies)
    refused = bootstrap(mesh, tmp_path / "other", "bookthief", token_file)
    assert refused.returncode == 2
    assert "injector answered 403" in refused.stderr
    assert f"onboarding token {token_id} is for bookbuyer/bookbuyer" in refused.stderr
    assert not (tmp_path / "other").exists()
    assert logged(
        mesh,
        "injector",
        f"onboard.refused reason=wrong-identity token_id={token_id} "
        "identity=bookbuyer/bookbuyer account=bookthief",
    )
    assert mesh.metric("injector", wrong) - refusals_before == 1
    assert mesh.metric("certmanager", proxies) - proxies_before == 0

    # ...and the same token onboards its own identity
    accepted = 'trellis_injector_proxies_onboarded_total{caller="token"}'
    onboarded_before = mesh.metric("injector", accepted)
    out = tmp_path / "bookbuyer-proxy"
    done = bootstrap(mesh, out, "bookbuyer", token_file)
    assert done.returncode == 0, done.stderr
    written = yaml.safe_load((out / "envoy.yaml").read_text())
    [stats] = written["static_resources"]["listeners"]  # --stats-port: Prometheus' listener
    assert stats["address"]["socket_address"]["port_value"] == 15010
    assert mesh.metric("injector", accepted) - onboarded_before == 1

    # endpoints-vm: a workload of another namespace
    token = token_file.read_text().strip()
    other = {
        "namespace": "bookstore",
        "name": "sneaky",
        "services": ["bookstore-v1"],
        "address": "10.9.0.9",
        "ports": [{"name": "http", "number": 8080}],
        "service_account": "bookstore",
    }
    counted = (
        'trellis_endpoints_vm_credential_refusals_total{operation="register",'
        'reason="wrong-identity"}'
    )
    counted_before = mesh.metric("endpoints-vm", counted)
    response = mesh["endpoints-vm"].post("/v1/workloads", json=other, headers=bearer(token))
    assert response.status_code == 403
    assert response.json()["reason"] == "wrong-identity"
    assert logged(
        mesh,
        "endpoints-vm",
        f"workload.refused operation=register reason=wrong-identity workload=bookstore/sneaky "
        f"token_id={token_id}",
    )
    assert mesh.metric("endpoints-vm", counted) - counted_before == 1
    assert token not in mesh["injector"].logs() + mesh["endpoints-vm"].logs()


def test_the_admin_token_on_a_heartbeat_is_refused_logged_and_counted(mesh: Mesh) -> None:
    register(mesh, "store-admin-beat", mesh.admin_token())
    counted = (
        'trellis_endpoints_vm_credential_refusals_total{operation="heartbeat",reason="admin-token"}'
    )
    before = mesh.metric("endpoints-vm", counted)
    beat = mesh["endpoints-vm"].post(
        "/v1/workloads/bookstore/store-admin-beat/heartbeat", headers=bearer(mesh.admin_token())
    )
    assert beat.status_code == 403
    assert beat.json()["reason"] == "admin-token"
    assert logged(
        mesh,
        "endpoints-vm",
        "workload.refused operation=heartbeat reason=admin-token "
        "workload=bookstore/store-admin-beat",
    )
    assert mesh.metric("endpoints-vm", counted) - before == 1


def test_another_workload_s_heartbeat_token_is_refused_logged_and_counted(mesh: Mesh) -> None:
    register(mesh, "store-victim", mesh.admin_token())
    theirs = register(mesh, "store-other", mesh.admin_token())["heartbeat_token"]
    counted = {
        operation: (
            f'trellis_endpoints_vm_credential_refusals_total{{operation="{operation}",'
            'reason="wrong-token"}'
        )
        for operation in ("heartbeat", "deregister")
    }
    before = {
        operation: mesh.metric("endpoints-vm", sample) for operation, sample in counted.items()
    }
    beat = mesh["endpoints-vm"].post(
        "/v1/workloads/bookstore/store-victim/heartbeat", headers=bearer(theirs)
    )
    assert beat.status_code == 403
    assert beat.json()["reason"] == "wrong-token"
    gone = mesh["endpoints-vm"].delete(
        "/v1/workloads/bookstore/store-victim", headers=bearer(theirs)
    )
    assert gone.status_code == 403
    for operation in ("heartbeat", "deregister"):
        line = f"operation={operation} reason=wrong-token workload=bookstore/store-victim"
        assert logged(mesh, "endpoints-vm", line)
    assert theirs not in mesh["endpoints-vm"].logs()
    for operation, sample in counted.items():
        assert mesh.metric("endpoints-vm", sample) - before[operation] == 1
    # both still there, once each (other tests' workloads may be listed beside them)
    listed = mesh["endpoints-vm"].get("/v1/workloads").json()["workloads"]
    ours = [w["name"] for w in listed if w["name"] in {"store-victim", "store-other"}]
    assert sorted(ours) == ["store-other", "store-victim"]


def unprocessable(mesh: Mesh) -> dict[str, float]:
    """The injector's count of 422 refusals, by series (``trellis_http_refusals_total{...}``)."""
    counts: dict[str, float] = {}
    for line in mesh["injector"].get("/metrics").text.splitlines():
        if line.startswith("trellis_http_refusals_total") and 'status="422"' in line:
            series, value = line.rsplit(" ", 1)
            counts[series] = float(value)
    return counts


@pytest.mark.parametrize(
    ("csr_pem", "words"),
    [
        (None, "Field required"),
        ("", "a PEM certificate signing request is required"),
        (
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
            "not a PEM",
        ),
    ],
)
def test_a_missing_or_bad_csr_is_422_naming_csr_pem(
    mesh: Mesh, csr_pem: str | None, words: str
) -> None:
    body = bootstrap_body() if csr_pem is None else bootstrap_body(csr_pem=csr_pem)
    if csr_pem is None:
        del body["csr_pem"]
    before = unprocessable(mesh)
    response = mesh["injector"].post("/v1/bootstrap", json=body, headers=bearer(mesh.admin_token()))
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "csr_pem"
    assert words in response.json()["detail"]
    after = unprocessable(mesh)
    moved = [count - before.get(series, 0.0) for series, count in after.items()]
    assert [m for m in moved if m] == [1.0]  # logged and counted: one series, by one


def forms_of(key_pem: bytes) -> list[bytes]:
    """What a key looks like in the clear: PEM, DER, base64 of the DER."""
    key = serialization.load_pem_private_key(key_pem, password=None)
    der = key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return [b"PRIVATE KEY", der, base64.b64encode(der)[:48]]


def test_no_private_key_in_any_output(
    mesh: Mesh, tmp_path: Path, redis_server: RedisServer
) -> None:
    token_file, _ = make_token(mesh, tmp_path, "bookbuyer", "bookbuyer")
    out = tmp_path / "bookbuyer-proxy"
    done = bootstrap(mesh, out, "bookbuyer", token_file)
    assert done.returncode == 0, done.stderr
    written = yaml.safe_load((out / "envoy.yaml").read_text())
    [stats] = written["static_resources"]["listeners"]  # --stats-port: Prometheus' listener
    assert stats["address"]["socket_address"]["port_value"] == 15010
    proxy_key = (out / "key.pem").read_bytes()
    answer = mesh["injector"].post(
        "/v1/bootstrap", json=bootstrap_body(), headers=bearer(mesh.admin_token())
    )
    assert answer.status_code == 200
    registered = register(mesh, "store-keyless", mesh.admin_token())
    beat = mesh["endpoints-vm"].post(
        "/v1/workloads/bookstore/store-keyless/heartbeat",
        headers=bearer(registered["heartbeat_token"]),
    )
    assert beat.status_code == 200
    assert mesh.cli("vm", "register", "-n", "bookstore", "--name", "store-keyless-cli",
                    "--service", "bookstore-v1", "--address", "10.9.0.3", "--port", "http=8080",
                    "--service-account", "bookstore").returncode == 0  # fmt: skip

    outputs: dict[str, bytes] = {
        "cli": (done.stdout + done.stderr).encode(),
        "injector answer": answer.content,
        "registration answer": str(registered).encode(),
    }
    for name, process in mesh.processes.items():
        outputs[f"{name} log"] = process.logs().encode()
        outputs[f"{name} metrics"] = process.get("/metrics").content
    outputs["certificates"] = mesh["certmanager"].get("/v1/certificates").content
    outputs["tokens"] = (
        mesh["injector"].get("/v1/tokens", headers=bearer(mesh.admin_token())).content
    )
    outputs["workloads"] = mesh["endpoints-vm"].get("/v1/workloads").content
    with redis.Redis.from_url(redis_server.url) as client:
        for key in client.scan_iter():
            kind = client.type(key)
            if kind == b"string":
                outputs[f"redis {key!r}"] = client.get(key) or b""
            elif kind == b"hash":
                for field, value in client.hgetall(key).items():
                    outputs[f"redis {key!r}[{field!r}]"] = value
    for path in sorted(mesh.state_dir.rglob("*")):
        if path.is_file():
            outputs[f"state {path.relative_to(mesh.state_dir)}"] = path.read_bytes()

    forbidden = forms_of(proxy_key)
    leaks = [name for name, data in outputs.items() if any(f in data for f in forbidden)]
    assert leaks == []
    assert any(name.startswith("redis") for name in outputs)
    assert any(name.startswith("state heartbeat-tokens") for name in outputs)

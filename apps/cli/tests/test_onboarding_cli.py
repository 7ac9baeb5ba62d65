"""What the CLI sends and keeps when it onboards: the proxy's key made here (only a CSR
sent), onboarding tokens instead of the admin token, heartbeat tokens kept 0600 and sent
by ``vm heartbeat``. The services' side is checked in their own tests and in
tests/integration."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from trellis_cli import vm as vm_commands
from trellis_cli.client import DEFAULT_ADMIN_PORTS
from trellis_cli.main import cli
from trellis_cli.testing import Answer, CannedAdmin

ADMIN = "Bearer test-token"
ONBOARDING = "trellis-onb.0123456789abcdef." + "s" * 43
CN = "123e4567-e89b-42d3-a456-426614174000.cart.shop"


@pytest.fixture(autouse=True)
def admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRELLIS_ADMIN_TOKEN", "test-token")
    monkeypatch.delenv("TRELLIS_ONBOARDING_TOKEN", raising=False)


def trellis(state_dir: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--state-dir", str(state_dir), *args])


def canned(state_dir: Path, answers: dict[tuple[str, str], Answer]) -> CannedAdmin:
    admin = CannedAdmin(answers)
    admin.serve(state_dir, *DEFAULT_ADMIN_PORTS)
    return admin


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def bootstrap_answer(folder: Path) -> Answer:
    return Answer(
        200,
        {
            "common_name": CN,
            "xds_address": "127.0.0.1:15128",
            "bootstrap": {"node": {"id": CN}},
            "files": {
                "cert_chain_pem": "CERT\n",
                "workload_cert_chain_pem": "WORKLOAD\n",
                "trust_bundle_pem": "CA\n",
            },
            "paths": {
                "cert_chain": str(folder / "cert.pem"),
                "workload_cert": str(folder / "workload.pem"),
                "key": str(folder / "key.pem"),
                "trust_bundle": str(folder / "ca.pem"),
                "sds": str(folder / "proxy-sds.yaml"),
            },
        },
    )


BOOTSTRAP_ARGS = (
    *("vm", "bootstrap", "-n", "shop", "--service", "cart", "--service-account", "cart-sa"),
    *("--app-port", "8080", "--inbound-port", "15003", "--outbound-port", "15001"),
    *("--admin-port", "15000"),
)


def test_vm_bootstrap_makes_the_key_here_and_sends_only_a_csr(tmp_path: Path) -> None:
    folder = (tmp_path / "proxy").resolve()
    token_file = tmp_path / "onboarding-token"
    token_file.write_text(ONBOARDING + "\n")
    answers = {("POST", "/v1/bootstrap"): bootstrap_answer(folder)}
    with canned(tmp_path, answers) as admin:
        result = trellis(
            tmp_path, *BOOTSTRAP_ARGS, "--out", str(folder), "--token-file", str(token_file)
        )

    assert result.exit_code == 0, result.output
    (sent,) = admin.received
    assert sent.authorization == f"Bearer {ONBOARDING}"  # the scoped token, not the admin's
    assert b"PRIVATE KEY" not in sent.body
    csr = x509.load_pem_x509_csr(sent.json()["csr_pem"].encode())
    key_file = folder / "key.pem"
    assert mode(key_file) == 0o600
    key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    assert csr.public_key() == key.public_key()  # the CSR is for the key kept here
    assert (folder / "cert.pem").read_text() == "CERT\n"
    assert (folder / "workload.pem").read_text() == "WORKLOAD\n"
    # written as the pod agent writes its folder: every name a link through ..data
    for name in ("cert.pem", "workload.pem", "key.pem", "ca.pem", "proxy-sds.yaml"):
        assert os.readlink(folder / name) == f"..data/{name}"
    sds = yaml.safe_load((folder / "proxy-sds.yaml").read_text())
    pair = sds["resources"][0]["tls_certificate"]
    assert pair["certificate_chain"]["filename"] == str(folder / "cert.pem")
    assert pair["private_key"]["filename"] == str(folder / "key.pem")


def test_vm_bootstrap_takes_the_token_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRELLIS_ONBOARDING_TOKEN", ONBOARDING)
    folder = (tmp_path / "proxy").resolve()
    with canned(tmp_path, {("POST", "/v1/bootstrap"): bootstrap_answer(folder)}) as admin:
        result = trellis(tmp_path, *BOOTSTRAP_ARGS, "--out", str(folder))
    assert result.exit_code == 0, result.output
    assert admin.received[0].authorization == f"Bearer {ONBOARDING}"


def test_a_refused_onboarding_token_is_2_and_writes_no_key(tmp_path: Path) -> None:
    folder = (tmp_path / "proxy").resolve()
    refusal = Answer(
        403, {"detail": "onboarding token 0123456789abcdef is for shop/other, not shop/cart-sa"}
    )
    token_file = tmp_path / "t"
    token_file.write_text(ONBOARDING)
    with canned(tmp_path, {("POST", "/v1/bootstrap"): refusal}):
        result = trellis(
            tmp_path, *BOOTSTRAP_ARGS, "--out", str(folder), "--token-file", str(token_file)
        )
    assert result.exit_code == 2
    assert "injector answered 403: onboarding token 0123456789abcdef is for" in result.stderr
    assert "admin token" not in result.stderr  # it was not the admin token that was refused
    assert not (folder / "key.pem").exists()


def test_vm_register_keeps_the_heartbeat_token_and_heartbeat_sends_it(tmp_path: Path) -> None:
    registered = {"namespace": "shop", "name": "vm-1", "heartbeat_token": "trellis-hb.abc"}
    answers = {
        ("POST", "/v1/workloads"): Answer(201, registered),
        ("POST", "/v1/workloads/shop/vm-1/heartbeat"): Answer(200, {"expires_at": None}),
        ("DELETE", "/v1/workloads/shop/vm-1"): Answer(204, {}),
    }
    kept = tmp_path / "heartbeat-tokens" / "shop" / "vm-1"
    with canned(tmp_path, answers) as admin:
        register = trellis(
            tmp_path,
            *("vm", "register", "-n", "shop", "--name", "vm-1", "--service", "cart"),
            *("--address", "10.0.0.7", "--port", "http=15003", "--ttl", "10", "--json"),
        )
        assert register.exit_code == 0, register.output
        assert "trellis-hb.abc" not in register.output  # kept, not printed
        assert kept.read_text().strip() == "trellis-hb.abc"
        assert mode(kept) == 0o600
        assert mode(kept.parent) == 0o700

        beat = trellis(tmp_path, "vm", "heartbeat", "-n", "shop", "--name", "vm-1")
        assert beat.exit_code == 0, beat.output
        gone = trellis(tmp_path, "vm", "deregister", "-n", "shop", "--name", "vm-1")
        assert gone.exit_code == 0, gone.output

    assert [(r.method, r.authorization) for r in admin.received] == [
        ("POST", ADMIN),
        ("POST", "Bearer trellis-hb.abc"),  # the workload's own token, never the admin's
        ("DELETE", ADMIN),  # operators deregister with the admin token
    ]
    assert not kept.exists()


def test_vm_register_with_token_out(tmp_path: Path) -> None:
    answers = {("POST", "/v1/workloads"): Answer(201, {"heartbeat_token": "trellis-hb.xyz"})}
    out = tmp_path / "hb"
    with canned(tmp_path, answers):
        result = trellis(
            tmp_path,
            *("vm", "register", "-n", "shop", "--name", "vm-1", "--service", "cart"),
            *("--address", "10.0.0.7", "--port", "8080", "--token-out", str(out)),
        )
    assert result.exit_code == 0, result.output
    assert out.read_text().strip() == "trellis-hb.xyz"
    assert mode(out) == 0o600
    assert f"heartbeat token in {out}" in result.stdout


def test_token_create_list_and_revoke(tmp_path: Path) -> None:
    made = {
        "token": ONBOARDING,
        "id": "0123456789abcdef",
        "namespace": "shop",
        "service": "cart",
        "service_account": "cart-sa",
        "uses": 3,
        "created_at": 1.0,
        "expires_at": 5401.0,
    }
    listed = {"tokens": [{k: v for k, v in made.items() if k != "token"}]}
    answers = {
        ("POST", "/v1/tokens"): Answer(201, made),
        ("GET", "/v1/tokens"): Answer(200, listed),
        ("DELETE", "/v1/tokens/0123456789abcdef"): Answer(204, {}),
    }
    with canned(tmp_path, answers) as admin:
        create = trellis(
            tmp_path,
            "token",
            "create",
            "-n",
            "shop",
            "--service",
            "cart",
            "--service-account",
            "cart-sa",
            "--ttl",
            "90m",
            "--uses",
            "3",
        )
        assert create.exit_code == 0, create.output
        assert create.stdout.strip() == ONBOARDING  # stdout: the token alone, for a pipe
        out = tmp_path / "token"
        to_file = trellis(
            tmp_path, "token", "create", "-n", "shop", "--service", "cart",
            "--service-account", "cart-sa", "--out", str(out),
        )  # fmt: skip
        assert to_file.exit_code == 0
        assert ONBOARDING not in to_file.output
        assert out.read_text().strip() == ONBOARDING
        assert mode(out) == 0o600
        shown = trellis(tmp_path, "token", "list")
        assert "0123456789abcdef" in shown.stdout
        assert "cart-sa" in shown.stdout
        assert " cart " in shown.stdout
        assert trellis(tmp_path, "token", "revoke", "0123456789abcdef").exit_code == 0

    assert admin.received[0].json() == {
        "namespace": "shop",
        "service": "cart",
        "service_account": "cart-sa",
        "ttl_seconds": 5400.0,
        "uses": 3,
    }
    assert {r.authorization for r in admin.received} == {ADMIN}


def test_a_bad_ttl_is_a_usage_error(tmp_path: Path) -> None:
    result = trellis(
        tmp_path, "token", "create", "-n", "shop", "--service", "a", "--service-account", "a",
        "--ttl", "soon",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "expected a duration such as 30m, 1h or 2d" in result.output


def test_an_expired_workloads_state_says_when_it_will_be_deregistered() -> None:
    """``trellis vm list``'s STATE: an expired workload is deregistered ``reap_after``
    past its TTL, if no heartbeat comes (``reaped_at``); without one (reaping off, or an
    older endpoints-vm), only how long ago it expired."""
    now = 10_000.0
    expired = {"ttl": 30.0, "alive": False, "expires_at": now - 100, "reaped_at": now + 3540}
    assert vm_commands._state(expired, now) == "EXPIRED 100s ago, deregistered in 59m"
    assert vm_commands._state({**expired, "reaped_at": None}, now) == "EXPIRED 100s ago"
    alive = {"ttl": 30.0, "alive": True, "expires_at": now + 20, "reaped_at": now + 3620}
    assert vm_commands._state(alive, now) == "alive (20s left)"

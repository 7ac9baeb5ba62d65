"""A GitOps install of the chart: every secret given, so ``helm template`` is stable.

Argo CD and Flux render the chart with ``helm template``, which has no cluster: the
chart's ``lookup`` finds nothing, and each sync would make a new root CA, KEK, admin token
and Redis passwords (the keys sealed in Redis then unreadable). With ``ca.existingSecret``,
``kek.existingSecret``, ``adminToken.existingSecret`` and ``redis.existingUsersSecret`` the
chart makes nothing random and hashes no password (the Redis pods do, at start, with
``files/redis-acl.sh``): two renderings are the same bytes, no Secret of the four is
rendered, and every reference names the operator's.

The Secrets here are made as docs/kubernetes.md#gitops-argo-cd-flux says (openssl), and the
rendered pods, run as processes with them (``chartprocs``), start, join and log in to a
Redis whose aclfile the chart's own script wrote.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.chartprocs import MODULES, ChartControlPlane, Given, chart_acl
from tests.deploy.helmchart import CHART, NAMESPACE, Rendered, helm, render
from trellis_runtime import redisacl
from trellis_testing import RedisServer
from trellis_testing.kube import KubeApi

#: The operator's Secrets (any names will do) and the values naming them.
GIVEN_NAMES = {
    "ca.existingSecret": "mesh-ca",
    "kek.existingSecret": "mesh-kek",
    "adminToken.existingSecret": "mesh-admin-token",
    "redis.existingUsersSecret": "mesh-redis-users",
}
GITOPS = tuple(f"{key}={name}" for key, name in GIVEN_NAMES.items())
#: What the chart makes when nothing is given.
CHARTS_OWN = {"trellis-ca", "trellis-kek", "trellis-admin-token", "trellis-redis-users"}
COMPONENT_USERS = (
    "certmanager",
    "catalog",
    "endpoints-k8s",
    "endpoints-vm",
    "proxy-cp",
    "injector",
)


def _openssl(*args: str, cwd: Path) -> bytes:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout


def operator_secrets(where: Path, sentinel: bool = False) -> Given:
    """The four Secrets, made with the commands docs/kubernetes.md gives."""
    where.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-days", "3650", "-subj", "/CN=Trellis mesh root", "-keyout", "ca.key", "-out", "ca.crt",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=where,
    )  # fmt: skip
    cert, key = (where / "ca.crt").read_bytes(), (where / "ca.key").read_bytes()
    token = _openssl("rand", "-hex", "32", cwd=where).strip()
    users = ("admin", *COMPONENT_USERS, *(("replication", "sentinel") if sentinel else ()))
    return {
        "mesh-ca": {"tls.crt": cert, "tls.key": key, "ca.crt": cert},
        "mesh-kek": {"kek": _openssl("rand", "32", cwd=where)},
        "mesh-admin-token": {"token": token, "sha256": hashlib.sha256(token).hexdigest().encode()},
        "mesh-redis-users": {u: _openssl("rand", "-hex", "24", cwd=where).strip() for u in users},
    }


def _template(scratch: Path, *sets: str) -> str:
    """``helm template`` as :func:`render` runs it, as text."""
    args = ["template", "trellis", str(CHART), "--namespace", NAMESPACE]
    for item in sets:
        args += ["--set", item]
    return helm(*args, scratch=scratch)


def _references(rendered: Rendered) -> set[str]:
    """Every Secret a pod of the rendering names: volumes and environment."""
    named: set[str] = set()
    for kind in ("Deployment", "StatefulSet"):
        for workload in rendered.all(kind):
            spec: dict[str, Any] = workload["spec"]["template"]["spec"]
            named |= {v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
            for container in spec["containers"]:
                for item in container.get("env", []):
                    ref = item.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        named.add(ref["name"])
    return named


@pytest.mark.parametrize("mode", ["redis.mode=standalone", "redis.mode=sentinel"])
def test_with_every_secret_given_helm_template_is_the_same_bytes(tmp_path: Path, mode: str) -> None:
    first = _template(tmp_path / "one", mode, *GITOPS)
    assert first == _template(tmp_path / "two", mode, *GITOPS)
    # the chart makes them anew on each rendering without (what the values are for)
    assert _template(tmp_path / "three", mode) != _template(tmp_path / "four", mode)


@pytest.mark.parametrize("mode", ["redis.mode=standalone", "redis.mode=sentinel"])
def test_no_secret_of_the_four_is_rendered_and_the_pods_name_the_given(
    tmp_path: Path, mode: str
) -> None:
    rendered = render(tmp_path, mode, *GITOPS)
    assert not rendered.names("Secret")  # no Secret at all: all four are given
    assert _references(rendered) == set(GIVEN_NAMES.values())
    certmanager = {v["name"]: v.get("secret") for v in rendered.pod("certmanager")["volumes"]}
    assert certmanager["kek"]["secretName"] == "mesh-kek"
    assert certmanager["ca"]["secretName"] == "mesh-ca"
    for component in MODULES:
        token = rendered.env(component)["TRELLIS_ADMIN_TOKEN_SHA256"]["secretKeyRef"]
        assert token == {"name": "mesh-admin-token", "key": "sha256"}
    # nothing of a password is rendered: the ACL ConfigMap holds rules and the script only
    acl = rendered.get("ConfigMap", "trellis-redis-acl")["data"]
    assert "#" not in acl["redis.rules"] + acl.get("sentinel.rules", "")


def test_without_them_the_chart_makes_each_secret(tmp_path: Path) -> None:
    rendered = render(tmp_path)
    assert rendered.names("Secret") >= CHARTS_OWN
    assert _references(rendered) == CHARTS_OWN


# -- the chart's ACL script --------------------------------------------------------------


def _passwords(secret: dict[str, bytes], where: Path) -> dict[str, str]:
    where.mkdir(mode=0o700)
    for user, password in secret.items():
        (where / user).write_bytes(password)
    return {user: password.decode() for user, password in secret.items()}


@pytest.fixture(params=[False, True], ids=["standalone", "sentinel"])
def sentinel(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def test_the_acl_script_writes_the_codes_users_from_the_secret(
    tmp_path: Path, sentinel: bool
) -> None:
    mode = "redis.mode=sentinel" if sentinel else "redis.mode=standalone"
    rendered = render(tmp_path / "helm", mode, *GITOPS)
    secret = operator_secrets(tmp_path / "made", sentinel)["mesh-redis-users"]
    # a Secret made with `kubectl --from-file` may end a password with a newline
    secret = {**secret, "catalog": secret["catalog"] + b"\n"}
    passwords = {u: p.strip() for u, p in _passwords(secret, tmp_path / "users").items()}
    written = chart_acl(rendered, tmp_path / "users", tmp_path / "acl")
    assert written["users.acl"].read_text() == redisacl.aclfile_text(passwords)
    assert written["users.acl"].stat().st_mode & 0o777 == 0o600
    if sentinel:
        users = "\n".join(redisacl.sentinel_acl_lines(passwords)) + "\n"
        assert written["users.conf"].read_text() == users
        assert written["users.conf"].stat().st_mode & 0o777 == 0o600
    else:
        assert set(written) == {"users.acl"}
    text = "".join(path.read_text() for path in written.values())
    assert not any(p in text for p in passwords.values())  # hashes only


def test_the_acl_script_names_a_user_without_a_password(tmp_path: Path) -> None:
    rendered = render(tmp_path / "helm", *GITOPS)
    secret = dict(operator_secrets(tmp_path / "made")["mesh-redis-users"])
    del secret["proxy-cp"]
    _passwords(secret, tmp_path / "users")
    with pytest.raises(RuntimeError, match=r"user=proxy-cp .*needs a key proxy-cp"):
        chart_acl(rendered, tmp_path / "users", tmp_path / "acl")
    assert not (tmp_path / "acl" / "users.acl").exists()


# -- the rendered pods, run with the operator's Secrets ----------------------------------


@pytest.fixture
def kube() -> Iterator[KubeApi]:
    with KubeApi() as api:
        yield api


@pytest.mark.integration
def test_the_gitops_rendering_starts_with_the_operators_secrets(
    tmp_path: Path, kube: KubeApi
) -> None:
    rendered = render(tmp_path / "helm", *GITOPS)
    given = operator_secrets(tmp_path / "made")
    plane = ChartControlPlane(rendered, tmp_path, kube, given=given).start()
    try:
        assert isinstance(plane.redis, RedisServer)
        # Redis enforced the aclfile the chart's script wrote from the given passwords
        chart_acl_file = tmp_path / "redis" / "chart-acl" / "users.acl"
        assert plane.redis.aclfile.read_text() == chart_acl_file.read_text()
        # each component logged in to Redis as its user with the given password, and the
        # others joined certmanager, which signs with the given CA
        for process in plane.processes[1:]:
            assert f"join.done component={process.name}" in process.logs()
        assert (plane.state_dir / "trust-bundle.pem").read_bytes() == given["mesh-ca"]["tls.crt"]
        # the admin API takes the given token (its SHA-256 from the given Secret), only it
        certmanager = plane.processes[0]
        token = given["mesh-admin-token"]["token"].decode()
        for bearer, status in ((token, 200), (token[::-1], 403)):
            answer = certmanager.get(
                "/v1/identities", headers={"Authorization": f"Bearer {bearer}"}
            )
            assert answer.status_code == status, answer.text
    finally:
        plane.stop()

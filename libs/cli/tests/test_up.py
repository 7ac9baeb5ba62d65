"""The Redis `trellis up` starts: persistent, configured to rewrite its AOF, with its ACL
on (one user per service, each given a password file, never the password)."""

from __future__ import annotations

import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from trellis_cli import demo
from trellis_cli.up import redis_spec, service_specs
from trellis_common import redisacl
from trellis_common.testing.ports import free_port
from trellis_common.testing.waiting import eventually


@pytest.fixture
def up_redis(tmp_path: Path) -> Iterator[redis.Redis]:
    """The redis-server of ``trellis up``, run from its own argv on a free port."""
    port = free_port()
    spec = redis_spec(tmp_path, port=port)
    process = subprocess.Popen(
        list(spec.argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    admin = (tmp_path / "redis" / "users" / "admin").read_text().strip()
    client = redis.Redis(port=port, username="admin", password=admin)
    try:
        yield client
    finally:
        client.close()
        process.kill()
        process.wait()


async def test_the_local_redis_persists_every_write_and_rewrites_its_aof(
    up_redis: redis.Redis, tmp_path: Path
) -> None:
    def answers() -> bool:
        try:
            return bool(up_redis.ping())
        except redis.ConnectionError:
            return False

    await eventually(answers, timeout=10)
    config = {
        name: up_redis.config_get(name)[name]
        for name in (
            "appendonly",
            "appendfsync",
            "auto-aof-rewrite-percentage",
            "auto-aof-rewrite-min-size",
            "dir",
        )
    }
    assert config == {
        "appendonly": "yes",
        "appendfsync": "always",
        "auto-aof-rewrite-percentage": "100",
        "auto-aof-rewrite-min-size": str(64 * 1024 * 1024),
        "dir": str((tmp_path / "redis").resolve()),
    }


@pytest.mark.parametrize("before", [None, 0o755], ids=["new", "made-by-an-older-version"])
def test_the_redis_data_directory_is_0700(tmp_path: Path, before: int | None) -> None:
    data = tmp_path / "redis"
    if before is not None:
        data.mkdir(mode=before)
        data.chmod(before)
    spec = redis_spec(tmp_path, port=free_port())
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert str(data.resolve()) in spec.argv


async def test_the_local_redis_has_the_default_user_off_and_one_user_per_service(
    up_redis: redis.Redis, tmp_path: Path
) -> None:
    def answers() -> bool:
        try:
            return bool(up_redis.ping())
        except redis.ConnectionError:
            return False

    await eventually(answers, timeout=10)
    port = up_redis.connection_pool.connection_kwargs["port"]
    with redis.Redis(port=port) as anonymous, pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    users = {str(line).split()[1]: str(line).split() for line in up_redis.acl_list()}
    assert set(users) == {"default", "admin", *redisacl.COMPONENTS}
    assert "off" in users["default"]
    password = (tmp_path / "redis" / "users" / "catalog").read_text().strip()
    with redis.Redis(port=port, username="catalog", password=password) as catalog:
        assert catalog.ping()
        with pytest.raises(redis.exceptions.NoPermissionError):
            catalog.get("trellis:certmanager:ca")


def test_passwords_are_files_of_their_own_and_the_aclfile_holds_only_their_hashes(
    tmp_path: Path,
) -> None:
    spec = redis_spec(tmp_path, port=free_port())
    users = tmp_path / "redis" / "users"
    aclfile = tmp_path / "redis" / "users.acl"
    assert stat.S_IMODE(users.stat().st_mode) == 0o700
    assert stat.S_IMODE(aclfile.stat().st_mode) == 0o600
    passwords = {}
    for name in ("admin", *redisacl.COMPONENTS):
        assert stat.S_IMODE((users / name).stat().st_mode) == 0o600
        passwords[name] = (users / name).read_text().strip()
    assert len(set(passwords.values())) == len(passwords), "each user has its own"
    text = aclfile.read_text()
    assert not [name for name, p in passwords.items() if p in text]
    assert str(aclfile.resolve()) in spec.argv

    redis_spec(tmp_path, port=free_port())  # a second start keeps them
    assert {n: (users / n).read_text().strip() for n in passwords} == passwords


def test_each_service_is_given_its_own_password_file_not_its_password(tmp_path: Path) -> None:
    specs = service_specs(tmp_path, "redis://127.0.0.1:16379/0", tmp_path / "spec")
    assert specs, "the services are installed in this workspace"
    users = tmp_path / "redis" / "users"
    for spec in specs:
        password = (users / spec.name).read_text().strip()
        assert spec.env["TRELLIS_REDIS_USERNAME"] == spec.name
        assert spec.env["TRELLIS_REDIS_PASSWORD_FILE"] == str((users / spec.name).resolve())
        assert password not in " ".join([*spec.argv, *spec.env.values()])


def test_an_external_redis_keeps_the_credentials_of_its_url(tmp_path: Path) -> None:
    url = "redis://ops:secret@redis.example:6379/0"
    specs = service_specs(tmp_path, url, tmp_path / "spec", local_redis=False)
    for spec in specs:
        assert spec.env["TRELLIS_REDIS_URL"] == url
        assert "TRELLIS_REDIS_PASSWORD_FILE" not in spec.env
    assert not (tmp_path / "redis").exists(), "no users are made for a Redis we do not run"


def test_the_injector_serves_its_webhook_locally(tmp_path: Path) -> None:
    specs = {s.name: s for s in service_specs(tmp_path, "redis://x:1/0", tmp_path / "spec")}
    injector = specs["injector"]
    assert 9443 in injector.ports  # checked free before anything starts
    assert "webhook https://127.0.0.1:9443/mutate" in injector.address


def test_a_kubeconfig_adds_endpoints_k8s_and_is_given_to_who_reads_the_api(
    tmp_path: Path,
) -> None:
    without = {s.name for s in service_specs(tmp_path, "redis://x:1/0", tmp_path / "spec")}
    assert "endpoints-k8s" not in without
    kubeconfig = tmp_path / "kubeconfig"
    specs = {
        s.name: s
        for s in service_specs(tmp_path, "redis://x:1/0", tmp_path / "spec", kubeconfig=kubeconfig)
    }
    k8s = specs["endpoints-k8s"]
    assert k8s.env["TRELLIS_ENDPOINTS_K8S_KUBECONFIG"] == str(kubeconfig)
    assert k8s.ports == (15030, 15031)
    assert specs["injector"].env["TRELLIS_INJECTOR_KUBECONFIG"] == str(kubeconfig)
    assert specs["catalog"].env["TRELLIS_CATALOG_KUBECONFIG"] == str(kubeconfig)
    assert specs["endpoints-vm"].env["TRELLIS_ENDPOINTS_VM_KUBECONFIG"] == str(kubeconfig)
    assert not any("KUBECONFIG" in name for name in specs["proxy-cp"].env)


def test_services_start_after_redis_and_certmanager(tmp_path: Path) -> None:
    specs = {s.name: s for s in service_specs(tmp_path, "redis://x:1/0", tmp_path / "spec")}
    assert specs["certmanager"].after == ("redis",)
    for name in ("endpoints-vm", "catalog", "proxy-cp", "injector"):
        assert specs[name].after == ("redis", "certmanager"), name


def test_proxy_cp_replicas_share_its_ports_identity_and_redis_user(tmp_path: Path) -> None:
    specs = {
        s.name: s
        for s in service_specs(tmp_path, "redis://x:1/0", tmp_path / "spec", proxy_cp_replicas=3)
    }
    first, second, third = specs["proxy-cp"], specs["proxy-cp-2"], specs["proxy-cp-3"]
    names = list(specs)
    assert names.index("proxy-cp") < names.index("proxy-cp-2") < names.index("proxy-cp-3")
    # xDS, admin, Linkerd Destination, pod enrollment: checked free before anything starts
    assert first.ports == (15128, 15051, 8086, 15012)
    assert (second.ports, third.ports) == ((15072,), (15073,))  # the rest is shared
    assert not {*second.ports, *third.ports} & set(demo.ports())
    assert second.env["TRELLIS_INSTANCE"] == "proxy-cp-2"
    assert second.env["TRELLIS_PROXY_CP_ADMIN_PORT"] == "15072"
    assert second.env["TRELLIS_REDIS_USERNAME"] == "proxy-cp"
    assert second.env["TRELLIS_REDIS_PASSWORD_FILE"] == first.env["TRELLIS_REDIS_PASSWORD_FILE"]
    assert second.argv == first.argv
    assert second.prepare is not None
    second.prepare()  # its join token is proxy-cp's: the same component identity
    assert (tmp_path / "join" / "proxy-cp").exists()
    # the one token file: each replica starts once the one before it has traded it
    assert (second.after, third.after) == (
        ("redis", "certmanager", "proxy-cp"),
        ("redis", "certmanager", "proxy-cp-2"),
    )
    assert "proxy-cp-1" not in specs
    default = {s.name for s in service_specs(tmp_path, "redis://x:1/0", tmp_path / "spec")}
    assert "proxy-cp-2" not in default  # one on a small machine

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
from trellis_cli.replicas import COMPONENT_ORDER, parse_replicas
from trellis_cli.up import SERVICES, redis_spec, service_specs
from trellis_runtime import redisacl
from trellis_testing.ports import free_port
from trellis_testing.waiting import eventually


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
        for s in service_specs(
            tmp_path, "redis://x:1/0", tmp_path / "spec", replicas={"proxy-cp": 3}
        )
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


def test_every_component_replicates_on_its_shared_ports_with_an_admin_port_of_its_own(
    tmp_path: Path,
) -> None:
    counts = parse_replicas(("catalog=3", "certmanager=2"), proxy_cp=2)
    assert counts == {
        "certmanager": 2,
        "endpoints-vm": 1,
        "endpoints-k8s": 1,
        "catalog": 3,
        "proxy-cp": 2,
        "injector": 1,
    }
    specs = {
        s.name: s
        for s in service_specs(
            tmp_path, "redis://x:1/0", tmp_path / "spec", replicas=counts, kubeconfig=tmp_path
        )
    }
    replicas = [n for n in specs if n[-1].isdigit()]
    assert replicas == ["certmanager-2", "catalog-2", "catalog-3", "proxy-cp-2"]
    admin_ports = [p for s in specs.values() for p in s.ports]
    assert len(admin_ports) == len(set(admin_ports))  # no two processes claim one port
    assert not set(admin_ports) & set(demo.ports())
    catalog_2 = specs["catalog-2"]
    assert catalog_2.env["TRELLIS_INSTANCE"] == "catalog-2"
    assert catalog_2.env["TRELLIS_CATALOG_ADMIN_PORT"] == str(catalog_2.ports[0])
    assert catalog_2.env["TRELLIS_CATALOG_KUBECONFIG"] == str(tmp_path)
    assert catalog_2.address.startswith("grpc :15010 (shared)")
    # certmanager's replica joins with the first certmanager, like every other service
    assert specs["certmanager-2"].after == ("redis", "certmanager")
    assert specs["catalog-3"].after == ("redis", "certmanager", "catalog-2")


def test_ha_is_two_of_everything_and_a_component_value_still_wins() -> None:
    counts = parse_replicas(("injector=3",), ha=True)
    assert counts == {
        "certmanager": 2,
        "endpoints-vm": 2,
        "endpoints-k8s": 2,
        "catalog": 2,
        "proxy-cp": 2,
        "injector": 3,
    }


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("catalog", "COMPONENT=N"),
        ("catalogue=2", "one of certmanager"),
        ("catalog=0", "from 1 to 16"),
        ("catalog=x", "from 1 to 16"),
        ("catalog=17", "from 1 to 16"),
    ],
)
def test_a_bad_replicas_value_is_named(value: str, names: str) -> None:
    with pytest.raises(ValueError, match=names) as refused:
        parse_replicas((value,))
    assert repr(value) in str(refused.value)


def test_the_replica_port_plan_follows_the_services_order() -> None:
    assert tuple(name for name, *_ in SERVICES) == COMPONENT_ORDER

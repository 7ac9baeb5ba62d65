"""Every service's command line: the flags and variables that worked before the skeleton
(each main.py had an argparse mirror of some settings) still work under the same names,
``--help`` lists every setting with its help, and a bad value stops a real process with
exit code 2 and one line naming the setting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trellis_catalog.main import service as catalog
from trellis_certmanager.domain.keys import KeyAlgorithm
from trellis_certmanager.main import service as certmanager
from trellis_endpoints_vm.main import service as endpoints_vm
from trellis_injector.main import service as injector
from trellis_proxy_cp.main import service as proxy_cp
from trellis_runtime.service import Service
from trellis_runtime.settings import ServiceSettings

SERVICES: list[Service[ServiceSettings]] = [catalog, certmanager, endpoints_vm, injector, proxy_cp]  # type: ignore[list-item]

COMMON = [
    "--grpc-port", "1", "--admin-port", "2", "--bind-host", "0.0.0.0",
    "--state-dir", "/state", "--redis-url", "redis://r:1/0",
]  # fmt: skip

# The flags each service's argparse parser took, with what they set.
OWN: dict[str, tuple[list[str], dict[str, object]]] = {
    "catalog": (
        ["--spec-dir", "/spec", "--certmanager-address", "c:1"],
        {"spec_dir": Path("/spec"), "certmanager_address": "c:1"},
    ),
    "certmanager": (
        ["--ca-cert-file", "c.pem", "--ca-key-file", "k.pem", "--ca-bundle-file", "b.pem",
         "--key-algorithm", "rsa-2048"],
        {"ca_cert_file": Path("c.pem"), "ca_key_file": Path("k.pem"),
         "ca_bundle_file": Path("b.pem"), "key_algorithm": KeyAlgorithm.RSA_2048},
    ),
    "endpoints-vm": (["--spec-dir", "/spec"], {"spec_dir": Path("/spec")}),
    "injector": (
        ["--xds-host", "x", "--xds-port", "3", "--certmanager-address", "c:1",
         "--catalog-address", "k:2", "--trust-domain", "example.org"],
        {"xds_host": "x", "xds_port": 3, "certmanager_address": "c:1",
         "catalog_address": "k:2", "trust_domain": "example.org"},
    ),
    "proxy-cp": (
        ["--xds-host", "127.0.0.1", "--catalog-address", "k:2", "--certmanager-address", "c:1"],
        {"xds_host": "127.0.0.1", "catalog_address": "k:2", "certmanager_address": "c:1"},
    ),
}  # fmt: skip

SHARED_ENV: dict[str, tuple[str, object]] = {
    "TRELLIS_REDIS_URL": ("redis_url", "redis://env:1/0"),
    "TRELLIS_STATE_DIR": ("state_dir", Path("/env-state")),
    "TRELLIS_LOG_FORMAT": ("log_format", "json"),
    "TRELLIS_LOG_LEVEL": ("log_level", "DEBUG"),
    "TRELLIS_ADMIN_TOKEN": ("admin_token", "env-token"),
    "TRELLIS_INSTANCE": ("instance", "env-instance"),
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TRELLIS_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize("service", SERVICES, ids=lambda s: s.name)
def test_the_flags_of_before_still_work(service: Service[ServiceSettings]) -> None:
    argv, expected = OWN[service.name]

    settings = service.load([*COMMON, *argv])

    assert (settings.grpc_port, settings.admin_port, settings.bind_host) == (1, 2, "0.0.0.0")
    assert (settings.state_dir, settings.redis_url) == (Path("/state"), "redis://r:1/0")
    assert {name: getattr(settings, name) for name in expected} == expected


@pytest.mark.parametrize("service", SERVICES, ids=lambda s: s.name)
def test_the_variables_of_before_still_work(
    service: Service[ServiceSettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, (_, value) in SHARED_ENV.items():
        monkeypatch.setenv(name, str(value))
    prefix = service.settings.env_prefix()
    monkeypatch.setenv(f"{prefix}GRPC_PORT", "7")
    monkeypatch.setenv(f"{prefix}BIND_HOST", "10.0.0.1")
    if "spec_dir" in service.settings.model_fields:
        monkeypatch.setenv("TRELLIS_SPEC_DIR", "/env-spec")

    settings = service.load([])

    assert {field: getattr(settings, field) for field, _ in SHARED_ENV.values()} == dict(
        SHARED_ENV.values()
    )
    assert (settings.grpc_port, settings.bind_host) == (7, "10.0.0.1")
    if "spec_dir" in service.settings.model_fields:
        assert settings.spec_dir == Path("/env-spec")  # type: ignore[attr-defined]
    assert service.load(["--grpc-port", "8"]).grpc_port == 8


@pytest.mark.parametrize("service", SERVICES, ids=lambda s: s.name)
def test_help_lists_every_setting(
    service: Service[ServiceSettings], capsys: pytest.CaptureFixture[str]
) -> None:
    assert service.main(["--help"]) == 0

    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith(f"usage: trellis-{service.name} ")
    for name, field in service.settings.model_fields.items():
        assert field.description, f"{service.name}: {name} has no help"
        assert f"--{name.replace('_', '-')} " in text
        assert " ".join(field.description.split()) in text


def test_a_bad_setting_stops_the_process_with_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trellis_injector.main", "--trust-domain", "Not A Domain"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TRELLIS_STATE_DIR": str(tmp_path)},
    )

    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(
        "trellis-injector: bad setting trust_domain "
        "(--trust-domain / TRELLIS_INJECTOR_TRUST_DOMAIN)"
    )

"""Service settings: flags (keyword arguments), then prefixed, then shared environment
variables, then defaults; every field a flag with its help."""

from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import ValidationError

from trellis_runtime import settings as settings_module
from trellis_runtime.settings import DEFAULT_REDIS_URL, ServiceSettings, SpecDirSettings

ENV_NAMES = (
    "TRELLIS_X_GRPC_PORT",
    "TRELLIS_X_ADMIN_PORT",
    "TRELLIS_GRPC_PORT",
    "TRELLIS_REDIS_URL",
    "TRELLIS_STATE_DIR",
    "TRELLIS_LOG_FORMAT",
    "TRELLIS_LOG_LEVEL",
    "TRELLIS_ADMIN_TOKEN",
    "TRELLIS_INSTANCE",
    "TRELLIS_DEBUG_ENDPOINTS",
    "TRELLIS_X_DEBUG_ENDPOINTS",
    "TRELLIS_X_REDIS_URL",
    "TRELLIS_REDIS_USERNAME",
    "TRELLIS_REDIS_PASSWORD_FILE",
    "TRELLIS_SPEC_DIR",
    "TRELLIS_W_SPEC_DIR",
    "SPEC_DIR",
    "REDIS_URL",
    "STATE_DIR",
    "LOG_LEVEL",
    "INSTANCE",
    "ADMIN_TOKEN",
)


class XSettings(ServiceSettings):
    """X: a test service."""

    service_name: ClassVar[str] = "x"


class WatcherSettings(SpecDirSettings):
    service_name: ClassVar[str] = "w"


def load(**flags: Any) -> XSettings:
    """Settings as a service builds them: its command line flags over the environment."""
    return XSettings(**flags)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start from an environment without any variable these settings read."""
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def test_defaults() -> None:
    settings = load()

    assert settings.redis_url == DEFAULT_REDIS_URL
    assert settings.state_dir == Path(".trellis")
    assert settings.log_format == "kv"
    assert settings.admin_token is None
    assert settings.grpc_port == 0
    assert settings.instance_name == "x"
    assert settings.grpc_address == "127.0.0.1:0"
    assert settings.debug_endpoints is False  # no API docs, no gRPC reflection


def test_reads_prefixed_and_shared_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRELLIS_X_GRPC_PORT", "15099")
    monkeypatch.setenv("TRELLIS_REDIS_URL", "redis://10.0.0.5:6379/2")
    monkeypatch.setenv("TRELLIS_STATE_DIR", "/var/lib/trellis")
    monkeypatch.setenv("TRELLIS_INSTANCE", "x-2")

    settings = load()

    assert settings.grpc_port == 15099
    assert settings.grpc_address == "127.0.0.1:15099"
    assert settings.redis_url == "redis://10.0.0.5:6379/2"
    assert settings.state_dir == Path("/var/lib/trellis")
    assert settings.instance_name == "x-2"


def test_another_service_prefix_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRELLIS_GRPC_PORT", "15098")

    assert load().grpc_port == 0


def test_unprefixed_variables_are_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://elsewhere:6379/0")
    monkeypatch.setenv("STATE_DIR", "/elsewhere")
    monkeypatch.setenv("LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("INSTANCE", "someone-else")
    monkeypatch.setenv("ADMIN_TOKEN", "not-ours")

    settings = load()

    assert settings.redis_url == DEFAULT_REDIS_URL
    assert settings.state_dir == Path(".trellis")
    assert settings.log_level == "INFO"
    assert settings.instance_name == "x"
    assert settings.admin_token is None


def test_keyword_arguments_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRELLIS_X_GRPC_PORT", "15099")
    monkeypatch.setenv("TRELLIS_REDIS_URL", "redis://10.0.0.5:6379/2")
    monkeypatch.setenv("TRELLIS_ADMIN_TOKEN", "from-env")

    settings = load(grpc_port=16000, redis_url="redis://127.0.0.1:1/0", admin_token="flag")

    assert settings.grpc_port == 16000
    assert settings.redis_url == "redis://127.0.0.1:1/0"
    assert settings.admin_token == "flag"


def test_an_invalid_port_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRELLIS_X_ADMIN_PORT", "70000")

    with pytest.raises(ValidationError) as caught:
        load()

    assert [error["loc"] for error in caught.value.errors()] == [("admin_port",)]
    assert "admin_port" in str(caught.value)


def test_an_invalid_keyword_port_is_rejected_too() -> None:
    with pytest.raises(ValidationError, match="grpc_port"):
        load(grpc_port=70000)


def test_an_unknown_log_format_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRELLIS_LOG_FORMAT", "xml")

    with pytest.raises(ValidationError, match=r"log_format|TRELLIS_LOG_FORMAT"):
        load()


def test_settings_are_frozen() -> None:
    settings = load()

    with pytest.raises(ValidationError):
        settings.grpc_port = 1


def flags(*argv: str) -> XSettings:
    return settings_module.from_command_line(XSettings, argv, "trellis-x")


def test_the_env_prefix_comes_from_the_service_name() -> None:
    class Dashed(ServiceSettings):
        service_name: ClassVar[str] = "proxy-cp"

    assert XSettings.env_prefix() == "TRELLIS_X_"
    assert Dashed.env_prefix() == "TRELLIS_PROXY_CP_"


def test_every_field_is_a_flag() -> None:
    settings = flags(
        "--grpc-port", "5", "--admin-port", "6", "--bind-host", "0.0.0.0",
        "--state-dir", "/s", "--redis-url", "redis://flag:1/0", "--log-format", "json",
        "--log-level", "DEBUG", "--admin-token", "t", "--admin-token-sha256", "ab" * 32,
        "--instance", "x-9", "--metrics-port", "9090", "--metrics-host", "10.0.0.7",
        "--registry-ttl", "2.5", "--debug-endpoints", "--trust-bundle-file", "/b.pem",
        "--join-token-file", "/j", "--service-account-token-file", "/sa",
        "--certmanager-admin-address", "cm:1", "--redis-username", "u",
        "--redis-password-file", "/p", "--redis-audit-interval", "3",
        "--redis-min-replicas-ack", "1",
        "--leader-election", "redis", "--lease-duration", "9", "--lease-renew-deadline", "6",
        "--lease-retry-period", "1", "--lease-namespace", "mesh",
    )  # fmt: skip

    assert settings.model_dump() == {
        "grpc_port": 5,
        "admin_port": 6,
        "bind_host": "0.0.0.0",
        "metrics_port": 9090,
        "metrics_host": "10.0.0.7",
        "state_dir": Path("/s"),
        "redis_url": "redis://flag:1/0",
        "redis_username": "u",
        "redis_password_file": Path("/p"),
        "redis_audit_interval": 3.0,
        "log_format": "json",
        "log_level": "DEBUG",
        "admin_token": "t",
        "admin_token_sha256": "ab" * 32,
        "instance": "x-9",
        "registry_ttl": 2.5,
        "debug_endpoints": True,
        "trust_bundle_file": Path("/b.pem"),
        "join_token_file": Path("/j"),
        "service_account_token_file": Path("/sa"),
        "certmanager_admin_address": "cm:1",
        "redis_min_replicas_ack": 1,
        "leader_election": "redis",
        "lease_duration": 9.0,
        "lease_renew_deadline": 6.0,
        "lease_retry_period": 1.0,
        "lease_namespace": "mesh",
    }


def test_flags_win_over_the_service_variable_which_wins_over_the_shared_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert flags().redis_url == DEFAULT_REDIS_URL
    monkeypatch.setenv("TRELLIS_REDIS_URL", "redis://shared:1/0")
    assert flags().redis_url == "redis://shared:1/0"
    monkeypatch.setenv("TRELLIS_X_REDIS_URL", "redis://service:1/0")
    assert flags().redis_url == "redis://service:1/0"
    assert flags("--redis-url", "redis://flag:1/0").redis_url == "redis://flag:1/0"


def test_a_flag_wins_over_the_service_variable_of_a_service_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRELLIS_X_GRPC_PORT", "15099")

    assert flags().grpc_port == 15099
    assert flags("--grpc-port", "16000").grpc_port == 16000


def test_flags_not_given_leave_the_environment_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRELLIS_STATE_DIR", "/from/env")

    settings = flags("--grpc-port", "1")

    assert settings.state_dir == Path("/from/env")
    assert settings.admin_port == 0


def test_the_spec_dir_is_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    def load(*argv: str) -> WatcherSettings:
        return settings_module.from_command_line(WatcherSettings, argv, "w")

    monkeypatch.setenv("SPEC_DIR", "/not/ours")
    assert load().spec_dir is None
    monkeypatch.setenv("TRELLIS_SPEC_DIR", "/mesh")
    assert load().spec_dir == Path("/mesh")
    monkeypatch.setenv("TRELLIS_W_SPEC_DIR", "/own")
    assert load().spec_dir == Path("/own")
    assert load("--spec-dir", "/flag", "--spec-poll-interval", "0.1").spec_dir == Path("/flag")
    assert load("--spec-poll-interval", "0.1").spec_poll_interval == 0.1


def test_an_unknown_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        flags("--no-such-flag", "1")

    assert exited.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err


def test_help_lists_every_flag_with_its_description(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        flags("--help")

    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith("usage: trellis-x")
    assert "X: a test service." in text
    for name, field in XSettings.model_fields.items():
        assert field.description, f"{name} has no description"
        assert f"--{name.replace('_', '-')} " in text
        assert " ".join(field.description.split()) in text
    assert "TRELLIS_X_SOME_NAME" in text
    assert "--redis-url, --redis-username, --redis-password-file, --state-dir" in text


def test_a_bad_value_is_described_in_one_line_naming_where_it_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRELLIS_LOG_FORMAT", "xml")
    with pytest.raises(ValidationError) as caught:
        flags("--grpc-port", "70000")

    line = settings_module.describe_error(XSettings, caught.value)

    assert "\n" not in line
    assert line.startswith("bad setting ")
    assert "grpc_port (--grpc-port / TRELLIS_X_GRPC_PORT): " in line
    assert "less than or equal to 65535, got '70000'" in line
    assert "log_format (--log-format / TRELLIS_X_LOG_FORMAT / TRELLIS_LOG_FORMAT): " in line


def test_a_bad_admin_token_is_not_repeated() -> None:
    with pytest.raises(ValidationError) as caught:
        XSettings(admin_token=["secret"])  # type: ignore[arg-type]

    line = settings_module.describe_error(XSettings, caught.value)

    assert "admin_token (--admin-token" in line
    assert "secret" not in line


def test_the_log_level_is_checked_with_the_settings() -> None:
    assert flags("--log-level", "debug").log_level == "DEBUG"
    with pytest.raises(ValidationError, match="not a log level"):
        flags("--log-level", "loud")


def test_debug_endpoints_are_a_mesh_wide_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert flags().debug_endpoints is False
    monkeypatch.setenv("TRELLIS_DEBUG_ENDPOINTS", "true")
    assert flags().debug_endpoints is True
    monkeypatch.setenv("TRELLIS_X_DEBUG_ENDPOINTS", "false")
    assert flags().debug_endpoints is False
    assert flags("--debug-endpoints").debug_endpoints is True

"""Service settings: keyword arguments, then prefixed, then shared environment variables."""

from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsConfigDict

from trellis_common.settings import DEFAULT_REDIS_URL, ServiceSettings

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
    "REDIS_URL",
    "STATE_DIR",
    "LOG_LEVEL",
    "INSTANCE",
    "ADMIN_TOKEN",
)


class XSettings(ServiceSettings):
    service_name: ClassVar[str] = "x"
    model_config = SettingsConfigDict(env_prefix="TRELLIS_X_")


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

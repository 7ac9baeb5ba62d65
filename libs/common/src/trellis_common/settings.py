"""Settings shared by every Trellis service.

Each service declares one pydantic-settings class that extends :class:`ServiceSettings`.
Values come, in order of precedence, from explicit keyword arguments (the service's command
line flags), then ``TRELLIS_<SERVICE>_<FIELD>`` environment variables, then the mesh-wide
``TRELLIS_<FIELD>`` variables for the fields every service shares (Redis URL, state
directory, log format, admin token), then the defaults below, which are the ports of
ARCHITECTURE.md. No module reads the environment on its own: settings are passed in.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_REDIS_URL = "redis://127.0.0.1:16379/0"


class Ports:
    """Default ports, one pair (gRPC, admin REST) per service, from ARCHITECTURE.md."""

    CATALOG = (15010, 15011)
    CERTMANAGER = (15020, 15021)
    ENDPOINTS_K8S = (15030, 15031)
    ENDPOINTS_VM = (15040, 15041)
    PROXY_CP = (15128, 15051)
    INJECTOR_ADMIN = 15061


def _shared(name: str) -> AliasChoices:
    """Read a shared field from ``TRELLIS_<NAME>``; keywords use the field name (populate_by_name).

    The bare field name is no alias: the environment is case-insensitive, so it would
    also pick up unrelated ``REDIS_URL``, ``LOG_LEVEL`` or ``INSTANCE`` variables.
    """
    return AliasChoices(f"TRELLIS_{name.upper()}")


class ServiceSettings(BaseSettings):
    """Fields every service has. Subclasses set ``service_name`` and their env prefix."""

    service_name: ClassVar[str] = "service"
    model_config = SettingsConfigDict(
        env_prefix="TRELLIS_", populate_by_name=True, extra="ignore", frozen=True
    )

    redis_url: str = Field(DEFAULT_REDIS_URL, validation_alias=_shared("redis_url"))
    state_dir: Path = Field(Path(".trellis"), validation_alias=_shared("state_dir"))
    log_format: Literal["kv", "json"] = Field("kv", validation_alias=_shared("log_format"))
    log_level: str = Field("INFO", validation_alias=_shared("log_level"))
    admin_token: str | None = Field(None, validation_alias=_shared("admin_token"))
    instance: str = Field("", validation_alias=_shared("instance"))

    bind_host: str = "127.0.0.1"
    grpc_port: int = Field(0, ge=0, le=65535)
    admin_port: int = Field(0, ge=0, le=65535)
    registry_ttl: float = Field(10.0, gt=0)

    @property
    def instance_name(self) -> str:
        """The name this process announces itself with (defaults to the service name)."""
        return self.instance or self.service_name

    @property
    def grpc_address(self) -> str:
        return f"{self.bind_host}:{self.grpc_port}"


def service_parser(prog: str, description: str, env_prefix: str) -> argparse.ArgumentParser:
    """The command line every service shares; services add their own flags to it."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=f"{description} Settings also come from {env_prefix}* and TRELLIS_* "
        "environment variables; flags win.",
    )
    parser.add_argument("--grpc-port", type=int)
    parser.add_argument("--admin-port", type=int)
    parser.add_argument("--bind-host", help="admin (and internal gRPC) address")
    parser.add_argument("--state-dir")
    parser.add_argument("--redis-url")
    return parser


def given(parser: argparse.ArgumentParser, argv: list[str] | None) -> dict[str, Any]:
    """The flags that were given, as settings keyword arguments."""
    return {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}

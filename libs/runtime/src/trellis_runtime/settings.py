"""Settings shared by every Trellis service, and where their values come from.

Each service declares one pydantic-settings class that extends :class:`ServiceSettings`
and names itself with ``service_name``. Every field is then, with nothing more written:

- a command line flag, ``--grpc-port`` for ``grpc_port`` (pydantic-settings' CLI source,
  kebab case; its ``description`` is the ``--help`` text);
- a ``TRELLIS_<SERVICE>_<FIELD>`` environment variable (``TRELLIS_CATALOG_GRPC_PORT``);
- for the fields marked :data:`SHARED` (Redis URL, state directory, log format, admin
  token, spec directory, debug endpoints...), also the mesh-wide ``TRELLIS_<FIELD>``
  (``TRELLIS_REDIS_URL``), which ``trellis up`` sets once for every service.

Precedence: flags (which reach the class as keyword arguments), then the service's
variable, then the shared one, then the defaults below (the ports of ARCHITECTURE.md). The
shared variables are read by a source of their own rather than through validation aliases:
an alias would rename the flag (``--TRELLIS-REDIS-URL``), and the bare field name as an
alias would pick up unrelated ``REDIS_URL`` or ``INSTANCE`` variables (the environment is
case-insensitive). No module reads the environment on its own: settings are passed in.
"""

from __future__ import annotations

import argparse
import inspect
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import AfterValidator, Field, ValidationError, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    CliSettingsSource,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from trellis_common.defaults import DEFAULT_MESH_NAME
from trellis_common.defaults import DEFAULT_REDIS_URL as DEFAULT_REDIS_URL
from trellis_common.defaults import TRUST_BUNDLE_FILE as TRUST_BUNDLE_FILE
from trellis_common.defaults import Ports as Ports

SHARED_PREFIX = "TRELLIS_"


class Shared:
    """Marks a field that is also read from the mesh-wide ``TRELLIS_<FIELD>`` variable."""

    def __repr__(self) -> str:
        return "SHARED"


SHARED = Shared()


def grpc_port(default: int) -> Any:
    """The ``grpc_port`` field with a service's own default."""
    return Field(default=default, ge=0, le=65535, description="gRPC port (0: any free port)")


def admin_port(default: int) -> Any:
    """The ``admin_port`` field with a service's own default."""
    return Field(default=default, ge=0, le=65535, description="admin REST port (0: any free port)")


def mesh_name(what: str) -> Any:
    """The ``mesh_name`` field: which namespaces a service reading the API server reads
    (``what`` it does with them, for the description)."""
    return Field(
        DEFAULT_MESH_NAME,
        min_length=1,
        description=f"namespaces labelled trellis.dev/monitored-by=<mesh name> are {what}",
    )


def watch_timeout() -> Any:
    """The ``watch_timeout`` field of a service's informers."""
    return Field(
        60, ge=1, description="seconds the API server keeps each watch open before it resumes"
    )


def _log_level(value: str) -> str:
    """A level name the logging module knows (any case): checked here, not at start-up."""
    level = value.upper()
    if level not in logging.getLevelNamesMapping():
        raise ValueError("not a log level: DEBUG, INFO, WARNING, ERROR or CRITICAL")
    return level


def is_shared(field: FieldInfo) -> bool:
    return any(isinstance(m, Shared) for m in field.metadata)


class SharedEnvSource(EnvSettingsSource):
    """``TRELLIS_<FIELD>`` for the fields marked :data:`SHARED`, and for no other."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls, env_prefix=SHARED_PREFIX)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if not is_shared(field):
            return None, field_name, False
        return super().get_field_value(field, field_name)


class ServiceSettings(BaseSettings):
    """Fields every service has. Subclasses set ``service_name`` (and so their env prefix)."""

    service_name: ClassVar[str] = "service"
    model_config = SettingsConfigDict(
        extra="ignore",
        frozen=True,
        cli_kebab_case=True,
        cli_hide_none_type=True,
        cli_implicit_flags=True,
    )

    redis_url: Annotated[str, SHARED] = Field(
        default=DEFAULT_REDIS_URL,
        description="Redis holding the registry, stores and signals (credentials may be in "
        "it: redis://user:password@host:port/db)",
    )
    redis_username: Annotated[str, SHARED] = Field(
        default="",
        description="Redis ACL user (empty: the URL's, else the service's name); used with "
        "--redis-password-file",
    )
    redis_password_file: Annotated[Path | None, SHARED] = Field(
        default=None,
        description="file holding this service's Redis password (0600; trellis up writes "
        "one per component, a Kubernetes Secret can be mounted as one)",
    )
    redis_audit_interval: float = Field(
        default=0.0,
        ge=0,
        description="seconds between reads of what Redis refused (ACL LOG, error counts), "
        "logged and counted; 0: off (the catalog does it)",
    )
    state_dir: Annotated[Path, SHARED] = Field(
        default=Path(".trellis"), description="where the admin token and service addresses are kept"
    )
    log_format: Annotated[Literal["kv", "json"], SHARED] = Field(
        default="kv", description="log lines as key=value or JSON"
    )
    log_level: Annotated[str, SHARED, AfterValidator(_log_level)] = Field(
        default="INFO", description="DEBUG, INFO, WARNING..."
    )
    admin_token: Annotated[str | None, SHARED] = Field(
        default=None,
        description="token of the admin API (unset: the one kept in the state directory)",
    )
    admin_token_sha256: Annotated[str | None, SHARED] = Field(
        default=None,
        description="SHA-256 (hex) of the admin API's token: the service keeps no token",
    )
    instance: Annotated[str, SHARED] = Field(
        default="", description="name announced in the registry (empty: the service name)"
    )

    bind_host: str = Field(default="127.0.0.1", description="admin (and internal gRPC) address")
    grpc_port: int = grpc_port(0)
    admin_port: int = admin_port(0)
    metrics_port: Annotated[int | None, SHARED] = Field(
        default=None,
        ge=0,
        le=65535,
        description="also serve GET /metrics on this port over plain HTTP, for a Prometheus "
        "without a mesh certificate (unset: only the admin port's /metrics, under TLS)",
    )
    metrics_host: Annotated[str, SHARED] = Field(
        default="",
        description="address of the plain-HTTP metrics port (empty: the bind host; the chart "
        "gives the pod IP)",
    )
    debug_endpoints: Annotated[bool, SHARED] = Field(
        default=False,
        description="serve the API docs (/docs, /redoc, /openapi.json) and gRPC server "
        "reflection: they map every route and RPC for whoever can reach the port",
    )
    registry_ttl: float = Field(
        default=10.0, gt=0, description="seconds the registry record outlives a silent process"
    )
    trust_bundle_file: Annotated[Path | None, SHARED] = Field(
        default=None,
        description="the mesh's trust bundle (PEM): services check certmanager's certificate "
        "against it to join (unset: the one certmanager writes in the state directory)",
    )
    join_token_file: Path | None = Field(
        default=None,
        description="the one time join token this service trades for its certificate, deleted "
        "once read (unset: join/<service> in the state directory)",
    )
    service_account_token_file: Annotated[Path | None, SHARED] = Field(
        default=None,
        description="in Kubernetes: the projected ServiceAccount token to join with when there "
        "is no join token",
    )
    certmanager_admin_address: Annotated[str, SHARED] = Field(
        default="",
        description="host:port of certmanager's admin API, to join (empty: from the registry)",
    )
    redis_min_replicas_ack: Annotated[int, SHARED] = Field(
        default=0,
        ge=0,
        description="replicas that must have a write that has to survive a failover (a VM "
        "registration, a certificate record, a revocation) before it is answered (Redis WAIT); "
        "0: none asked (a Redis without replicas)",
    )
    leader_election: Annotated[Literal["auto", "kubernetes", "redis"], SHARED] = Field(
        default="auto",
        description="how replicas elect the one that does single-writer work: a Kubernetes "
        "Lease, a Redis lock, or auto (a Lease with a kubeconfig or in a pod, else Redis)",
    )
    lease_duration: Annotated[float, SHARED] = Field(
        default=15.0,
        gt=0,
        description="seconds a leader's lease lasts unrenewed; a standby takes over after it",
    )
    lease_renew_deadline: Annotated[float, SHARED] = Field(
        default=10.0,
        gt=0,
        description="seconds a leader keeps leading without a successful renewal; it steps "
        "down then, before its lease expires (less than --lease-duration)",
    )
    lease_retry_period: Annotated[float, SHARED] = Field(
        default=2.0,
        gt=0,
        description="seconds between attempts to renew or acquire (less than "
        "--lease-renew-deadline)",
    )
    lease_namespace: Annotated[str, SHARED] = Field(
        default="",
        description="namespace of the leader election Leases (empty: the pod's own, else "
        "trellis-system)",
    )

    @field_validator("lease_renew_deadline")
    @classmethod
    def _renew_before_expiry(cls, value: float, info: ValidationInfo) -> float:
        duration = info.data.get("lease_duration")
        if duration is not None and value >= duration:
            raise ValueError(
                f"lease_renew_deadline must be less than lease_duration ({duration}): a "
                "leader steps down before its lease expires"
            )
        return value

    @field_validator("lease_retry_period")
    @classmethod
    def _retry_within_deadline(cls, value: float, info: ValidationInfo) -> float:
        deadline = info.data.get("lease_renew_deadline")
        if deadline is not None and value >= deadline:
            raise ValueError(
                f"lease_retry_period must be less than lease_renew_deadline ({deadline}): a "
                "leader must be able to retry a renewal before it has to step down"
            )
        return value

    @classmethod
    def env_prefix(cls) -> str:
        """``TRELLIS_<SERVICE>_``, from ``service_name`` (``proxy-cp``: ``TRELLIS_PROXY_CP_``)."""
        return f"{SHARED_PREFIX}{cls.service_name.upper().replace('-', '_')}_"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keywords, then ``TRELLIS_<SERVICE>_*``, then the shared ``TRELLIS_*`` (flags,
        when parsed, come before all of them)."""
        return (
            init_settings,
            EnvSettingsSource(settings_cls, env_prefix=cls.env_prefix()),
            SharedEnvSource(settings_cls),
        )

    @property
    def instance_name(self) -> str:
        """The name this process announces itself with (defaults to the service name)."""
        return self.instance or self.service_name

    @property
    def grpc_address(self) -> str:
        return f"{self.bind_host}:{self.grpc_port}"

    @property
    def trust_bundle_path(self) -> Path:
        return self.trust_bundle_file or self.state_dir / TRUST_BUNDLE_FILE

    @property
    def join_token_path(self) -> Path:
        return self.join_token_file or self.state_dir / "join" / self.service_name


class SpecDirSettings(ServiceSettings):
    """Settings of a service that watches the mesh's directory of YAML documents.

    The directory is watched with inotify, and rescanned in full every
    ``spec_rescan_interval`` seconds in case an event was lost; where inotify cannot watch,
    it is polled every ``spec_poll_interval`` seconds instead.
    """

    spec_dir: Annotated[Path | None, SHARED] = Field(
        default=None, description="directory of mesh documents (YAML), watched"
    )
    spec_rescan_interval: float = Field(
        default=30.0, gt=0, description="seconds between full rescans of the spec directory"
    )
    spec_poll_interval: float = Field(
        default=0.5, gt=0, description="seconds between polls where inotify cannot watch"
    )


S = TypeVar("S", bound=ServiceSettings)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def environment_help(settings_cls: type[ServiceSettings]) -> str:
    """The ``--help`` epilog: which variables stand for the flags."""
    shared = [flag(n) for n, f in settings_cls.model_fields.items() if is_shared(f)]
    prefix = settings_cls.env_prefix()
    return (
        f"Each flag --some-name is also the environment variable {prefix}SOME_NAME; "
        f"{', '.join(shared)} are also read from the mesh-wide {SHARED_PREFIX}SOME_NAME. "
        f"Flags win over {prefix}*, which wins over {SHARED_PREFIX}*."
    )


def from_command_line(settings_cls: type[S], argv: Sequence[str] | None, prog: str) -> S:
    """Settings from ``argv`` (``None``: ``sys.argv``) over the environment.

    ``--help`` prints the class's docstring, then every field with its description, and
    exits 0; an unknown flag exits 2 (argparse). A value that does not validate raises
    :class:`pydantic.ValidationError`.
    """
    parser = argparse.ArgumentParser(
        prog=prog,
        description=inspect.cleandoc(settings_cls.__doc__ or ""),
        epilog=environment_help(settings_cls),
        allow_abbrev=False,
    )
    source: CliSettingsSource[argparse.ArgumentParser] = CliSettingsSource(
        settings_cls,
        cli_prog_name=prog,
        cli_parse_args=True if argv is None else list(argv),
        root_parser=parser,
    )
    return settings_cls(**source())  # the flags given, over the environment


def describe_error(settings_cls: type[ServiceSettings], error: ValidationError) -> str:
    """One line naming each bad field, where it can be set, and what is wrong with it."""
    problems = []
    for item in error.errors():
        name = str(item["loc"][0]) if item["loc"] else ""
        field = settings_cls.model_fields.get(name)
        if field is None:
            problems.append(f"{name or 'settings'}: {item['msg']}")
            continue
        where = [flag(name), f"{settings_cls.env_prefix()}{name.upper()}"]
        if is_shared(field):
            where.append(f"{SHARED_PREFIX}{name.upper()}")
        got = "" if "token" in name else f", got {item['input']!r}"
        problems.append(f"{name} ({' / '.join(where)}): {item['msg']}{got}")
    return "bad setting " + "; ".join(problems)

"""``trellis up``: Redis and the control plane services as separate local processes.

The Redis it starts persists every write (AOF, fsync always) and rewrites its append-only
file once it has doubled since the last rewrite and is past a minimum size, so
steady churn does not grow the file without bound. Its data directory is 0700: what Redis
holds (sealed keys, certificates, registrations) is for the mesh's processes only. Each
process's log file rotates by size (``--log-max-bytes``, ``--log-backups``); the terminal
gets a summary (:mod:`trellis_cli.console`).

Redis runs with its ACL on (:mod:`trellis_runtime.redisacl`): the default user is off, and
each service logs in as its own user, limited to its own keys and channels. The passwords
are made once, one file (0600) per user in ``<state>/redis/users/``, and each service is
given the path of its own (``TRELLIS_REDIS_PASSWORD_FILE``), never the password itself;
Redis reads the users from ``<state>/redis/users.acl`` (0600, written again at every start
from the table, with the passwords' SHA-256 only). ``admin`` is the operator's user
(``redis-cli -p 16379 --user admin --askpass``). A Redis of the operator's own
(``TRELLIS_REDIS_URL``) is used with whatever credentials its URL carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

import click
from rich.markup import escape

from trellis_cli import dashboard, demo, output, redisprocess
from trellis_cli.client import Mesh
from trellis_cli.console import Echo, make_echo
from trellis_cli.errors import ERROR, OK
from trellis_cli.replicas import HA_REPLICAS, MAX_REPLICAS, parse_replicas, replicas_of
from trellis_cli.supervisor import (
    DEFAULT_LOG_BACKUPS,
    DEFAULT_ROTATION,
    LogRotation,
    ProcessSpec,
    StartupError,
    Supervisor,
    https_ready,
    parse_size,
    port_free,
    tcp_ready,
)
from trellis_common import filemode
from trellis_common.envoybin import EnvoyNotFound
from trellis_identity import jointoken
from trellis_runtime import redisacl
from trellis_runtime.settings import Ports

LOCAL_REDIS_PORT = 16379

# (name, module, grpc port, admin port). Redis and certmanager start first (the others log
# in to the one and join with the other), then the rest side by side (ProcessSpec.after).
SERVICES = (
    ("certmanager", "trellis_certmanager.main", *Ports.CERTMANAGER),
    ("endpoints-vm", "trellis_endpoints_vm.main", *Ports.ENDPOINTS_VM),
    ("endpoints-k8s", "trellis_endpoints_k8s.main", *Ports.ENDPOINTS_K8S),
    ("catalog", "trellis_catalog.main", *Ports.CATALOG),
    ("proxy-cp", "trellis_proxy_cp.main", *Ports.PROXY_CP),
    ("injector", "trellis_injector.main", 0, Ports.INJECTOR_ADMIN),
)
# Ports a service serves besides gRPC and admin: the injector's mutating webhook (TLS), so
# pods can be injected locally without a cluster (patches made, no Secrets stored), and
# proxy-cp's Linkerd Destination API.
OTHER_PORTS = {
    "injector": (Ports.INJECTOR_WEBHOOK, "webhook https://127.0.0.1:{}/mutate"),
    # the Linkerd Destination API (mTLS; docs/linkerd.md)
    "proxy-cp": (Ports.PROXY_CP_DESTINATION, "linkerd-destination :{}"),
}
# Ports also checked free before a start: pod agents' enrollment (proxy-cp binds it too).
MORE_PORTS = {"proxy-cp": (Ports.PROXY_CP_ENROLL,)}


def redis_spec(state_dir: Path, port: int = LOCAL_REDIS_PORT) -> ProcessSpec:
    data = redisprocess.private_dir(state_dir / "redis")
    aclfile = redisacl.write_aclfile(data / "users.acl", redis_users(state_dir))
    return ProcessSpec(
        name="redis",
        argv=redisprocess.server_argv(
            redisprocess.find_binary(), port=port, data=data, aclfile=aclfile
        ),
        ready=tcp_ready("127.0.0.1", port),
        ports=(port,),
        address=f"redis://127.0.0.1:{port}",
    )


def redis_users(state_dir: Path) -> dict[str, Path]:
    """The password file of each Redis user (made on first use, then kept)."""
    return redisacl.ensure_passwords(state_dir / "redis" / "users")


#: The services that talk to the Kubernetes API, and the setting that says where it is.
KUBERNETES_USERS = {
    "catalog": "TRELLIS_CATALOG_KUBECONFIG",  # the mesh specification from the API server too
    "endpoints-k8s": "TRELLIS_ENDPOINTS_K8S_KUBECONFIG",
    # ServiceEntries and WorkloadEntries from the API server too
    "endpoints-vm": "TRELLIS_ENDPOINTS_VM_KUBECONFIG",
    "injector": "TRELLIS_INJECTOR_KUBECONFIG",
}


def service_specs(
    state_dir: Path,
    redis_url: str,
    spec_dir: Path,
    local_redis: bool = True,
    kubeconfig: Path | None = None,
    replicas: Mapping[str, int] | None = None,
    redis_env: Mapping[str, str] | None = None,
    redis_names: tuple[str, ...] = ("redis",),
) -> list[ProcessSpec]:
    """The services; with ``local_redis``, each logs in as its own user (its password file).
    endpoints-k8s runs only with a ``kubeconfig``, which the catalog, endpoints-vm and the
    injector also get. Each component runs ``replicas[component]`` times (default 1);
    ``redis_env`` is more Redis settings for every service (a Sentinel's), and
    ``redis_names`` the Redis processes they start after."""
    users = redis_users(state_dir) if local_redis else {}
    specs = []
    for name, module, grpc_port, admin_port in SERVICES:
        if importlib.util.find_spec(module.rsplit(".", 1)[0]) is None:
            continue
        if name == "endpoints-k8s" and kubeconfig is None:
            continue
        kube_env = (
            {KUBERNETES_USERS[name]: str(kubeconfig)}
            if kubeconfig is not None and name in KUBERNETES_USERS
            else {}
        )
        other_port, other_address = OTHER_PORTS.get(name, (0, ""))
        specs.append(
            ProcessSpec(
                name=name,
                argv=[sys.executable, "-m", module],
                ready=https_ready(f"https://127.0.0.1:{admin_port}/readyz", state_dir),
                ports=tuple(
                    p for p in (grpc_port, admin_port, other_port, *MORE_PORTS.get(name, ())) if p
                ),
                env={
                    "TRELLIS_REDIS_URL": redis_url,
                    **(redis_env or {}),
                    "TRELLIS_STATE_DIR": str(state_dir),
                    "TRELLIS_SPEC_DIR": str(spec_dir),
                    # gRPC reports refused TLS handshakes at info level: services count them
                    "GRPC_VERBOSITY": "INFO",
                    **kube_env,
                    **(
                        {
                            "TRELLIS_REDIS_USERNAME": name,
                            "TRELLIS_REDIS_PASSWORD_FILE": str(users[name].resolve()),
                        }
                        if name in users
                        else {}
                    ),
                },
                address=(f"grpc :{grpc_port}  " if grpc_port else "")
                + f"admin https://127.0.0.1:{admin_port}"
                + (f"  {other_address.format(other_port)}" if other_port else ""),
                # a fresh one-time join token before each start: the service trades it
                # for its certificate (certmanager signs its own)
                prepare=None
                if name == "certmanager"
                else functools.partial(jointoken.write_token, state_dir, name),
                after=redis_names if name == "certmanager" else (*redis_names, "certmanager"),
            )
        )
        specs += replicas_of(specs[-1], state_dir, (replicas or {}).get(name, 1))
    return specs


def default_spec_dir(state_dir: Path, with_demo: bool) -> Path:
    """The demo watches examples/ itself (bookstore/ and grpc/; the catalog reads
    subdirectories): editing the weights there changes the split and the routes."""
    example = Path("examples")
    if with_demo and (example / "bookstore").is_dir():
        return example
    return state_dir / "spec"


async def print_counters(state_dir: Path, stop: asyncio.Event, every: float = 3.0) -> None:
    previous: dict[str, dict[str, int]] = {}
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every)
        if not stop.is_set():
            output.console.print(f"[bold]demo[/] {escape(demo.counters(state_dir, previous))}")


async def up(
    state_dir: Path,
    echo: Echo,
    spec_dir: Path | None = None,
    with_demo: bool = True,
    rotation: LogRotation = DEFAULT_ROTATION,
    kubeconfig: Path | None = None,
    replicas: Mapping[str, int] | None = None,
    redis_sentinel: bool = False,
    with_dashboard: bool = True,
) -> int:
    filemode.private_dir(state_dir)  # tokens, keys, Redis passwords: the owner's alone
    spec_dir = (spec_dir or default_spec_dir(state_dir, with_demo)).resolve()
    spec_dir.mkdir(parents=True, exist_ok=True)
    redis_url = os.environ.get("TRELLIS_REDIS_URL", "")
    local_redis = not redis_url
    specs: list[ProcessSpec] = []
    redis_env: dict[str, str] = {}
    if local_redis and redis_sentinel:
        from trellis_cli import sentinel

        redis_specs, redis_url = sentinel.sentinel_specs(state_dir)
        specs += redis_specs
        # an acknowledged registration or certificate is on a replica before the answer
        redis_env["TRELLIS_REDIS_MIN_REPLICAS_ACK"] = "1"
    elif local_redis:
        redis_url = f"redis://127.0.0.1:{LOCAL_REDIS_PORT}/0"
        specs.append(redis_spec(state_dir))
    else:
        parsed = urlparse(redis_url)
        output.console.print(f"using Redis at {parsed.hostname}:{parsed.port or 6379}")
    specs += service_specs(
        state_dir,
        redis_url,
        spec_dir,
        local_redis,
        kubeconfig,
        replicas,
        redis_env,
        tuple(spec.name for spec in specs) or ("redis",),
    )
    if with_dashboard:
        specs.append(dashboard.process_spec(state_dir))
    log_dir = state_dir / "logs"
    supervisor = Supervisor(specs, log_dir, make_echo(echo), rotation=rotation)
    shows = {
        Echo.QUIET: "nothing of the services' logs",
        Echo.WARNINGS: "their warnings and errors only (--verbose: everything)",
        Echo.VERBOSE: "every line",
    }[echo]
    output.console.print(f"full logs of each process: {log_dir}/<name>.log; here: {shows}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        supervisor.preflight()
        await supervisor.start()
        if with_demo:
            busy = [p for p in demo.ports() if not port_free("127.0.0.1", p)]
            if busy:
                raise StartupError(f"demo ports already in use: {busy} (use --no-demo)")
            specs = await asyncio.to_thread(demo.prepare, Mesh(state_dir), state_dir)
            await supervisor.launch(specs)
    except (StartupError, click.ClickException, EnvoyNotFound) as exc:
        message = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
        output.errors.print(f"[red]error:[/] {escape(message)}")
        await supervisor.stop_all()
        return ERROR
    output.table(
        f"Trellis is up (state in {state_dir}, mesh documents in {spec_dir})",
        ["SERVICE", "PID", "ADDRESS", "HEALTH"],
        [
            (c.spec.name, c.process.pid if c.process else "-", c.spec.address, "ready")
            for c in supervisor.children
        ],
    )
    output.console.print(
        "try: [bold]trellis status[/], [bold]trellis proxy list[/], [bold]trellis certs list[/], "
        "[bold]trellis vm list[/], [bold]trellis policy check --from bookthief/bookthief "
        "--to bookstore/bookstore[/]; Ctrl-C stops everything"
    )
    if with_dashboard:
        output.console.print(f"dashboard: {dashboard.url_of(dashboard.DEFAULT_PORT)}")
    if with_demo:
        output.console.print(
            f"demo: edit the weights in {spec_dir / 'bookstore' / 'traffic-split.yaml'} and "
            "watch the counters; a proxyless gRPC client: README, 'in 3 commands'"
        )
        output.console.print(
            f"gateway: [bold]curl {demo.gateway_url()}[/] (bookstore through the Gateway "
            f"{demo.GATEWAY_NAMESPACE}/{demo.GATEWAY}, {spec_dir / 'gateway' / 'gateway.yaml'})"
        )
        await asyncio.gather(supervisor.run(stop), print_counters(state_dir, stop))
    else:
        await supervisor.run(stop)
    output.console.print("all services stopped")
    return OK


@click.command(
    "up",
    help="Start Redis and the control plane as local processes (Ctrl-C stops them). The "
    "terminal shows what runs where, the demo's counters and the services' warnings and "
    "errors; every log line is in <state-dir>/logs/<name>.log. Exit 2 if it cannot start.",
)
@click.option("--quiet", is_flag=True, help="Do not show the services' logs at all.")
@click.option("--verbose", "-v", is_flag=True, help="Show every line of the services' logs.")
@click.option(
    "--spec-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory of mesh documents (YAML, subdirectories too) to watch [default: examples/ "
    "with the demo, else <state-dir>/spec].",
)
@click.option("--no-demo", is_flag=True, help="Only the control plane, no demo.")
@click.option(
    "--no-dashboard",
    is_flag=True,
    help=f"Do not serve the dashboard (trellis dashboard) on port {dashboard.DEFAULT_PORT}.",
)
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Also run endpoints-k8s against this cluster (an emulator's http:// server is "
    "fine); the catalog reads mesh documents there too, endpoints-vm its ServiceEntries "
    "and WorkloadEntries, and the injector stores proxy Secrets there.",
)
@click.option(
    "--replicas",
    "replica_values",
    multiple=True,
    metavar="COMPONENT=N",
    help="Run N processes of COMPONENT (repeatable: --replicas catalog=2 --replicas "
    "certmanager=2). They share the component's gRPC port (SO_REUSEPORT: the kernel spreads "
    "new connections over them; one dying moves its clients to the others); replica n is "
    "<component>-<n> with an admin port of its own.",
)
@click.option(
    "--proxy-cp-replicas",
    type=click.IntRange(min=1, max=MAX_REPLICAS),
    default=1,
    show_default=True,
    help="Short for --replicas proxy-cp=N: proxy-cp processes on the one xDS port.",
)
@click.option(
    "--ha",
    is_flag=True,
    help=f"High availability: {HA_REPLICAS} of every component (--replicas still overrides "
    "one) and Redis under Sentinel (implies --redis-sentinel).",
)
@click.option(
    "--redis-sentinel",
    is_flag=True,
    help="Run Redis as a master, two replicas and three sentinels: the services follow a "
    "failover by themselves, and each acknowledged write is on a replica first.",
)
@click.option(
    "--state-dir",
    "up_state_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Same as `trellis --state-dir` (given here, it wins).",
)
@click.option(
    "--log-max-bytes",
    default="10MiB",
    show_default=True,
    help="Rotate each process's log in <state-dir>/logs once it reaches this size.",
)
@click.option(
    "--log-backups",
    type=click.IntRange(min=0),
    default=DEFAULT_LOG_BACKUPS,
    show_default=True,
    help="Rotated log files kept per process.",
)
@click.pass_obj
def command(
    mesh: Mesh,
    quiet: bool,
    verbose: bool,
    spec_dir: Path | None,
    no_demo: bool,
    no_dashboard: bool,
    kubeconfig: Path | None,
    replica_values: tuple[str, ...],
    proxy_cp_replicas: int,
    ha: bool,
    redis_sentinel: bool,
    up_state_dir: Path | None,
    log_max_bytes: str,
    log_backups: int,
) -> None:
    state_dir = up_state_dir or mesh.state_dir
    if quiet and verbose:
        raise click.UsageError("--quiet and --verbose exclude each other")
    echo = Echo.QUIET if quiet else Echo.VERBOSE if verbose else Echo.WARNINGS
    try:
        rotation = LogRotation(parse_size(log_max_bytes), log_backups)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--log-max-bytes") from exc
    try:
        replicas = parse_replicas(replica_values, proxy_cp_replicas, ha)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--replicas") from exc
    if (redis_sentinel or ha) and os.environ.get("TRELLIS_REDIS_URL"):
        raise click.UsageError(
            "--redis-sentinel (and --ha) start a local Redis under Sentinel, but "
            "TRELLIS_REDIS_URL names a Redis of your own: unset it, or point it at your "
            "Sentinel (redis+sentinel://...) and drop the flag"
        )
    raise SystemExit(
        asyncio.run(
            up(
                state_dir,
                echo,
                spec_dir,
                with_demo=not no_demo,
                rotation=rotation,
                kubeconfig=kubeconfig.resolve() if kubeconfig else None,
                replicas=replicas,
                redis_sentinel=redis_sentinel or ha,
                with_dashboard=not no_dashboard,
            )
        )
    )

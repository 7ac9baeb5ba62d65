"""Running a Trellis service as a real process in tests.

:class:`ServiceProcess` starts ``python -m <module>`` with ports 0 (the service picks free
ones and writes them to ``<state-dir>/services/<name>.json``), waits for ``/readyz``, and can
terminate, SIGKILL and start it again, as an operator or a crash would. Given the test's
:class:`~trellis_testing.RedisServer`, it logs in to Redis as its own component's
ACL user (its name is the component's), as under ``trellis up``; given a
:class:`~trellis_testing.redis_sentinel.SentinelRedis`, through its sentinels, and
waiting for a replica on durable writes; given a URL, it uses that URL as it is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx

from trellis_common import components, statefile
from trellis_identity import jointoken
from trellis_identity.identity import ComponentIdentity
from trellis_runtime import adminhttp
from trellis_testing.identities import join_as
from trellis_testing.redis_sentinel import SentinelRedis
from trellis_testing.redis_server import RedisServer

#: Identities tests call with, by (state directory, component).
_CALLERS: dict[tuple[Path, str], ComponentIdentity] = {}


class ServiceProcess:
    def __init__(
        self,
        name: str,
        module: str,
        state_dir: Path,
        redis: RedisServer | SentinelRedis | str,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        *,
        join_token: bool = True,
        instance: str = "",
    ) -> None:
        self.name = name  # the component
        #: the name it announces and advertises itself by: a replica's (``proxy-cp-2``), or
        #: the one its environment gives (a rendered pod's ``TRELLIS_INSTANCE``)
        self.instance = instance or (env or {}).get("TRELLIS_INSTANCE") or name
        #: write a join token before each start, as `trellis up` does (False: the service
        #: joins with what its env names, a ServiceAccount token)
        self.join_token = join_token
        self.module = module
        self.state_dir = state_dir
        self.redis_env = (
            {"TRELLIS_REDIS_URL": redis} if isinstance(redis, str) else redis.service_env(name)
        )
        self.args = args
        self.env = env or {}
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = state_dir / "logs" / f"{self.instance}.log"
        self._http: httpx.Client | None = None  # GETs' kept connection (request)
        self._http_finalizer: weakref.finalize[[], ServiceProcess] | None = None
        self._http_lock = threading.Lock()

    def start(
        self, timeout: float = 30.0, ports: tuple[int, int] = (0, 0)
    ) -> statefile.ServiceEndpoint:
        """Start (``ports``: gRPC and admin; 0 picks free ones) and wait until ready."""
        self.spawn(ports)
        return self.ready_or_stop(timeout)

    def ready_or_stop(self, timeout: float = 30.0) -> statefile.ServiceEndpoint:
        """Wait until the spawned process is ready; one that never gets ready is stopped."""
        try:
            return self.wait_ready(timeout)
        except BaseException:  # a process that never got ready must not outlive the test
            self.stop()
            raise

    def spawn(self, ports: tuple[int, int] = (0, 0)) -> None:
        """Start the process and return at once (:meth:`wait_ready` waits for it)."""
        self.close_http()  # a connection to an earlier process of this name is no use
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.name != components.CERTMANAGER and self.join_token:  # as `trellis up` does
            jointoken.write_token(self.state_dir, self.name)
        env = {
            **os.environ,
            **self.redis_env,
            "TRELLIS_STATE_DIR": str(self.state_dir),
            "PYTHONUNBUFFERED": "1",
            # gRPC reports refused TLS handshakes at info level: the service counts them
            "GRPC_VERBOSITY": "INFO",
            # the injector's webhook on a free port too: tests run side by side
            "TRELLIS_INJECTOR_WEBHOOK_PORT": "0",
            "TRELLIS_PROXY_CP_DESTINATION_PORT": "0",
            "TRELLIS_PROXY_CP_ENROLL_PORT": "0",
            **({"TRELLIS_INSTANCE": self.instance} if self.instance != self.name else {}),
            **self.env,
        }
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                self.module,
                "--grpc-port",
                str(ports[0]),
                "--admin-port",
                str(ports[1]),
                *self.args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()

    def wait_ready(self, timeout: float = 30.0) -> statefile.ServiceEndpoint:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.instance} exited with {self.process.returncode}:\n{self.logs()[-3000:]}"
                )
            endpoint = statefile.read_endpoint(self.state_dir, self.instance)
            if endpoint is not None and endpoint.pid == self.process.pid:
                with contextlib.suppress(httpx.HTTPError):
                    if self.get("/readyz", timeout=1).status_code == 200:
                        return endpoint
            time.sleep(0.05)
        raise TimeoutError(f"{self.instance} not ready in {timeout}s:\n{self.logs()[-3000:]}")

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A request to the service's admin API (TLS checked against the mesh's CA; a
        ``GET`` carries the admin token, :func:`trellis_runtime.adminhttp.request`).

        GETs, which tests poll in loops, reuse one open connection: a new client and TLS
        handshake per poll cost 12 ms of CPU between test and service, against 3 ms. A
        reused connection the service has dropped meanwhile (it was killed, or restarted)
        fails at once; such a GET is sent again, once, on a new connection, and what that
        one gets is the answer. Other methods get a connection of their own, as before:
        one sent twice could act twice."""
        url = self.endpoint.admin_url + path
        kwargs.setdefault("timeout", 5.0)
        if method != "GET" or not url.startswith("https://"):
            return adminhttp.request(self.state_dir, self.name, method, url, **kwargs)
        client, reused = self._http_client()
        try:
            return adminhttp.request(
                self.state_dir, self.name, method, url, client=client, **kwargs
            )
        except (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError):
            self.close_http()
            if not reused:
                raise
        return adminhttp.request(self.state_dir, self.name, method, url, **kwargs)

    def _http_client(self) -> tuple[httpx.Client, bool]:
        """The kept client, and whether it has served a request before."""
        with self._http_lock:
            if self._http is not None:
                return self._http, True
            client = httpx.Client(verify=adminhttp.mesh_context(self.state_dir))
            self._http = client
            # closed with the process (stop, kill, restart); else when this object goes,
            # so that no socket is left for the garbage collector to complain about
            self._http_finalizer = weakref.finalize(self, client.close)
            return client, False

    def close_http(self) -> None:
        """Close the kept connection (the process is going, or the connection failed)."""
        with self._http_lock:
            if self._http_finalizer is not None:
                self._http_finalizer()
            self._http = None
            self._http_finalizer = None

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("DELETE", path, **kwargs)

    def channel(self, caller: str) -> grpc.aio.Channel:
        """An mTLS channel to the service's gRPC API, calling as the component ``caller``
        (joined with the mesh's certmanager once per state directory and component)."""
        identity = _CALLERS.get((self.state_dir, caller))
        if identity is None:
            identity = _CALLERS[(self.state_dir, caller)] = join_as(self.state_dir, caller)
        return identity.channel(self.endpoint.grpc_address, self.name)

    def async_client(self, **kwargs: Any) -> httpx.AsyncClient:
        """A client of the admin API; the server's certificate is checked against the
        mesh's CA (its name is not: the address is the loopback's)."""
        context = adminhttp.mesh_context(self.state_dir, check_name=False)
        return httpx.AsyncClient(base_url=self.endpoint.admin_url, verify=context, **kwargs)

    def restart(self, timeout: float = 30.0) -> statefile.ServiceEndpoint:
        """Start again on the same ports, as a supervisor restarts a crashed service (its
        clients, Envoy among them, keep the addresses they had)."""
        endpoint = self.endpoint
        ports = (
            int(endpoint.grpc_address.rsplit(":", 1)[1]),
            int(endpoint.admin_url.rsplit(":", 1)[1]),
        )
        return self.start(timeout, ports)

    @property
    def endpoint(self) -> statefile.ServiceEndpoint:
        endpoint = statefile.read_endpoint(self.state_dir, self.instance)
        assert endpoint is not None, f"{self.instance} has not advertised itself"
        return endpoint

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no clean-up runs, as in a crash."""
        self._signal(signal.SIGKILL)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM and wait; returns the exit code."""
        return self._signal(signal.SIGTERM, timeout)

    def terminate(self) -> None:
        """SIGTERM, without waiting (:meth:`stop` then waits): processes stopped together
        shut down side by side."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def _signal(self, signum: signal.Signals, timeout: float = 15.0) -> int | None:
        self.close_http()
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signum)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def __enter__(self) -> ServiceProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def trellis(state_dir: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """The CLI, run as a user would, against the mesh of ``state_dir``."""
    return subprocess.run(
        [sys.executable, "-m", "trellis_cli.main", "--state-dir", str(state_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_together(processes: Iterable[ServiceProcess], timeout: float = 30.0) -> None:
    """Start the processes side by side and wait until each is ready, as `trellis up` starts
    the services once certmanager is up; if one never gets ready, all are stopped."""
    spawned: list[ServiceProcess] = []
    try:
        for process in processes:
            process.spawn()
            spawned.append(process)
        for process in spawned:
            process.wait_ready(timeout)
    except BaseException:
        for process in reversed(spawned):
            process.stop()
        raise


def stop_together(processes: Iterable[ServiceProcess]) -> None:
    """SIGTERM to each, then wait for each (a service's graceful end takes a moment: one
    after another, a mesh took seconds to stop)."""
    listed = list(processes)
    for process in listed:
        process.terminate()
    for process in listed:
        process.stop()


def start_mesh(processes: Iterable[ServiceProcess], timeout: float = 30.0) -> None:
    """Start a mesh's services as `trellis up` does: certmanager first (the others join
    with it), then the rest side by side; if one never gets ready, all are stopped."""
    listed = list(processes)
    first = [p for p in listed if p.name == components.CERTMANAGER]
    for process in first:
        process.start(timeout)
    try:
        start_together([p for p in listed if p not in first], timeout)
    except BaseException:
        stop_together(first)
        raise


@contextlib.contextmanager
def running(processes: dict[str, ServiceProcess]) -> Iterator[dict[str, ServiceProcess]]:
    """Start them (:func:`start_mesh`), stop them together at the end."""
    start_mesh(processes.values())
    try:
        yield processes
    finally:
        stop_together(reversed(list(processes.values())))

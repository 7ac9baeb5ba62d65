"""Chaos under steady traffic, for tests: the bookstore mesh carrying requests while faults
are injected, and the figures of each fault.

:class:`Chaos` runs OSM's bookstore on a :class:`~trellis_testing.mesh.Mesh` (VM
workloads with a 5 s TTL kept alive by heartbeats, bookbuyer's sidecar calling bookstore
about 20 times a second) and, for each fault (:meth:`Chaos.fault`), records a
:class:`Figure`: the requests sent and those that failed, the registrations lost, the
heartbeat errors, and the convergence time (from the end of the fault until a workload
registered at that moment is in bookbuyer's Envoy, which needs every hop to work again).
``tests/integration/test_chaos.py`` (one process per component) and ``test_ha.py`` (two of
each, Redis under Sentinel) run it. With replicas, heartbeats and listings go to whichever
endpoints-vm replica is running, as through a Service.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from trellis_testing.mesh import BOOKSTORE, Mesh, Sidecar, bookstore

# A restarted endpoints-vm gives a workload that beat within two TTLs one more TTL (the
# heartbeats it missed while down are not held against it): at 3 s, the endpoints-vm row
# demanded a SIGKILLed endpoints-vm be back within 6 s, which a loaded CI machine missed
# (8 requests 503 while v1-a and v2-a expired). How fast a process restarts is a speed
# figure, not the property under test; 5 s gives it 10 s, and every Redis outage below
# still outlasts a TTL.
TTL = 5.0
PROBE_ADDRESS = "127.0.0.2"  # bookstore-v1's sidecar listens on 0.0.0.0: a real endpoint


class Traffic(threading.Thread):
    """bookbuyer calling bookstore every ``interval`` seconds, recording each outcome."""

    def __init__(self, buyer: Sidecar, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.buyer = buyer
        self.interval = interval
        self.outcomes: list[tuple[float, str]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            url = f"http://127.0.0.1:{self.buyer.outbound_port}/books-bought"
            while not self.halt.is_set():
                try:
                    response = client.get(url, headers={"host": BOOKSTORE})
                    outcome = "ok" if response.status_code == 200 else str(response.status_code)
                except httpx.HTTPError as exc:
                    outcome = type(exc).__name__
                self.outcomes.append((time.monotonic(), outcome))
                self.halt.wait(self.interval)

    def since(self, start: float) -> tuple[int, list[str]]:
        seen = [o for t, o in list(self.outcomes) if t >= start]
        return len(seen), [o for o in seen if o != "ok"]


class Heartbeats(threading.Thread):
    """Each workload's heartbeat every second, as a VM agent sends it."""

    def __init__(self, mesh: Mesh, workloads: list[str]) -> None:
        super().__init__(daemon=True)
        self.mesh = mesh
        self.workloads = workloads
        self.halt = threading.Event()
        self.failures: list[tuple[float, str]] = []
        # each workload's own heartbeat token, kept by `trellis vm register`
        tokens = mesh.state_dir / "heartbeat-tokens" / "bookstore"
        self.tokens = {name: (tokens / name).read_text().strip() for name in workloads}

    def run(self) -> None:
        while not self.halt.is_set():
            for name in self.workloads:
                try:
                    response = self._beat(name)
                    if response.status_code >= 300:
                        self.failures.append((time.monotonic(), f"{name}: {response.status_code}"))
                except (httpx.HTTPError, OSError, RuntimeError) as exc:
                    self.failures.append((time.monotonic(), f"{name}: {type(exc).__name__}"))
            self.halt.wait(1.0)

    def _beat(self, name: str) -> httpx.Response:
        """One heartbeat to a running endpoints-vm; one that refuses the connection (it
        died just now) is no answer, and the next running one is asked, as an agent
        behind a Service would reach another pod."""
        for process in self.mesh.instances("endpoints-vm"):
            if process.process is None or process.process.poll() is not None:
                continue  # dead: a Service would not route to it
            try:  # one starting up refuses the connection: not ready, the next one is asked
                return process.post(
                    f"/v1/workloads/bookstore/{name}/heartbeat",
                    headers={"authorization": f"Bearer {self.tokens[name]}"},
                    timeout=2,
                )
            except (httpx.ConnectError, AssertionError):  # (not advertised yet)
                continue
        raise RuntimeError("no endpoints-vm took the connection")


@dataclass
class Figure:
    fault: str
    requests: int
    failed: list[str]
    lost: list[str]
    convergence: float
    heartbeat_failures: int

    def row(self) -> str:
        return (
            f"{self.fault:<32} {self.requests:>8} {len(self.failed):>7} {len(self.lost):>5} "
            f"{self.convergence:>10.2f} {self.heartbeat_failures:>10}"
        )


class Chaos:
    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self.v1, self.v2, self.buyer = bookstore(mesh, ttl=TTL)
        self.workloads = ["v1-a", "v2-a"]
        self.traffic = Traffic(self.buyer)
        self.heartbeats = Heartbeats(mesh, self.workloads)
        self.figures: list[Figure] = []
        self.probes = 0

    def __enter__(self) -> Chaos:
        self.traffic.start()
        self.heartbeats.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.traffic.halt.set()
        self.heartbeats.halt.set()
        self.traffic.join(10)
        self.heartbeats.join(10)

    def registered(self) -> dict[str, bool]:
        """Every registration and whether it counts alive, at each running endpoints-vm:
        a workload is registered and alive only where every replica says so."""
        found: dict[str, bool] = {}
        for process in self.mesh.instances("endpoints-vm"):
            if process.process is None or process.process.poll() is not None:
                continue
            try:
                listed = process.get("/v1/workloads").json()["workloads"]
            except httpx.ConnectError:  # starting up: not ready, not asked
                continue
            alive = {w["name"]: bool(w["alive"]) for w in listed}
            for name in self.workloads:
                found[name] = found.get(name, True) and alive.get(name, False)
        return found

    def in_envoy(self, address: str) -> bool:
        try:
            clusters = self.buyer.envoy.get("/clusters?format=json").json()
        except (httpx.HTTPError, ValueError):
            return False
        return any(
            host["address"]["socket_address"]["address"] == address
            for cluster in clusters.get("cluster_statuses", [])
            for host in cluster.get("host_statuses", [])
        )

    def converge(self) -> float:
        """From now until a workload registered now is served to bookbuyer's Envoy."""
        started = time.monotonic()
        self.probes += 1
        name = f"probe-{self.probes}"
        deadline = started + 60
        while True:  # the registration itself may need endpoints-vm back first
            done = self.mesh.trellis(
                "vm", "register", "-n", "bookstore", "--name", name, "--service",
                "bookstore-v1", "--address", PROBE_ADDRESS, "--port",
                f"http={self.v1.inbound_port}", "--service-account", "bookstore",
            )  # fmt: skip
            if done.returncode == 0:
                break
            assert time.monotonic() < deadline, done.stderr
            time.sleep(0.05)
        while not self.in_envoy(PROBE_ADDRESS):
            assert time.monotonic() < deadline, f"{name} never reached bookbuyer's Envoy"
            time.sleep(0.02)
        took = time.monotonic() - started
        while True:  # as the registration: Redis may refuse it (503) right after a failover
            gone = self.mesh.trellis("vm", "deregister", "-n", "bookstore", "--name", name)
            if gone.returncode == 0:
                break
            assert "(503)" in gone.stderr, gone.stderr  # only "nothing stored, retry"
            assert time.monotonic() < deadline + 30, gone.stderr
            time.sleep(0.05)
        while self.in_envoy(PROBE_ADDRESS):
            assert time.monotonic() < deadline + 30, f"{name} never left bookbuyer's Envoy"
            time.sleep(0.05)
        return took

    def fault(self, name: str, inject: Callable[[], None]) -> Figure:
        self.wait_settled()
        start = time.monotonic()
        heartbeat_start = len(self.heartbeats.failures)
        inject()  # returns once the fault is over (Redis back, the service restarted)
        convergence = self.converge()
        self.more_traffic(20)  # requests after convergence count too
        requests, failed = self.traffic.since(start)
        registered = self.registered()
        lost = [w for w in self.workloads if not registered.get(w)]
        figure = Figure(
            name,
            requests,
            failed,
            lost,
            convergence,
            len(self.heartbeats.failures) - heartbeat_start,
        )
        self.figures.append(figure)
        return figure

    def more_traffic(self, count: int) -> None:
        """Wait until ``count`` more requests have had their answer."""
        target = len(self.traffic.outcomes) + count
        deadline = time.monotonic() + 30
        while len(self.traffic.outcomes) < target:
            assert time.monotonic() < deadline, "traffic stopped"
            time.sleep(0.02)

    def wait_settled(self) -> None:
        deadline = time.monotonic() + 60
        while not all(self.registered().get(w) for w in self.workloads):
            assert time.monotonic() < deadline, (self.registered(), self.heartbeats.failures[-5:])
            time.sleep(0.1)

    def report(self) -> str:
        header = (
            f"{'fault':<32} {'requests':>8} {'failed':>7} {'lost':>5} {'converge_s':>10} "
            f"{'hb_errors':>10}"
        )
        return "\n".join(["", "chaos figures", header, *(f.row() for f in self.figures)])


def check(figure: Figure, convergence_bar: float = 0.0) -> None:
    """The bar of every fault: no request failed, no registration lost; and, where a bar
    is given (``make chaos``: the machine to itself), convergence within it."""
    assert figure.failed == [], figure
    assert figure.lost == [], figure
    if convergence_bar:
        assert figure.convergence <= convergence_bar, figure


def report(chaos: Chaos, capsys: pytest.CaptureFixture[str], path: Path, extra: str = "") -> None:
    """Print the figures (also when the test passes) and keep them as JSON at ``path``."""
    with capsys.disabled():
        print(chaos.report() + (f"\n{extra}" if extra else ""))
    path.write_text(json.dumps([f.__dict__ for f in chaos.figures], indent=2))

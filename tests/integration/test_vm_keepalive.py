"""A VM agent's heartbeats (``trellis vm heartbeat --every``) on one kept-alive connection.

The real endpoints-vm, and the agent as a process of its own, reaching endpoints-vm
through a TCP relay that counts the connections made to it: each is one TCP and one TLS
handshake with endpoints-vm (the relay forwards the bytes, TLS included, unchanged). The
server's own listing shows the heartbeats arriving (``last_heartbeat``).
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from trellis_common import statefile
from trellis_common.defaults import TRUST_BUNDLE_FILE
from trellis_testing import RedisServer, eventually
from trellis_testing.relay import Relay
from trellis_testing.services import ServiceProcess, trellis

pytestmark = pytest.mark.integration

WORKLOAD = ("shop", "cart-1")


class CountingRelay(Relay):
    """The relay, counting the connections clients open through it."""

    connections = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await super()._serve(reader, writer)


@pytest.fixture
def endpoints_vm(
    state_dir: Path, redis_server: RedisServer, certmanager: ServiceProcess
) -> Iterator[ServiceProcess]:
    process = ServiceProcess(
        "endpoints-vm",
        "trellis_endpoints_vm.main",
        state_dir,
        redis_server,
        env={"TRELLIS_ENDPOINTS_VM_EXPIRY_INTERVAL": "0.1"},
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
async def relay(endpoints_vm: ServiceProcess) -> AsyncIterator[CountingRelay]:
    port = int(endpoints_vm.endpoint.admin_url.rsplit(":", 1)[1])
    counting = CountingRelay("127.0.0.1", port)
    async with counting:
        yield counting


@pytest.fixture
def agent_dir(tmp_path: Path, state_dir: Path, relay: CountingRelay) -> Path:
    """The agent's host: the mesh's trust bundle, and endpoints-vm's address as the relay's."""
    folder = tmp_path / "agent"
    (folder / "services").mkdir(parents=True)
    shutil.copy(state_dir / TRUST_BUNDLE_FILE, folder / TRUST_BUNDLE_FILE)
    served = statefile.read_endpoint(state_dir, "endpoints-vm")
    assert served is not None
    through = statefile.ServiceEndpoint(
        "endpoints-vm", f"https://127.0.0.1:{relay.port}", served.grpc_address, served.pid
    )
    statefile.write_endpoint(folder, through)
    return folder


@pytest.fixture
async def token_file(endpoints_vm: ServiceProcess, state_dir: Path, tmp_path: Path) -> Path:
    kept = tmp_path / "heartbeat-token"
    namespace, name = WORKLOAD
    done = await asyncio.to_thread(
        trellis, state_dir, "vm", "register", "-n", namespace, "--name", name,
        "--service", "cart", "--address", "10.1.0.1", "--port", "http=8080", "--ttl", "30",
        "--token-out", str(kept),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return kept


class Agent:
    """``trellis vm heartbeat --every SECONDS --json`` as a process: one JSON line per beat."""

    def __init__(self, agent_dir: Path, token_file: Path, out: Path, every: float = 0.1) -> None:
        namespace, name = WORKLOAD
        self.out = out
        with out.open("wb") as sink, out.with_suffix(".err").open("wb") as errors:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "trellis_cli.main", "--state-dir", str(agent_dir),
                 "vm", "heartbeat", "-n", namespace, "--name", name,
                 "--token-file", str(token_file), "--every", str(every), "--json"],
                stdout=sink, stderr=errors,
            )  # fmt: skip

    def beats(self) -> int:
        return sum(1 for line in self.out.read_text().splitlines() if line.startswith("{"))

    def errors(self) -> str:
        return self.out.with_suffix(".err").read_text()

    async def stop(self) -> int:
        """SIGTERM, then its exit status. Waited for in a thread: the relay runs on the
        test's event loop, and a heartbeat in flight at the signal is still answered
        through it (blocking the loop here left one to time out after 10 s)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return await asyncio.to_thread(self.process.wait, 15)


@pytest.fixture
def agent(agent_dir: Path, token_file: Path, tmp_path: Path) -> Iterator[Agent]:
    started = Agent(agent_dir, token_file, tmp_path / "agent.out")
    try:
        yield started
    finally:
        if started.process.poll() is None:
            started.process.kill()
            started.process.wait(15)


def last_heartbeat(endpoints_vm: ServiceProcess) -> float:
    """What the server recorded: the workload's last heartbeat."""
    workloads = endpoints_vm.get("/v1/workloads").json()["workloads"]
    (workload,) = [w for w in workloads if (w["namespace"], w["name"]) == WORKLOAD]
    return float(workload["last_heartbeat"])


async def test_one_shot_heartbeats_each_open_a_connection(
    relay: CountingRelay, agent_dir: Path, token_file: Path
) -> None:
    """The control: the counter sees every fresh connection."""
    namespace, name = WORKLOAD
    for _ in range(3):
        done = await asyncio.to_thread(
            trellis, agent_dir, "vm", "heartbeat", "-n", namespace, "--name", name,
            "--token-file", str(token_file),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert relay.connections == 3


async def test_the_agent_sends_every_heartbeat_on_one_connection(
    relay: CountingRelay, endpoints_vm: ServiceProcess, agent: Agent
) -> None:
    before = await asyncio.to_thread(last_heartbeat, endpoints_vm)
    await eventually(lambda: agent.beats() >= 15, timeout=20)
    assert relay.connections == 1, agent.errors()
    assert await asyncio.to_thread(last_heartbeat, endpoints_vm) > before
    assert await agent.stop() == 0
    assert agent.errors() == ""


async def test_after_a_server_restart_the_agent_reconnects_and_keeps_heartbeating(
    relay: CountingRelay, endpoints_vm: ServiceProcess, agent: Agent
) -> None:
    await eventually(lambda: agent.beats() >= 5, timeout=20)
    assert relay.connections == 1
    endpoint = endpoints_vm.endpoint
    ports = (int(endpoint.grpc_address.rsplit(":", 1)[1]), relay.target[1])
    await asyncio.to_thread(endpoints_vm.stop)
    # the same ports, as a supervisor restarts it
    await asyncio.to_thread(endpoints_vm.start, 30.0, ports)
    restarted = time.time()
    seen = agent.beats()
    await eventually(lambda: agent.beats() >= seen + 10, timeout=20)
    assert agent.process.poll() is None  # still running, never gave up
    assert relay.connections >= 2  # a new connection to the new process
    reconnected = relay.connections
    await eventually(lambda: agent.beats() >= seen + 20, timeout=20)
    assert relay.connections == reconnected  # and then kept, as before
    assert await asyncio.to_thread(last_heartbeat, endpoints_vm) > restarted
    assert await agent.stop() == 0


async def test_the_server_keeps_an_idle_connection_longer_than_uvicorn_s_default(
    relay: CountingRelay, agent_dir: Path, token_file: Path, tmp_path: Path
) -> None:
    """Heartbeats 6 s apart still share one connection: endpoints-vm keeps an idle one
    75 s (``trellis_runtime.admin.KEEP_ALIVE_SECONDS``), where uvicorn's own default (5 s)
    would have closed it between two heartbeats."""
    slow = Agent(agent_dir, token_file, tmp_path / "slow.out", every=6)
    try:
        await eventually(lambda: slow.beats() >= 2, timeout=30)
        assert relay.connections == 1, slow.errors()
        assert await slow.stop() == 0
    finally:
        if slow.process.poll() is None:
            slow.process.kill()
            slow.process.wait(15)

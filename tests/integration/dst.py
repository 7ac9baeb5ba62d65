"""Test helpers for the Destination API: upstream's generated client as a process, and the
client-side state it reconstructs from the updates.

:func:`generate_upstream` compiles ``proto/vendor`` (upstream's files, byte for byte) into a
folder with ``grpc_tools.protoc``, as a Linkerd user's own build would; :class:`DstClient`
runs ``linkerd_client.py`` on it and reads its JSON lines. :class:`Endpoints` applies
``add``/``remove``/``no_endpoints`` as the seed says a client must.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import ipaddress
import json
import queue
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CLIENT = Path(__file__).with_name("linkerd_client.py")
VENDOR = ROOT / "proto" / "vendor"


def generate_upstream(out: Path) -> Path:
    """Upstream's Python for both APIs, in ``out`` (made if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    include = importlib.resources.files("grpc_tools") / "_proto"
    for folder in ("linkerd2-proxy-api", "linkerd2-conduit"):
        root = VENDOR / folder
        protos = sorted(str(p.relative_to(root)) for p in root.rglob("*.proto"))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{root}",
                f"-I{include}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                *protos,
            ],
            check=True,
        )
    for package in ("common", "proxy", "proxy/destination"):
        (out / package / "__init__.py").touch()
    return out


@dataclass(frozen=True)
class ClientFiles:
    cert: Path
    key: Path
    ca: Path


class DstClient:
    """One stream of upstream's client, in its own process."""

    def __init__(
        self,
        generated: Path,
        files: ClientFiles,
        address: str,
        path: str,
        *,
        api: str = "linkerd",
        rpc: str = "Get",
        token: str = "",
    ) -> None:
        argv = [
            sys.executable,
            str(CLIENT),
            str(generated),
            api,
            rpc,
            address,
            path,
            str(files.cert),
            str(files.key),
            str(files.ca),
            *([token] if token else []),
        ]
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.received: list[dict[str, Any]] = []
        self.status: dict[str, Any] | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(json.loads(line))

    def next(self, timeout: float = 10.0) -> dict[str, Any]:
        """The next message (raises AssertionError if the stream ended instead)."""
        item = self.lines.get(timeout=timeout)
        if "status" in item:
            self.status = item
            raise AssertionError(f"the stream ended: {item}")
        message: dict[str, Any] = item["message"]
        self.received.append(message)
        return message

    def end(self, timeout: float = 10.0) -> dict[str, Any]:
        """Read until the stream's end; returns its status."""
        while True:
            item = self.lines.get(timeout=timeout)
            if "status" in item:
                self.status = item
                return item
            self.received.append(item["message"])

    def quiet(self, seconds: float) -> bool:
        """No message for ``seconds``."""
        try:
            item = self.lines.get(timeout=seconds)
        except queue.Empty:
            return True
        self.lines.put(item)  # not ours to drop; only that something came
        return False

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        if self.process.stdout is not None:
            self.process.stdout.close()


def address_of(addr: dict[str, Any]) -> str:
    """``ip:port`` of a JSON ``TcpAddress``."""
    ip = addr.get("ip", {})
    if "ipv6" in ip:
        value = (int(ip["ipv6"].get("first", 0)) << 64) | int(ip["ipv6"].get("last", 0))
        return f"[{ipaddress.IPv6Address(value)}]:{addr.get('port', 0)}"
    return f"{ipaddress.IPv4Address(int(ip.get('ipv4', 0)))}:{addr.get('port', 0)}"


@dataclass
class Endpoints:
    """What a client knows after the updates so far, by the seed's rules."""

    addresses: dict[str, dict[str, Any]] = field(default_factory=dict)
    exists: bool | None = None  # None: nothing received yet
    kinds: list[str] = field(default_factory=list)

    def apply(self, update: dict[str, Any]) -> None:
        if "add" in update:
            self.kinds.append("add")
            for addr in update["add"].get("addrs", []):
                self.addresses[address_of(addr["addr"])] = addr
            self.exists = True
        elif "remove" in update:
            self.kinds.append("remove")
            for addr in update["remove"].get("addrs", []):
                gone = address_of(addr)
                assert gone in self.addresses, f"remove of {gone}, never added"
                del self.addresses[gone]
        else:
            exists = bool(update["no_endpoints"].get("exists", False))
            self.kinds.append(f"no_endpoints({str(exists).lower()})")
            self.addresses.clear()
            self.exists = exists

    def follow(self, client: DstClient, until: set[str], timeout: float = 10.0) -> None:
        """Apply updates until the client knows exactly the addresses ``until``."""
        while set(self.addresses) != until:
            self.apply(client.next(timeout))

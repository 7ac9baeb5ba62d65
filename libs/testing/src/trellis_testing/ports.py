"""Free TCP ports for tests that must name a port before the process that binds it starts.

A test that hands a port to another process (an Envoy's listener, a Redis, proxy-cp's
Destination port) cannot bind it itself first. The classic recipe, bind port 0, read the
port and close, hands out a port from the kernel's ephemeral range: the very range the
kernel also picks from for every outgoing connection and every other ``bind(0)``. Between
the close and the other process's bind, anything on the machine may take it; with several
pytest workers making hundreds of connections a second, something did ("Address already in
use" on a port a test had just been given).

So :func:`free_port` hands out ports *below* the ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``), which the kernel never gives to a connection or
to ``bind(0)``: only another caller of this function could take one. Each pytest-xdist worker
(``PYTEST_XDIST_WORKER``, ``gw0``, ``gw1``...) has a slice of its own, each process walks its
slice from an offset of its own, and a port is handed out only after a bind on it succeeded,
so the callers do not collide either. Where no such range exists (a kernel whose ephemeral
range starts low), it falls back to ``bind(0)``.
"""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Iterator
from pathlib import Path

#: The lowest port handed out: above the fixed ports Trellis and its demo use by default
#: (15010-16379, 14001-14999).
LOWEST = 20_000
#: The most workers the range is sliced for; workers past it share slices (still checked).
SLICES = 16
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_start() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _worker() -> int:
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = name.removeprefix("gw")
    return int(digits) if digits.isdigit() else 0


def _candidates() -> Iterator[int]:
    high = _ephemeral_start()
    size = (high - LOWEST) // SLICES
    if size < 16:
        return iter(())
    first = LOWEST + (_worker() % SLICES) * size
    start = os.getpid() % size  # processes of one worker walk from different places
    return itertools.cycle([first + (start + n) % size for n in range(size)])


_PORTS: Iterator[int] | None = None


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and that no outgoing
    connection or ``bind(0)`` on this machine will take before the caller binds it."""
    global _PORTS
    if _PORTS is None:
        _PORTS = _candidates()
    for port in itertools.islice(_PORTS, 1_000):
        if _bindable(port):
            return port
    return _kernel_port()

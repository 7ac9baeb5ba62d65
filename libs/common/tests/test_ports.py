"""free_port: below the kernel's ephemeral range, a slice per xdist worker, never a bound port."""

from __future__ import annotations

import socket

import pytest

from trellis_testing import ports


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """free_port as a new process would start it (its walk is made on first use)."""
    monkeypatch.setattr(ports, "_PORTS", None)
    return monkeypatch


def test_ports_are_below_the_ephemeral_range_and_bindable(fresh: pytest.MonkeyPatch) -> None:
    high = ports._ephemeral_start()
    handed = [ports.free_port() for _ in range(20)]
    assert all(ports.LOWEST <= port < high for port in handed)
    assert len(set(handed)) == 20
    for port in handed:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_workers_get_slices_of_their_own(fresh: pytest.MonkeyPatch) -> None:
    fresh.setenv("PYTEST_XDIST_WORKER", "gw0")
    first = {ports.free_port() for _ in range(50)}
    fresh.setattr(ports, "_PORTS", None)
    fresh.setenv("PYTEST_XDIST_WORKER", "gw1")
    second = {ports.free_port() for _ in range(50)}
    size = (ports._ephemeral_start() - ports.LOWEST) // ports.SLICES
    assert all(ports.LOWEST <= p < ports.LOWEST + size for p in first)
    assert all(ports.LOWEST + size <= p < ports.LOWEST + 2 * size for p in second)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_bound_port_is_skipped(fresh: pytest.MonkeyPatch) -> None:
    # the walk starts again at the slice's first port: servers of earlier tests in this
    # worker may still hold some of them, and free_port skips those too
    expected = ports._candidates()
    taken = next(p for p in expected if _bindable(p))
    following = next(p for p in expected if _bindable(p))
    fresh.setattr(ports, "_PORTS", ports._candidates())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", taken))
        sock.listen()
        assert ports.free_port() == following


def test_no_range_below_the_kernels_falls_back_to_bind_zero(fresh: pytest.MonkeyPatch) -> None:
    fresh.setattr(ports, "_ephemeral_start", lambda: ports.LOWEST + 10)
    port = ports.free_port()
    assert 0 < port < 65536
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))

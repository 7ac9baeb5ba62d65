"""The agent's kept-alive client (:mod:`trellis_cli.keepalive`) against a real HTTP/1.1 server
on a socket: one connection for many calls, and a call whose connection is closed under it
(the server read it, then went away without an answer) sent once more on a fresh one."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from trellis_cli import errors, keepalive
from trellis_cli.errors import CliError, NotFound

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class Server:
    """Answers every request on a connection with ``{}``, keeping the connection open,
    except that it reads the ``drop_at``-th request of the whole run and closes the
    connection without answering it (a restart between a request and its answer)."""

    def __init__(self, drop_at: int = 0) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.requests = 0
        self.drop_at = drop_at
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            buffered = b""
            while True:
                while b"\r\n\r\n" not in buffered:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    buffered += chunk
                _, _, buffered = buffered.partition(b"\r\n\r\n")
                self.requests += 1
                if self.requests == self.drop_at:
                    return  # read, never answered: the connection closes under the call
                connection.sendall(ANSWER)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    started = Server(getattr(request, "param", 0))
    try:
        yield started
    finally:
        started.close()


def kept_client() -> httpx.Client:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=60)
    return httpx.Client(transport=keepalive.RetryOnce(httpx.HTTPTransport(limits=limits)))


def test_every_call_goes_on_one_connection(server: Server) -> None:
    with kept_client() as client:
        for _ in range(5):
            assert client.post(f"http://127.0.0.1:{server.port}/beat").json() == {}
    assert (server.requests, server.connections) == (5, 1)


@pytest.mark.parametrize("server", [3], indirect=True)
def test_a_call_whose_connection_closed_under_it_is_sent_again_on_a_fresh_one(
    server: Server,
) -> None:
    transport = keepalive.RetryOnce(httpx.HTTPTransport())
    with httpx.Client(transport=transport) as client:
        for _ in range(5):
            assert client.post(f"http://127.0.0.1:{server.port}/beat").json() == {}
    assert transport.resent == 1
    assert (server.requests, server.connections) == (6, 2)  # the dropped one, sent again


@pytest.mark.parametrize("server", [2], indirect=True)
def test_without_the_retry_the_same_close_fails_the_call(server: Server) -> None:
    """The control: the plain transport gives the caller the closed connection."""
    with httpx.Client() as client:
        client.post(f"http://127.0.0.1:{server.port}/beat")
        with pytest.raises(httpx.RemoteProtocolError):
            client.post(f"http://127.0.0.1:{server.port}/beat")


def test_the_loop_backs_off_while_failing_and_resumes(capsys: pytest.CaptureFixture[str]) -> None:
    stop = threading.Event()
    outcomes: list[str] = ["fail", "fail", "ok", "ok"]

    def beat() -> dict[str, object]:
        outcome = outcomes.pop(0)
        if not outcomes:
            stop.set()
        if outcome == "fail":
            raise CliError("endpoints-vm is not reachable")
        return {"expires_at": 1.0}

    assert keepalive.beat_until(stop, 0.05, beat, as_json=True) == 2
    captured = capsys.readouterr()
    assert captured.err.count("heartbeat failed") == 2
    assert "(2 in a row)" in captured.err
    assert "heartbeats resumed after 2 failed" not in captured.err  # --json: lines only
    assert captured.out.splitlines() == ['{"expires_at": 1.0}'] * 2


def test_the_loop_stops_at_a_404_the_workload_is_not_registered_any_more() -> None:
    """Deregistered, or reaped after it stayed expired (``reap_after``): no retry brings it
    back, so the agent stops with the 404 (exit 1) instead of retrying for ever."""
    stop = threading.Event()
    calls: list[int] = []

    def beat() -> dict[str, object]:
        calls.append(1)
        if len(calls) > 1:
            stop.set()  # a loop that retried would get here
        raise errors.for_status("endpoints-vm", 404, "no workload 'shop/vm-1' is registered")

    with pytest.raises(NotFound) as raised:
        keepalive.beat_until(stop, 0.01, beat)
    assert raised.value.exit_code == errors.NEGATIVE
    assert "404" in str(raised.value.message)
    assert calls == [1]

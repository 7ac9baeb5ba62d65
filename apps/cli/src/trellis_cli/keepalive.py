"""One kept-alive HTTPS connection to endpoints-vm, for a workload's heartbeat loop.

A VM agent (``trellis vm heartbeat --every SECONDS``) calls endpoints-vm for as long as its
workload runs. A fresh HTTPS connection per call pays a TCP and a TLS handshake each time
(8-10 ms on a 2-core machine, more than the request itself), so the agent keeps one
connection open and sends every call on it. The rules it follows, which any agent of its
own should follow too (the README's "Keep-alive for agents"):

- **One connection, reused.** One :class:`httpx.Client` holds at most one connection to
  each endpoints-vm address (:func:`client`). Its idle connection expires after
  :data:`IDLE_EXPIRY` seconds, sooner than the server's (endpoints-vm, like every admin
  API, keeps an idle connection :data:`trellis_runtime.admin.KEEP_ALIVE_SECONDS`, 75 s):
  the client always gives up first, so no call is sent on a connection the server is
  closing at that very moment. A heartbeat interval below :data:`IDLE_EXPIRY` keeps the one
  connection for the agent's whole life.
- **A closed connection: once more, on a fresh one.** A call that fails because its
  connection was closed under it (the server restarted, or a load balancer dropped it:
  no answer, a reset, a broken pipe) is sent once more on a new connection
  (:class:`RetryOnce`), which is safe because the agent sends only idempotent calls: a
  heartbeat sets the workload's last heartbeat to now, however often it arrives; a
  registration by name replaces the same record (its ``registered_at`` kept, no second use
  of an onboarding token), and each answer's heartbeat token voids the ones before it, so
  a token lost with an unanswered attempt is void anyway. A deregistration is not (a
  repeat answers 404), and is never sent through this client.
- **Still failing: back off.** A call that fails on the fresh connection too (the server
  is down or restarting) is the loop's to retry (:func:`beat_until`), after a backoff that
  doubles from :data:`FIRST_RETRY` up to the interval; each retry dials anew.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable
from typing import Any

import click
import httpx

from trellis_cli.client import CliError, Mesh

#: Seconds the client keeps an idle connection: below endpoints-vm's 75 s
#: (``trellis_runtime.admin.KEEP_ALIVE_SECONDS``), so the client always closes first.
IDLE_EXPIRY = 60.0
#: The first retry's delay after a failed heartbeat; it doubles up to the interval.
FIRST_RETRY = 0.2
#: What a connection closed under a request looks like: sent, but never answered.
CLOSED_UNDER_IT = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


class RetryOnce(httpx.BaseTransport):
    """A transport that sends a request once more, on a fresh connection, when the one it
    was sent on was closed under it (:data:`CLOSED_UNDER_IT`). Only for clients whose every
    call is idempotent (see the module's docstring)."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self._inner = inner
        #: requests sent again after their connection closed under them
        self.resent = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return self._inner.handle_request(request)
        except CLOSED_UNDER_IT:
            # the closed connection is out of the pool: this one dials a new connection
            self.resent += 1
            return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


def client(mesh: Mesh) -> httpx.Client:
    """A client that keeps one connection to each address, reused by every call, and that
    sends a call again on a fresh connection once if its connection closed under it."""
    from trellis_runtime import adminhttp

    try:
        context = adminhttp.mesh_context(mesh.state_dir)
    except OSError as exc:
        raise CliError(
            f"no trust bundle at {adminhttp.trust_bundle_path(mesh.state_dir)}: certmanager "
            f"writes it when it starts; is --state-dir (now {mesh.state_dir}) the mesh's?"
        ) from exc
    limits = httpx.Limits(
        max_connections=1, max_keepalive_connections=1, keepalive_expiry=IDLE_EXPIRY
    )
    transport = RetryOnce(httpx.HTTPTransport(verify=context, limits=limits))
    return httpx.Client(transport=transport, timeout=10.0)


def beat_until(
    stop: threading.Event,
    interval: float,
    beat: Callable[[], dict[str, Any]],
    *,
    as_json: bool = False,
) -> int:
    """Call ``beat`` every ``interval`` seconds until ``stop``; a failure (no answer: a
    :class:`CliError`) is reported and retried with backoff, while a negative answer (a
    :class:`~trellis_cli.errors.NotFound`: the workload is not registered any more,
    deregistered or reaped) ends the loop, as no retry can change it. Returns the number
    of heartbeats that were answered."""
    answered, failures = 0, 0
    while not stop.is_set():
        try:
            result = beat()
        except CliError as exc:
            failures += 1
            delay = min(interval, FIRST_RETRY * 2 ** (failures - 1))
            click.echo(f"heartbeat failed ({failures} in a row): {exc}; retry in {delay:.1f}s",
                       err=True)  # fmt: skip
            stop.wait(delay)
            continue
        answered += 1
        if as_json:
            click.echo(json.dumps(result, sort_keys=True, default=str))
        elif failures:
            click.echo(f"heartbeats resumed after {failures} failed", err=True)
        failures = 0
        stop.wait(interval)
    return answered


def heartbeat_every(
    mesh: Mesh, service: str, path: str, token: str, every: float, *, as_json: bool
) -> int:
    """``trellis vm heartbeat --every``: heartbeat on one kept-alive connection until
    SIGTERM or SIGINT. Returns the number of heartbeats answered."""
    stop = threading.Event()
    stopping = (signal.SIGTERM, signal.SIGINT)
    handlers = {signum: signal.signal(signum, lambda *_: stop.set()) for signum in stopping}
    if not as_json:
        click.echo(f"heartbeating every {every:g}s on one kept-alive connection: {path}")
    try:
        with client(mesh) as kept:
            answered = beat_until(
                stop,
                every,
                lambda: mesh.call(service, "POST", path, bearer=token, client=kept),
                as_json=as_json,
            )
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    if not as_json:
        click.echo(f"stopped after {answered} heartbeats")
    return answered

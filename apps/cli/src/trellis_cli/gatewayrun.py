"""A gateway Envoy run in the foreground, its certificates renewed, until SIGTERM.

``trellis gateway run`` is the one long-running process of a Gateway, under whatever
supervises it (Kubernetes, systemd, ``trellis up``'s supervisor), so it stays simple and
says how it ended by its exit code:

- Envoy runs as its child (tied to it with ``PR_SET_PDEATHSIG``, as ``trellis up``'s
  children are: it never outlives the command), with the bootstrap ``gateway bootstrap``
  writes and the flags of every mesh sidecar;
- a thread renews the proxy and workload certificates through proxy-cp
  (:func:`trellis_cli.renew.watch`, as ``trellis proxy renew --watch``; in a pod, the
  agent's re-enrollment, :mod:`.gatewaypod`): Envoy reloads them from its folder with no
  restart;
- SIGTERM or SIGINT: SIGTERM to Envoy, SIGKILL after ``grace`` seconds, the renewal
  stopped, exit 0;
- Envoy ending by itself ends the command with an error (exit 2), so the supervisor starts
  it again, onboarding afresh: a gateway is never left without its Envoy.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
from pathlib import Path

from trellis_cli import renew
from trellis_cli.envoyrun import envoy_binary
from trellis_cli.errors import CliError
from trellis_cli.supervisor import _die_with_parent
from trellis_common.bootstrap import sidecar_args

log = logging.getLogger("trellis.gateway")


def configure_logging() -> None:
    """One ``key=value`` event per line on stderr, as the pod agent logs."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )


def envoy_argv(config: Path, extra: list[str]) -> list[str]:
    return [envoy_binary(), "-c", str(config), *sidecar_args(), *extra]


def stop_on_signals() -> threading.Event:
    """An event SIGTERM and SIGINT set."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def serve(
    gateway: str,
    config: Path,
    extra: list[str],
    stop: threading.Event,
    grace: float = 10.0,
    renewer: threading.Thread | None = None,
) -> None:
    """Run Envoy on ``config`` until ``stop`` or until Envoy ends (a :class:`CliError`),
    its certificates renewed by ``renewer`` (a thread that ends on ``stop``; by default
    :func:`trellis_cli.renew.watch` on the bootstrap's folder)."""
    if renewer is None:
        renewer = threading.Thread(
            target=renew.watch,
            args=(renew.ProxyFolder.load(config.parent),),
            kwargs={"stop": stop},
            name="renew",
            daemon=True,
        )
        renewer.start()
    argv = envoy_argv(config, extra)
    try:
        envoy = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)  # noqa: S603 (Envoy, found as `trellis envoy run` does)
    except OSError as exc:
        raise CliError(f"cannot run {argv[0]}: {exc}") from exc
    log.info("gateway.started gateway=%s envoy_pid=%d config=%s", gateway, envoy.pid, config)

    def ended() -> None:
        envoy.wait()
        stop.set()

    threading.Thread(target=ended, name="envoy-wait", daemon=True).start()
    stop.wait()
    code = envoy.poll()
    if code is None:
        log.info("gateway.stopping gateway=%s envoy_pid=%d", gateway, envoy.pid)
        envoy.terminate()
        try:
            envoy.wait(grace)
        except subprocess.TimeoutExpired:
            log.warning("gateway.killing gateway=%s reason=%r", gateway, "ignored SIGTERM")
            envoy.kill()
            envoy.wait()
    renewer.join(timeout=5.0)
    if code is not None:
        log.error("gateway.envoy_exited gateway=%s code=%d", gateway, code)
        raise CliError(f"envoy of gateway {gateway} exited with code {code}")
    log.info("gateway.stopped gateway=%s", gateway)

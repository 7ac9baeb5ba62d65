"""Network namespaces for tests that run pods as root: entering one, running commands and
processes in it, waiting for it, and cleaning up after it.

This is the bottom of the pod test bed: :mod:`.pods` builds a node and its pods out of
these namespaces, and :mod:`.kubelet` runs a Pod object's containers in them, as the kubelet
would. Everything here needs root; :func:`sweep` cleans up after a run that crashed before
its :meth:`~.pods.Node.close`.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import ipaddress
import itertools
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from functools import cache, partial
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any, TypeVar

from trellis_testing.waiting import wait_until

T = TypeVar("T")

#: Every pod address is in this network; the node's bridge holds its first address.
CLUSTER_POD_CIDR = "10.244.0.0/16"
#: The node's address on the bridge: the pods' default gateway.
NODE_IP = "10.244.0.1"
#: The bridge in the node namespace that every pod's veth is attached to.
BRIDGE = "br0"

#: Where ``ip netns`` keeps its named namespaces, and the per-namespace ``/etc`` overlays.
NETNS_RUN_DIR = Path("/run/netns")
NETNS_ETC_DIR = Path("/etc/netns")

_NETWORK = ipaddress.ip_network(CLUSTER_POD_CIDR)
_CLONE_NEWNET = 0x40000000
_STOP_GRACE_S = 5.0
_POLL_INTERVAL_S = 0.01
_SETUP_TIMEOUT_S = 30.0
#: How much of a sidecar's log an error quotes.
_LOG_TAIL_LINES = 20
#: Searched after the caller's PATH for the tools the wrapper runs (``ip`` is in sbin).
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_NO_STRINGS: Mapping[str, str] = MappingProxyType({})
_NO_MOUNTS: Mapping[str, Path] = MappingProxyType({})

#: Veth names are per namespace, but a process-wide counter keeps them unique in every one
#: (and within the kernel's 15 characters) whatever the number of nodes.
_veth_numbers = itertools.count(1)

_libc = ctypes.CDLL(None, use_errno=True)


class NetnsCleanupError(RuntimeError):
    """Some steps of a clean-up failed; every step still ran. ``errors`` holds each failure."""

    def __init__(self, what: str, errors: Sequence[BaseException]) -> None:
        lines = "\n".join(f"- {error!r}" for error in errors)
        super().__init__(f"{what}: {len(errors)} step(s) failed:\n{lines}")
        self.errors = list(errors)


# --- waiting ----------------------------------------------------------------------------


def wait_for_tcp(netns: str, host: str, port: int, timeout: float = 5.0) -> None:
    """Wait until something accepts TCP connections on ``host:port`` as seen from ``netns``.

    A process spawned in a pod listens some time after :meth:`Pod.spawn` returns; this is
    how a test knows it may connect.
    """

    def wait_inside() -> bool:
        what = f"a listener on {host}:{port} in {netns}"
        return wait_until(partial(_accepts, host, port), timeout, what)

    call_in_netns(netns, wait_inside)  # one thread polls, inside the namespace


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


# --- commands ---------------------------------------------------------------------------


@cache
def _tool(name: str) -> str:
    """The absolute path of a system tool.

    The wrapper runs before a pod's own environment applies, and that environment's PATH
    (a container's) need not hold ``ip`` or ``setpriv``.
    """
    search = os.pathsep.join(filter(None, [os.environ.get("PATH"), _SYSTEM_PATH]))
    found = shutil.which(name, path=search)
    if found is None:
        raise FileNotFoundError(f"{name!r} is not on PATH nor in {_SYSTEM_PATH}")
    return found


def _check(argv: Sequence[str], stdin: str | None = None) -> str:
    """Run a set-up command and return its output; raise, with its stderr, if it fails."""
    result = subprocess.run(
        argv,
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=_SETUP_TIMEOUT_S,
    )
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()
        raise RuntimeError(f"`{shlex.join(argv)}` failed (rc {result.returncode}): {output}")
    return result.stdout


def _ip(*args: str) -> str:
    return _check([_tool("ip"), *args])


def _ip_batch(netns: str, commands: Sequence[str]) -> None:
    """Run several ``ip`` commands in ``netns`` with one process: set-up stays quick."""
    _check([_tool("ip"), "-n", netns, "-batch", "-"], stdin="\n".join(commands) + "\n")


# --- namespaces -------------------------------------------------------------------------


def _setns(fd: int) -> None:
    """Move the calling thread into the network namespace ``fd`` refers to.

    ``os.setns`` only exists from Python 3.12, hence libc.
    """
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setns: {os.strerror(code)}")


@contextmanager
def in_netns(name: str) -> Iterator[None]:
    """Switch the calling thread's network namespace to ``/run/netns/<name>``; on exit (also
    on an exception) switch it back to the namespace it was in before.

    Sockets created inside belong to that namespace (and keep working after the switch
    back); threads and subprocesses started inside inherit it. Only the calling thread
    moves: the rest of the process, pytest included, stays where it was.
    """
    previous = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(NETNS_RUN_DIR / name, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(previous)
    finally:
        os.close(previous)


def call_in_netns(name: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` in a fresh thread switched into the namespace ``name``; return its result or
    raise its exception.

    The caller's thread never moves, so nothing it does meanwhile can land in the wrong
    namespace.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"netns-{name}") as pool:
        return pool.submit(_call_inside, name, fn).result()


def _call_inside(name: str, fn: Callable[[], T]) -> T:
    with in_netns(name):
        return fn()


def _netns_exists(name: str) -> bool:
    return (NETNS_RUN_DIR / name).exists()


def _list_netns() -> list[str]:
    """Names from ``ip netns list``, whose lines read ``name`` or ``name (id: 3)``."""
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _kill_netns_processes(name: str) -> None:
    """SIGKILL whatever still runs in namespace ``name`` (not this process, if it is there):
    a namespace whose processes live on outlasts ``ip netns del``."""
    for pid in (int(word) for word in _ip("netns", "pids", name).split()):
        if pid == os.getpid():
            continue
        with suppress(ProcessLookupError):  # it ended meanwhile
            os.kill(pid, signal.SIGKILL)


def _delete_netns(name: str) -> None:
    """Delete namespace ``name`` after killing what runs in it; nothing if there is none."""
    if not _netns_exists(name):
        return
    _kill_netns_processes(name)
    _ip("netns", "del", name)


def _remove_etc(name: str) -> None:
    """Remove the pod's ``/etc/netns/<name>`` overlay, if there is one."""
    directory = NETNS_ETC_DIR / name
    if directory.exists():
        shutil.rmtree(directory)


def sweep(prefix: str) -> list[str]:
    """Delete every network namespace whose name starts with ``prefix`` (killing what runs
    in it), and every ``/etc/netns/<prefix>*`` directory; return the namespaces removed.

    For the start of a test session, after a run that crashed before closing its node.
    """
    if not prefix:
        raise ValueError("sweep needs a non-empty prefix: it would delete every namespace")
    removed = [name for name in _list_netns() if name.startswith(prefix)]
    for name in removed:
        _delete_netns(name)
    for directory in glob.glob(str(NETNS_ETC_DIR / f"{glob.escape(prefix)}*")):
        shutil.rmtree(directory)
    return removed


# --- cleaning up ------------------------------------------------------------------------


def _attempt(errors: list[BaseException], step: Callable[[], object]) -> None:
    """Run a clean-up step; keep its exception for later so the next steps still run."""
    try:
        step()
    except Exception as error:  # noqa: BLE001 - collected and raised by the caller
        errors.append(error)


def _remove_created(paths: Sequence[Path]) -> None:
    """Remove mount points this module created, deepest first.

    A directory that is no longer empty is left alone: someone else (another node using
    the same parent directory) put something there.
    """
    for path in reversed(paths):
        try:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()
        except FileNotFoundError:
            pass
        except OSError as error:
            if error.errno != errno.ENOTEMPTY:
                raise


# --- processes --------------------------------------------------------------------------


def _has_exited(pid: int) -> bool:
    """Whether child ``pid`` has exited, without reaping it.

    An unreaped child keeps its pid, so signalling its process group afterwards cannot hit a
    stranger that reused the number.
    """
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped by someone else meanwhile
        return True


def _signal_group(pid: int, signum: int) -> None:
    with suppress(ProcessLookupError):  # the whole group ended meanwhile
        os.killpg(pid, signum)


def _stop_processes(processes: Sequence[subprocess.Popen[Any]]) -> None:
    """SIGTERM each process group, give them together up to five seconds, SIGKILL the rest.

    Only processes not yet reaped are signalled (see :func:`_has_exited`); a group whose
    leader a caller already reaped is left to the namespace clean-up in :meth:`Node.close`.
    """
    live = [process for process in processes if process.returncode is None]
    for process in live:
        _signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_GRACE_S
    while time.monotonic() < deadline and not all(_has_exited(p.pid) for p in live):
        time.sleep(_POLL_INTERVAL_S)
    for process in live:  # also takes the leaders' children still in their groups
        _signal_group(process.pid, signal.SIGKILL)
    for process in live:
        process.wait(timeout=_STOP_GRACE_S)


@contextmanager
def _output_sink(log: Path | None) -> Iterator[IO[bytes] | int]:
    """Where a spawned process writes: ``log``, appended to, or nowhere."""
    if log is None:
        yield subprocess.DEVNULL
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as sink:
        yield sink


def _environment(env: Mapping[str, str] | None) -> dict[str, str]:
    """``env`` exactly, plus the caller's PATH when ``env`` has none; the caller's whole
    environment when ``env`` is None."""
    if env is None:
        return dict(os.environ)
    result = dict(env)
    if "PATH" not in result:
        result["PATH"] = os.environ.get("PATH", _SYSTEM_PATH)
    return result


def _privileges(uid: int | None, gid: int | None) -> list[str]:
    """A ``setpriv`` prefix dropping to ``uid``/``gid`` with no supplementary groups (as a
    container's ``runAsUser``/``runAsGroup``), or nothing to stay root."""
    if uid is None and gid is None:
        return []
    argv = [_tool("setpriv")]
    if uid is not None:
        argv.append(f"--reuid={uid}")
    if gid is not None:
        argv.append(f"--regid={gid}")
    return [*argv, "--clear-groups", "--"]


def _make_mount_point(target: Path, *, directory: bool, created: list[Path]) -> None:
    """Create ``target`` (and missing parents) on the host, recording what was created.

    A bind mount needs an existing point of the source's kind; the point is made in the
    host's tree because the private mount namespace starts as a copy of it.
    """
    if target.exists() or target.is_symlink():
        return
    _make_mount_point(target.parent, directory=True, created=created)
    try:
        if directory:
            target.mkdir()
        else:
            target.touch(exist_ok=False)
    except FileExistsError:  # made meanwhile by someone else: theirs to remove
        return
    created.append(target)

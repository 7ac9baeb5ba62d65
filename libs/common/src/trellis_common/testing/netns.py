"""A tiny Kubernetes node made of network namespaces, for tests that run pods as root.

Tests of traffic capture (iptables in the pod, a sidecar reading ``SO_ORIGINAL_DST``) and of
what an injecting webhook writes into a pod spec need pods, but CI has no container runtime.
A pod's network is all those tests need, and a network namespace is exactly that, so:

- a :class:`Node` is a network namespace holding a bridge ``br0`` with :data:`NODE_IP`. The
  bridge lives in its own namespace and not in the root one because on our machines a bridge
  (or routed veths) in the root namespace resolves ARP but passes no TCP;
- a :class:`Pod` is a network namespace joined to the bridge by a veth pair, its end named
  ``eth0`` as in a real pod, with ``/etc/netns/<pod>/hosts`` standing in for cluster DNS;
- :meth:`Pod.spawn` runs a process the way a container runtime would: in the pod's network
  namespace (``ip netns exec``, which also puts the pod's hosts file over ``/etc/hosts``),
  in a private mount namespace holding the container's volume mounts, as its user;
- :func:`run_pod_spec` plays the kubelet: it runs a (webhook-patched) Pod object's init
  containers in order (to completion, or left running if they are native sidecars), then
  its containers.

Processes see the host's file system (there are no images), so a container's command must
exist on this machine. Everything here needs root; :func:`sweep` cleans up after a run that
crashed before its :meth:`Node.close`.
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
from dataclasses import dataclass, field
from functools import cache, partial
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any, TypeVar

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


def wait_until(
    predicate: Callable[[], T | None], timeout: float = 5.0, message: str | None = None
) -> T:
    """Poll ``predicate`` until it returns a truthy value, and return that value.

    The synchronous counterpart of :func:`trellis_common.testing.waiting.eventually`: tests
    wait for a condition, never for a guessed time. Raises ``AssertionError`` naming the
    condition after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            what = message or getattr(predicate, "__qualname__", repr(predicate))
            raise AssertionError(f"condition not met within {timeout}s: {what} (last: {value!r})")
        time.sleep(_POLL_INTERVAL_S)


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


# --- pods -------------------------------------------------------------------------------


class Pod:
    """A pod: network namespace ``name`` with ``eth0`` holding ``ip`` on the node's bridge.

    Made by :meth:`Node.pod`, which also tears it down.
    """

    def __init__(self, name: str, ip: str, *, veth: str, mount_points: list[Path]) -> None:
        self.name = name
        self.ip = ip
        #: The node's end of the pod's veth pair (in the node namespace).
        self.veth = veth
        self._mount_points = mount_points  # the node's list: it removes them on close
        self._processes: list[subprocess.Popen[bytes]] = []

    def __repr__(self) -> str:
        return f"Pod({self.name!r}, {self.ip!r})"

    def spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        uid: int | None = None,
        gid: int | None = None,
        mounts: Mapping[str, Path] = _NO_MOUNTS,
        cwd: Path | None = None,
        log: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in the pod as a container would run it, and return the process.

        It runs in the pod's network namespace with the pod's ``/etc/hosts``, in a private
        mount namespace where each ``mounts`` item (container path -> host directory or
        file) is bound at the container path, in ``cwd``, as ``uid``/``gid`` (root if not
        given), with exactly ``env`` (plus the caller's PATH if it has none; the caller's
        environment if None). Output (stdout and stderr) is appended to ``log``, or dropped.
        The process leads its own process group, which :meth:`stop` signals as a whole.
        """
        command = self._wrap(argv, uid=uid, gid=gid, mounts=mounts, cwd=cwd, env=env)
        with _output_sink(log) as sink:
            process = subprocess.Popen(
                command,
                env=_environment(env),
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._processes.append(process)
        return process

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        uid: int | None = None,
        gid: int | None = None,
        mounts: Mapping[str, Path] = _NO_MOUNTS,
        cwd: Path | None = None,
        timeout: float = 30,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the pod like :meth:`spawn`, wait for it, and return its output as
        text; raise ``RuntimeError`` naming the command, its exit status and its output if
        it fails or outlives ``timeout`` seconds (then its process group is killed)."""
        command = self._wrap(argv, uid=uid, gid=gid, mounts=mounts, cwd=cwd, env=env)
        process = subprocess.Popen(
            command,
            env=_environment(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)  # not reaped yet: the group is ours
            stdout, stderr = process.communicate()
            how = f"timed out after {timeout}s"
            raise RuntimeError(self._failure(argv, how, stdout, stderr)) from None
        except BaseException:  # interrupted: leave nothing running behind
            if process.returncode is None:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
            raise
        if process.returncode != 0:
            raise RuntimeError(self._failure(argv, f"rc {process.returncode}", stdout, stderr))
        return subprocess.CompletedProcess(list(argv), process.returncode, stdout, stderr)

    def stop(self) -> None:
        """SIGTERM every process group :meth:`spawn` started, wait up to five seconds for
        them together, and SIGKILL the groups still there."""
        processes, self._processes = self._processes, []
        _stop_processes(processes)

    def _failure(self, argv: Sequence[str], how: str, stdout: str, stderr: str) -> str:
        return (
            f"`{shlex.join(argv)}` in pod {self.name} failed ({how})\n"
            f"stdout:\n{stdout}\nstderr:\n{stderr}"
        )

    def _wrap(
        self,
        argv: Sequence[str],
        *,
        uid: int | None,
        gid: int | None,
        mounts: Mapping[str, Path],
        cwd: Path | None,
        env: Mapping[str, str] | None,
    ) -> list[str]:
        """The command line that runs ``argv`` as a container of this pod.

        ``ip netns exec`` enters the network namespace (binding ``/etc/netns/<pod>/*`` over
        ``/etc``); ``unshare --mount`` gives a private mount namespace, so the binds made by
        the small shell script are seen by this process alone (two pods may bind different
        directories at one container path); ``setpriv`` drops privileges last, after the
        binds that need root. ``argv`` travels as the script's arguments: no quoting.
        """
        if not argv:
            raise ValueError("argv is empty")
        lines = ["set -e"]
        for container_path, source in mounts.items():
            lines.append(self._bind_line(container_path, source))
        if cwd is not None:
            lines.append(f"cd {shlex.quote(str(cwd))}")
        if env is not None and "PWD" not in env:
            lines.append("unset PWD")  # the shell sets it; the caller asked for exactly env
        lines.append('exec "$@"')
        return [
            _tool("ip"),
            "netns",
            "exec",
            self.name,
            _tool("unshare"),
            "--mount",
            "--",
            _tool("sh"),
            "-c",
            "\n".join(lines),
            "sh",
            *_privileges(uid, gid),
            *argv,
        ]

    def _bind_line(self, container_path: str, source: Path) -> str:
        """The script line binding ``source`` at ``container_path``, its point made first."""
        target = Path(container_path)
        if not target.is_absolute():
            raise ValueError(f"mount path {container_path!r} is not absolute")
        if not source.exists():
            raise FileNotFoundError(f"mount source {source} (for {container_path}) is missing")
        _make_mount_point(target, directory=source.is_dir(), created=self._mount_points)
        # Absolute: the script binds before its `cd`, but relative to the caller anyway.
        return shlex.join([_tool("mount"), "--bind", str(source.absolute()), str(target)])


# --- the node ---------------------------------------------------------------------------


def _pod_address(ip: str) -> str:
    """``ip`` checked to be a usable host address of the pod network other than the node's."""
    address = ipaddress.ip_address(ip)
    if address not in _NETWORK or address in (
        _NETWORK.network_address,
        _NETWORK.broadcast_address,
        ipaddress.ip_address(NODE_IP),
    ):
        raise ValueError(
            f"pod IP {ip} must be a host address in {CLUSTER_POD_CIDR} other than {NODE_IP}"
        )
    return str(address)


def _hosts_file(name: str, ip: str, hosts: Mapping[str, str]) -> str:
    """``/etc/hosts`` for a pod: localhost, the pod itself, then ``hosts`` (name -> IP)."""
    lines = ["127.0.0.1 localhost", f"{ip} {name}"]
    for host, address in hosts.items():
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise ValueError(
                f"hosts maps a name to an IP address; {host!r} maps to {address!r}"
            ) from None
        lines.append(f"{address} {host}")
    return "\n".join(lines) + "\n"


class Node:
    """A node: network namespace ``name`` with ``lo`` up and a bridge ``br0`` holding
    :data:`NODE_IP`/16, up, that every pod's veth is attached to.

    Run the pods' peers (a control plane the pods must reach) in this namespace too, with
    :func:`in_netns` or :func:`call_in_netns`: the root namespace cannot reach the pods.
    A context manager: :meth:`start` on entry, :meth:`close` on exit.
    """

    def __init__(self, name: str = "trellis-node") -> None:
        self.name = name
        self._pods: list[Pod] = []
        self._mount_points: list[Path] = []
        self._started = False

    def __repr__(self) -> str:
        return f"Node({self.name!r}, pods={[pod.name for pod in self._pods]})"

    @property
    def pods(self) -> list[Pod]:
        """The pods made so far and not yet closed."""
        return list(self._pods)

    def start(self) -> Node:
        """Create the node namespace and its bridge, deleting a stale namespace of the same
        name first (left by a run that crashed). A half-made node is closed again."""
        if self._started:
            raise RuntimeError(f"node {self.name} is already started")
        _delete_netns(self.name)
        self._started = True
        try:
            _ip("netns", "add", self.name)
            _ip_batch(
                self.name,
                [
                    "link set lo up",
                    f"link add {BRIDGE} type bridge",
                    f"addr add {NODE_IP}/{_NETWORK.prefixlen} dev {BRIDGE}",
                    f"link set {BRIDGE} up",
                ],
            )
        except BaseException:
            self.close()
            raise
        return self

    def pod(self, name: str, ip: str, hosts: Mapping[str, str] = _NO_STRINGS) -> Pod:
        """Create pod ``name`` at ``ip`` (in :data:`CLUSTER_POD_CIDR`), deleting a stale
        namespace of that name first.

        ``hosts`` maps names to IP addresses for the pod's ``/etc/hosts`` (e.g.
        ``{"web.shop.svc.cluster.local": "10.96.0.10"}``): there is no cluster DNS, and
        ``resolv.conf`` names a server that does not answer.
        """
        if not self._started:
            raise RuntimeError(f"node {self.name} is not started")
        address = _pod_address(ip)
        for other in self._pods:
            if other.name == name or other.ip == address:
                raise ValueError(f"{other!r} already has the name or IP of pod {name} ({ip})")
        hosts_file = _hosts_file(name, address, hosts)
        pod = Pod(name, address, veth=f"tv{next(_veth_numbers)}", mount_points=self._mount_points)
        self._pods.append(pod)  # before making anything, so close() removes a half-made pod
        _delete_netns(name)
        _ip("netns", "add", name)
        _ip(
            *("link", "add", pod.veth, "netns", self.name, "type", "veth"),
            *("peer", "name", "eth0", "netns", name),
        )
        _ip_batch(self.name, [f"link set {pod.veth} master {BRIDGE} up"])
        _ip_batch(
            name,
            [
                "link set lo up",
                f"addr add {address}/{_NETWORK.prefixlen} dev eth0",
                "link set eth0 up",
                f"route add default via {NODE_IP}",
            ],
        )
        self._write_etc(name, hosts_file)
        return pod

    def remove_pods(self) -> None:
        """Stop and delete every pod made so far (processes, namespaces with their veths,
        ``/etc/netns`` directories), keeping the node for more; failures are raised together
        at the end (:class:`NetnsCleanupError`)."""
        errors: list[BaseException] = []
        pods, self._pods = self._pods, []
        for pod in pods:
            _attempt(errors, pod.stop)
        for pod in pods:
            _attempt(errors, partial(_delete_netns, pod.name))
            _attempt(errors, partial(_remove_etc, pod.name))
        if errors:
            raise NetnsCleanupError(f"removing the pods of node {self.name}", errors)

    def close(self) -> None:
        """Stop every pod's processes, delete the pod namespaces (killing what still runs in
        them), then the node's (its bridge and veth ends go with it), the pods'
        ``/etc/netns`` directories and the mount points that were created.

        Every step runs even if one fails; the failures are raised together at the end
        (:class:`NetnsCleanupError`). Closing again does nothing.
        """
        errors: list[BaseException] = []
        pods, self._pods = self._pods, []
        for pod in pods:
            _attempt(errors, pod.stop)
        for pod in pods:
            _attempt(errors, partial(_delete_netns, pod.name))
        if self._started:
            self._started = False
            _attempt(errors, partial(_delete_netns, self.name))
        for pod in pods:
            _attempt(errors, partial(_remove_etc, pod.name))
        created = list(self._mount_points)
        self._mount_points.clear()  # the list is shared with the pods: emptied in place
        _attempt(errors, partial(_remove_created, created))
        if errors:
            raise NetnsCleanupError(f"closing node {self.name}", errors)

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @staticmethod
    def _write_etc(name: str, hosts_file: str) -> None:
        directory = NETNS_ETC_DIR / name
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "hosts").write_text(hosts_file)
        (directory / "resolv.conf").write_text("nameserver 127.0.0.1\n")


# --- the kubelet's part -----------------------------------------------------------------


def expand_references(text: str, env: Mapping[str, str]) -> str:
    """Expand ``$(VAR)`` in ``text`` from ``env`` as the kubelet does.

    ``$$`` is a literal ``$`` (so ``$$(VAR)`` stays ``$(VAR)``), a reference to a variable
    not in ``env`` is left as written, and so is an unclosed ``$(``. A port of Kubernetes'
    ``third_party/forked/golang/expansion``.
    """
    out: list[str] = []
    cursor = 0
    while cursor < len(text):
        if text[cursor] != "$" or cursor + 1 == len(text):
            out.append(text[cursor])
            cursor += 1
            continue
        following = text[cursor + 1]
        if following == "(" and (closer := text.find(")", cursor + 2)) != -1:
            name = text[cursor + 2 : closer]
            out.append(env.get(name, f"$({name})"))
            cursor = closer + 1
            continue
        out.append("$" if following == "$" else "$" + following)  # "$$" is an escaped "$"
        cursor += 2
    return "".join(out)


@dataclass
class RunningPod:
    """What :func:`run_pod_spec` started: each container's process and log (native
    sidecars' too), and each other init container's output (stdout then stderr)."""

    pod: Pod
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    init_output: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _StartupProbe:
    """A native sidecar's ``startupProbe``, with the kubelet's defaults."""

    argv: list[str]
    initial_delay: int
    period: int
    timeout: int
    failure_threshold: int


@dataclass(frozen=True)
class _Container:
    """A container of the spec resolved into what :class:`Pod` runs."""

    name: str
    argv: list[str]
    env: dict[str, str]
    uid: int | None
    gid: int | None
    mounts: dict[str, Path]
    cwd: Path | None
    sidecar: bool  # an init container with restartPolicy Always
    startup_probe: _StartupProbe | None


def _field_values(pod: Pod, spec: Mapping[str, Any]) -> dict[str, str]:
    """The ``fieldRef`` paths we can answer, as the API server would have filled them in."""
    metadata = spec.get("metadata") or {}
    pod_spec = spec.get("spec") or {}
    return {
        "status.podIP": pod.ip,
        "metadata.name": metadata.get("name") or pod.name,
        "metadata.namespace": metadata.get("namespace") or "default",
        "spec.serviceAccountName": pod_spec.get("serviceAccountName") or "default",
    }


def _env_value(var: str, source: Mapping[str, Any], fields: Mapping[str, str]) -> str:
    """The value of env var ``var`` given by ``valueFrom`` ``source``."""
    field_path = (source.get("fieldRef") or {}).get("fieldPath")
    if set(source) != {"fieldRef"} or not isinstance(field_path, str) or field_path not in fields:
        raise NotImplementedError(
            f"env {var}: valueFrom {dict(source)!r} is not supported "
            f"(only fieldRef to {', '.join(fields)})"
        )
    return fields[field_path]


def _container_env(
    container: Mapping[str, Any], fields: Mapping[str, str], extra: Mapping[str, str], path: str
) -> dict[str, str]:
    """A container's environment: ``extra``, then its ``env`` items in order (each value's
    references expanded from the items before it), then PATH."""
    if container.get("envFrom"):
        raise NotImplementedError(f"container {container['name']}: envFrom is not supported")
    env = dict(extra)
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" in item:
            env[name] = _env_value(name, item["valueFrom"], fields)
        else:
            env[name] = expand_references(item.get("value", ""), env)
    env["PATH"] = path  # the image's PATH means nothing on the host
    return env


def _container_mounts(container: Mapping[str, Any], volumes: Mapping[str, Path]) -> dict[str, Path]:
    """Container path -> host path for each volume mount (``subPath`` within the volume,
    created if missing as the kubelet does; ``readOnly`` is not enforced)."""
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        volume = mount["name"]
        if volume not in volumes:
            raise KeyError(f"volume {volume!r} (mounted by container {container['name']})")
        source = volumes[volume]
        if mount.get("subPath"):
            source = source / mount["subPath"]
            if not source.exists():
                source.mkdir(parents=True)
        mounts[mount["mountPath"]] = source
    return mounts


def _probe_seconds(name: str, probe: Mapping[str, Any], key: str, default: int) -> int:
    """A probe's ``key`` in seconds; whole, as the API server requires."""
    value = probe.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"container {name}: startupProbe.{key} must be whole seconds: {value!r}")
    return value


def _startup_probe(container: Mapping[str, Any]) -> _StartupProbe | None:
    """A sidecar's ``startupProbe`` (``exec`` only), or None if it has none."""
    name, probe = container["name"], container.get("startupProbe")
    if not probe:
        return None
    command = (probe.get("exec") or {}).get("command")
    if not command:
        raise NotImplementedError(
            f"container {name}: startupProbe {dict(probe)!r} is not supported (only exec)"
        )
    seconds = partial(_probe_seconds, name, probe)
    return _StartupProbe(
        argv=list(command),
        initial_delay=seconds("initialDelaySeconds", 0),
        period=seconds("periodSeconds", 10),
        timeout=seconds("timeoutSeconds", 1),
        failure_threshold=seconds("failureThreshold", 3),
    )


def _resolve(
    container: Mapping[str, Any],
    pod_security: Mapping[str, Any],
    fields: Mapping[str, str],
    volumes: Mapping[str, Path],
    extra: Mapping[str, str],
    path: str,
) -> _Container:
    """Resolve one container of the spec, or raise before anything of the pod has run."""
    name = container["name"]
    command = container.get("command")
    if not command:
        raise ValueError(f"container {name} has no command: the image's entrypoint is unknown here")
    env = _container_env(container, fields, extra, path)
    security = {**pod_security, **(container.get("securityContext") or {})}
    working_dir = container.get("workingDir")
    sidecar = container.get("restartPolicy") == "Always"
    return _Container(
        name=name,
        argv=[expand_references(word, env) for word in [*command, *(container.get("args") or [])]],
        env=env,
        uid=security.get("runAsUser"),
        gid=security.get("runAsGroup"),
        mounts=_container_mounts(container, volumes),
        cwd=Path(working_dir) if working_dir else None,
        sidecar=sidecar,
        startup_probe=_startup_probe(container) if sidecar else None,
    )


def run_pod_spec(
    pod: Pod,
    spec: Mapping[str, Any],
    volumes: Mapping[str, Path],
    *,
    workdir: Path,
    path: str | None = None,
    env_extra: Mapping[str, str] = _NO_STRINGS,
    init_timeout: float = 30,
) -> RunningPod:
    """Run a Kubernetes Pod object (as patched by a webhook) in ``pod``, as the kubelet would.

    First each ``spec.initContainers[]`` in order, to completion (a failure raises with its
    output); then each ``spec.containers[]``, logging to ``workdir/<container>.log``.
    Each runs its ``command`` + ``args`` ($(VAR) references expanded), with its ``env``
    (``value``, or ``valueFrom.fieldRef`` to ``status.podIP``, ``metadata.name``,
    ``metadata.namespace``, ``spec.serviceAccountName``) after ``env_extra``, and PATH set to
    ``path`` or the caller's PATH; as ``securityContext.runAsUser``/``runAsGroup``
    (the container's, else the pod's, else root); in ``workingDir`` if given; with each
    ``volumeMounts`` item bound from ``volumes`` (volume name -> host directory).

    An init container with ``restartPolicy: Always`` is a native sidecar (Kubernetes 1.29+):
    it is started like a container (logged to ``workdir/<container>.log``, in
    ``processes``, stopped with the pod) and left running, and the next init container, or
    the containers, start once its ``startupProbe`` passes, or right away if it has none.
    The probe is ``exec`` only: its ``command`` runs in the pod as the container does (its
    uid, env and mounts), first after ``initialDelaySeconds`` (0), then every
    ``periodSeconds`` (10), each attempt allowed ``timeoutSeconds`` (1); after
    ``failureThreshold`` (3) failures in a row ``RuntimeError`` names the sidecar and the
    probe's last output (the kubelet would restart the sidecar and keep trying). A sidecar
    that exits before its probe passes raises ``RuntimeError`` with the tail of its log.
    Either way the sidecar stays with the pod, for :meth:`Pod.stop` to end.

    The image is not used: the command must exist on this machine, hence a container with
    no ``command`` (whose entrypoint would come from the image) raises ``ValueError``. An
    unknown volume raises ``KeyError``; an env source other than those fieldRefs, or a
    startup probe other than ``exec``, raises ``NotImplementedError``: all before anything
    runs.
    """
    pod_spec = spec.get("spec") or {}
    resolve = partial(
        _resolve,
        pod_security=pod_spec.get("securityContext") or {},
        fields=_field_values(pod, spec),
        volumes=volumes,
        extra=env_extra,
        path=path if path is not None else os.environ.get("PATH", _SYSTEM_PATH),
    )
    inits = [resolve(container) for container in pod_spec.get("initContainers") or []]
    containers = [resolve(container) for container in pod_spec.get("containers") or []]
    running = RunningPod(pod)
    for init in inits:
        if init.sidecar:
            _start(running, init, workdir)
            _await_startup(running, init)
        else:
            running.init_output[init.name] = _run_init(pod, init, init_timeout)
    for container in containers:
        _start(running, container, workdir)
    return running


def _start(running: RunningPod, container: _Container, workdir: Path) -> None:
    """Start a long-running container, logging to ``workdir/<container>.log``."""
    log = running.logs[container.name] = workdir / f"{container.name}.log"
    running.processes[container.name] = running.pod.spawn(
        container.argv,
        env=container.env,
        uid=container.uid,
        gid=container.gid,
        mounts=container.mounts,
        cwd=container.cwd,
        log=log,
    )


def _await_startup(running: RunningPod, sidecar: _Container) -> None:
    """Return once the sidecar's startup probe passes (at once if it has none); raise
    ``RuntimeError`` if it fails ``failureThreshold`` times in a row or the sidecar exits."""
    probe = sidecar.startup_probe
    if probe is None:
        return
    _watch_sidecar(running, sidecar, probe.initial_delay)
    for attempt in range(1, probe.failure_threshold + 1):
        started = time.monotonic()
        try:
            running.pod.run(
                probe.argv,
                env=sidecar.env,
                uid=sidecar.uid,
                gid=sidecar.gid,
                mounts=sidecar.mounts,
                cwd=sidecar.cwd,
                timeout=probe.timeout,
            )
            return
        except RuntimeError as error:
            if attempt == probe.failure_threshold:
                _check_alive(running, sidecar)  # an exit is the better explanation
                raise RuntimeError(
                    f"sidecar {sidecar.name} of pod {running.pod.name}: its startup probe "
                    f"failed {attempt} times; the last: {error}"
                ) from error
        _watch_sidecar(running, sidecar, probe.period - (time.monotonic() - started))


def _watch_sidecar(running: RunningPod, sidecar: _Container, seconds: float) -> None:
    """Wait ``seconds``; raise ``RuntimeError`` with its log's tail if the sidecar exits."""
    deadline = time.monotonic() + seconds
    while True:
        _check_alive(running, sidecar)
        if time.monotonic() >= deadline:
            return
        time.sleep(_POLL_INTERVAL_S)


def _check_alive(running: RunningPod, sidecar: _Container) -> None:
    """Raise ``RuntimeError`` with the tail of its log if the sidecar has exited."""
    process = running.processes[sidecar.name]
    if process.poll() is None:
        return
    lines = running.logs[sidecar.name].read_text(errors="replace").splitlines()
    tail = "\n".join(lines[-_LOG_TAIL_LINES:])
    raise RuntimeError(
        f"sidecar {sidecar.name} of pod {running.pod.name} exited (rc {process.returncode}) "
        f"before its startup probe passed; its log ends:\n{tail}"
    )


def _run_init(pod: Pod, init: _Container, timeout: float) -> str:
    """Run an init container to completion; its output, or a RuntimeError naming it."""
    try:
        result = pod.run(
            init.argv,
            env=init.env,
            uid=init.uid,
            gid=init.gid,
            mounts=init.mounts,
            cwd=init.cwd,
            timeout=timeout,
        )
    except RuntimeError as error:
        raise RuntimeError(f"init container {init.name} of pod {pod.name}: {error}") from error
    return result.stdout + result.stderr

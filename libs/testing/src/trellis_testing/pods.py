"""A tiny Kubernetes node made of network namespaces, for tests that run pods as root.

Tests of traffic capture (iptables in the pod, a sidecar reading ``SO_ORIGINAL_DST``) and of
what an injecting webhook writes into a pod spec need pods, but CI has no container runtime.
A pod's network is all those tests need, and a network namespace (:mod:`.netns`) is exactly
that, so:

- a :class:`Node` is a network namespace holding a bridge ``br0`` with :data:`NODE_IP`. The
  bridge lives in its own namespace and not in the root one because on our machines a bridge
  (or routed veths) in the root namespace resolves ARP but passes no TCP;
- a :class:`Pod` is a network namespace joined to the bridge by a veth pair, its end named
  ``eth0`` as in a real pod, with ``/etc/netns/<pod>/hosts`` standing in for cluster DNS;
- :meth:`Pod.spawn` runs a process the way a container runtime would: in the pod's network
  namespace (``ip netns exec``, which also puts the pod's hosts file over ``/etc/hosts``),
  in a private mount namespace holding the container's volume mounts, as its user;
- :func:`.kubelet.run_pod_spec` plays the kubelet: it runs a (webhook-patched) Pod object's
  init containers in order (to completion, or left running if they are native sidecars),
  then its containers.

Processes see the host's file system (there are no images), so a container's command must
exist on this machine. Everything here needs root; :func:`.netns.sweep` cleans up after a
run that crashed before its :meth:`Node.close`.
"""

from __future__ import annotations

import ipaddress
import shlex
import signal
import subprocess
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path

from trellis_testing.netns import (
    _NETWORK,
    _NO_MOUNTS,
    _NO_STRINGS,
    BRIDGE,
    CLUSTER_POD_CIDR,
    NETNS_ETC_DIR,
    NODE_IP,
    NetnsCleanupError,
    _attempt,
    _delete_netns,
    _environment,
    _ip,
    _ip_batch,
    _make_mount_point,
    _output_sink,
    _privileges,
    _remove_created,
    _remove_etc,
    _signal_group,
    _stop_processes,
    _tool,
    _veth_numbers,
)

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

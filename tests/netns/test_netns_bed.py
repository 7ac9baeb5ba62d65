"""The network-namespace test bed: pods that are network namespaces on a node namespace.

These run as root, for real: they make namespaces, veths, binds and iptables rules, and each
test's node is closed (everything removed) even when the test fails. Names carry this
worker's pid, so parallel workers never meet.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trellis_testing.kubelet import expand_references, run_pod_spec
from trellis_testing.netns import (
    NODE_IP,
    call_in_netns,
    in_netns,
    sweep,
    wait_for_tcp,
)
from trellis_testing.pods import Node, Pod
from trellis_testing.waiting import wait_until

pytestmark = [
    pytest.mark.xdist_group("netns"),
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
]

PREFIX = f"tnb-{os.getpid()}-"
POD_A_IP = "10.244.1.2"
POD_B_IP = "10.244.1.3"


def named(tag: str) -> str:
    return PREFIX + tag


@pytest.fixture(scope="module", autouse=True)
def _nothing_left_behind() -> Iterator[None]:
    """A safety net: whatever a broken test left with this worker's prefix goes."""
    sweep(PREFIX)
    yield
    sweep(PREFIX)


@pytest.fixture
def node() -> Iterator[Node]:
    with Node(named("node")) as node:
        yield node


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    return {line.split(":")[1].strip().split("@")[0] for line in out.stdout.splitlines()}


def in_mount_table(path: str) -> bool:
    mount_points = {
        line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
    }
    return path in mount_points


def log_contains(log: Path, text: str) -> bool:
    return log.exists() and text in log.read_text()


def http_get(host: str, port: int, path: str) -> str:
    """A plain-socket HTTP/1.0 GET: the body."""
    with socket.create_connection((host, port), timeout=5) as connection:
        connection.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        response = b"".join(iter(lambda: connection.recv(65536), b""))
    return response.split(b"\r\n\r\n", 1)[1].decode()


def serve_directory(pod: Pod, directory: Path, port: int, log: Path) -> None:
    pod.spawn(
        [
            sys.executable,
            "-m",
            "http.server",
            str(port),
            "--bind",
            "0.0.0.0",
            "--directory",
            str(directory),
        ],
        log=log,
    )


# --- networking --------------------------------------------------------------------------


def test_pods_reach_each_other_and_the_node_reaches_them(node: Node, tmp_path: Path) -> None:
    a = node.pod(named("a"), POD_A_IP)
    b = node.pod(named("b"), POD_B_IP)
    site = tmp_path / "site"
    site.mkdir()
    (site / "hello.txt").write_text("hello from a\n")
    serve_directory(a, site, 8080, tmp_path / "a.log")
    wait_for_tcp(node.name, a.ip, 8080)

    fetched = b.run(["curl", "-sSf", "--max-time", "5", f"http://{a.ip}:8080/hello.txt"], env={})
    assert fetched.stdout == "hello from a\n"

    assert call_in_netns(node.name, lambda: http_get(a.ip, 8080, "/hello.txt")) == "hello from a\n"
    with in_netns(node.name):
        connection = socket.create_connection((a.ip, 8080), timeout=5)
    with connection:  # the socket stays in the node's namespace after the switch back
        connection.sendall(b"GET /hello.txt HTTP/1.0\r\n\r\n")
        assert b"hello from a" in b"".join(iter(lambda: connection.recv(65536), b""))


def test_pod_default_route_is_the_node(node: Node) -> None:
    pod = node.pod(named("a"), POD_A_IP)
    routes = pod.run(["ip", "route"]).stdout
    assert f"default via {NODE_IP} dev eth0" in routes
    assert f"inet {POD_A_IP}/16" in pod.run(["ip", "-o", "addr", "show", "eth0"]).stdout


def test_hosts_resolve_names_inside_the_pod(node: Node) -> None:
    pod = node.pod(named("a"), POD_A_IP, hosts={"web.shop.svc.cluster.local": "10.96.0.10"})

    assert pod.run(["getent", "hosts", "web.shop.svc.cluster.local"]).stdout.split() == [
        "10.96.0.10",
        "web.shop.svc.cluster.local",
    ]
    assert pod.run(["getent", "hosts", pod.name]).stdout.split() == [POD_A_IP, pod.name]
    assert "web.shop.svc.cluster.local" not in Path("/etc/hosts").read_text()


def test_hosts_must_map_names_to_addresses(node: Node) -> None:
    with pytest.raises(ValueError, match="maps a name to an IP"):
        node.pod(named("a"), POD_A_IP, hosts={"10.96.0.10": "web.shop.svc.cluster.local"})


def test_iptables_redirect_in_a_pod_keeps_the_original_destination(
    node: Node, tmp_path: Path
) -> None:
    pod = node.pod(named("a"), POD_A_IP)
    rules = tmp_path / "rules"
    rules.write_text(
        "*nat\n-A OUTPUT -p tcp -d 10.96.0.77 --dport 80 -j REDIRECT --to-ports 15001\nCOMMIT\n"
    )
    pod.run(["sh", "-c", f"iptables-restore < {rules}"])
    assert "--to-ports 15001" in pod.run(["iptables", "-t", "nat", "-S", "OUTPUT"]).stdout

    log = tmp_path / "capture.log"
    capture = pod.spawn([sys.executable, "-c", ORIGINAL_DST_SERVER], log=log)
    wait_until(lambda: log_contains(log, "ready"), message="the capture listener")
    reply = pod.run([sys.executable, "-c", CLIENT, "10.96.0.77", "80"])

    assert reply.stdout == "captured\n"
    assert capture.wait(timeout=5) == 0
    assert "original 10.96.0.77:80" in log.read_text()


ORIGINAL_DST_SERVER = """
import socket, struct
server = socket.create_server(("0.0.0.0", 15001))
print("ready", flush=True)
connection, _ = server.accept()
raw = connection.getsockopt(socket.SOL_IP, 80, 16)  # SO_ORIGINAL_DST: a struct sockaddr_in
port, address = struct.unpack("!2xH4s8x", raw)
print(f"original {socket.inet_ntoa(address)}:{port}", flush=True)
connection.sendall(b"captured\\n")
connection.close()
"""

CLIENT = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as connection:
    print(connection.recv(100).decode(), end="")
"""


# --- processes ---------------------------------------------------------------------------


def test_mounts_are_private_to_the_process_and_uid_is_dropped(node: Node, tmp_path: Path) -> None:
    pod = node.pod(named("a"), POD_A_IP)
    config = tmp_path / "config"
    config.mkdir()
    (config / "greeting").write_text("hello mounted\n")
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    base = f"/run/{PREFIX}mnt"
    mounts = {f"{base}/config": config, f"{base}/token": token}

    result = pod.run(
        ["sh", "-c", f"cat {base}/config/greeting {base}/token; id -u; id -g; id -G"],
        uid=1337,
        gid=1337,
        mounts=mounts,
    )

    assert result.stdout.splitlines() == ["hello mounted", "secret-token", "1337", "1337", "1337"]
    assert Path(base, "config").is_dir()  # the point exists on the host...
    assert list(Path(base, "config").iterdir()) == []  # ...but nothing is bound there
    assert Path(base, "token").read_text() == ""
    assert not in_mount_table(f"{base}/config")
    node.close()
    assert not Path(base).exists()  # the points this pod created went with the node


def test_two_pods_bind_different_sources_at_one_path(node: Node, tmp_path: Path) -> None:
    a = node.pod(named("a"), POD_A_IP)
    b = node.pod(named("b"), POD_B_IP)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "who").write_text(f"pod {name}\n")
    path = f"/run/{PREFIX}shared"
    log = tmp_path / "a.log"
    a.spawn(["sh", "-c", f"cat {path}/who; exec sleep 30"], mounts={path: tmp_path / "a"}, log=log)
    wait_until(lambda: log_contains(log, "pod a"), message="pod a reading its mount")

    assert b.run(["cat", f"{path}/who"], mounts={path: tmp_path / "b"}).stdout == "pod b\n"


def test_spawn_gives_exactly_the_environment_asked_for(node: Node) -> None:
    pod = node.pod(named("a"), POD_A_IP)
    result = pod.run(["env"], env={"ONLY": "this", "PATH": "/usr/bin:/bin"})
    assert sorted(result.stdout.splitlines()) == ["ONLY=this", "PATH=/usr/bin:/bin"]
    with_path = pod.run(["env"], env={"ONLY": "this"}).stdout.splitlines()
    assert sorted(with_path) == ["ONLY=this", f"PATH={os.environ['PATH']}"]


def test_run_names_the_failing_command_and_its_output(node: Node) -> None:
    pod = node.pod(named("a"), POD_A_IP)
    with pytest.raises(RuntimeError, match=r"(?s)sh -c 'echo oops >&2; exit 3'.*rc 3.*oops"):
        pod.run(["sh", "-c", "echo oops >&2; exit 3"])
    with pytest.raises(RuntimeError, match="timed out"):
        pod.run(["sleep", "30"], timeout=0.2)


def test_stop_ends_the_process_group(node: Node, tmp_path: Path) -> None:
    pod = node.pod(named("a"), POD_A_IP)
    log = tmp_path / "group.log"
    # The child ignores SIGTERM: only the SIGKILL after the grace period takes it.
    leader = pod.spawn(
        ["sh", "-c", "sh -c 'trap \"\" TERM; echo $$; exec sleep 30' & wait"], log=log
    )
    child = int(wait_until(lambda: log.read_text().strip() if log.exists() else None))
    assert not _zombie(child)
    pod.stop()
    assert leader.returncode is not None
    assert wait_until(lambda: not Path(f"/proc/{child}").exists() or _zombie(child))


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except FileNotFoundError:
        return True


# --- namespaces --------------------------------------------------------------------------


def test_in_netns_restores_the_thread_namespace(node: Node) -> None:
    before = os.readlink("/proc/thread-self/ns/net")
    seen: list[str] = []
    with in_netns(node.name):
        inside = os.readlink("/proc/thread-self/ns/net")
        thread = threading.Thread(
            target=lambda: seen.append(os.readlink("/proc/thread-self/ns/net"))
        )
        thread.start()
        thread.join()
        child = subprocess.run(["readlink", "/proc/self/ns/net"], capture_output=True, text=True)
    assert inside != before
    assert seen == [inside]
    assert child.stdout.strip() == inside
    assert os.readlink("/proc/thread-self/ns/net") == before

    with pytest.raises(KeyError), in_netns(node.name):
        raise KeyError("boom")
    assert os.readlink("/proc/thread-self/ns/net") == before


def test_call_in_netns_returns_and_raises(node: Node) -> None:
    caller = os.readlink("/proc/thread-self/ns/net")
    assert call_in_netns(node.name, lambda: os.readlink("/proc/thread-self/ns/net")) != caller

    def fail() -> None:
        raise LookupError("from inside")

    with pytest.raises(LookupError, match="from inside"):
        call_in_netns(node.name, fail)
    assert os.readlink("/proc/thread-self/ns/net") == caller


def test_close_leaves_nothing(tmp_path: Path) -> None:
    node = Node(named("gone"))
    mount_base = f"/run/{PREFIX}gone"
    (tmp_path / "data").mkdir()
    with node:
        pods = [node.pod(named("ga"), POD_A_IP), node.pod(named("gb"), POD_B_IP)]
        sleeper = pods[0].spawn(["sleep", "30"], mounts={f"{mount_base}/data": tmp_path / "data"})
        assert Path(mount_base, "data").is_dir()

    assert_cleaned(node, pods, mount_base)
    assert sleeper.returncode is not None
    node.close()  # again: nothing to do


def test_close_cleans_up_when_the_body_raises(tmp_path: Path) -> None:
    node = Node(named("boom"))
    mount_base = f"/run/{PREFIX}boom"
    (tmp_path / "data").mkdir()
    pods: list[Pod] = []
    sleepers: list[subprocess.Popen[bytes]] = []

    def body() -> None:
        with node:
            pods.extend([node.pod(named("xa"), POD_A_IP), node.pod(named("xb"), POD_B_IP)])
            mounts = {f"{mount_base}/data": tmp_path / "data"}
            sleepers.append(pods[1].spawn(["sleep", "30"], mounts=mounts))
            raise RuntimeError("mid-way")

    with pytest.raises(RuntimeError, match="mid-way"):
        body()

    assert len(pods) == 2
    assert_cleaned(node, pods, mount_base)
    assert sleepers[0].returncode is not None


def assert_cleaned(node: Node, pods: list[Pod], mount_base: str) -> None:
    names = netns_names()
    assert node.name not in names
    assert not {pod.name for pod in pods} & names
    assert not {link for link in root_links() if re.fullmatch(r"tv\d+", link)}
    assert not {pod.veth for pod in pods} & root_links()
    assert not any(Path("/etc/netns", pod.name).exists() for pod in pods)
    assert not Path(mount_base).exists()
    assert node.pods == []


def test_sweep_removes_stale_namespaces_and_start_replaces_a_stale_node() -> None:
    stale = named("stale-1")
    subprocess.run(["ip", "netns", "add", stale], check=True)
    Path("/etc/netns", stale).mkdir(parents=True, exist_ok=True)
    assert sweep(named("stale-")) == [stale]
    assert stale not in netns_names()
    assert not Path("/etc/netns", stale).exists()

    subprocess.run(["ip", "netns", "add", named("node")], check=True)
    with Node(named("node")) as node:
        node.pod(named("a"), POD_A_IP)  # works: the stale one was replaced


# --- the kubelet's part ------------------------------------------------------------------


SPEC_SERVER = """
import os, socket, sys
greeting = open(os.environ["DATA"] + "/greeting").read().strip()
server = socket.create_server((os.environ["POD_IP"], int(sys.argv[1])))
print("serving", flush=True)
while True:
    connection, _ = server.accept()
    reply = "|".join([greeting, os.environ["ADDR"], os.environ["WHO"], os.environ["LITERAL"]])
    connection.sendall(reply.encode())
    connection.close()
"""


def pod_spec(data_path: str) -> dict[str, Any]:
    """A Pod object as an injecting webhook might hand it back."""
    return {
        "metadata": {"namespace": "shop", "labels": {"app": "web"}},
        "spec": {
            "serviceAccountName": "web-sa",
            "securityContext": {"runAsUser": 1337, "runAsGroup": 1337},
            "volumes": [{"name": "data", "emptyDir": {}}],
            "initContainers": [
                {
                    "name": "prepare",
                    "image": "busybox",
                    "command": ["sh", "-c"],
                    "args": ['echo "$(POD_IP) $GREETING" > $(DATA)/greeting && echo prepared'],
                    "env": [
                        {
                            "name": "POD_IP",
                            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                        },
                        {"name": "DATA", "value": data_path},
                        {"name": "GREETING", "value": "hi from $(DATA)"},
                    ],
                    "securityContext": {"runAsUser": 0, "runAsGroup": 0},
                    "volumeMounts": [{"name": "data", "mountPath": data_path}],
                },
                {
                    "name": "whoami",
                    "image": "busybox",
                    "command": ["sh", "-c", "echo $(id -u) $(id -g)"],
                },
            ],
            "containers": [
                {
                    "name": "server",
                    "image": "python",
                    "command": [sys.executable, "-c", SPEC_SERVER],
                    "args": ["$(PORT)"],
                    "env": [
                        {"name": "PORT", "value": "8081"},
                        {
                            "name": "POD_IP",
                            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                        },
                        {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {
                            "name": "NS",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                        },
                        {
                            "name": "SA",
                            "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}},
                        },
                        {"name": "ADDR", "value": "$(POD_IP):$(PORT)"},
                        {"name": "WHO", "value": "$(NS)/$(NAME)/$(SA)"},
                        {"name": "LITERAL", "value": "$$(PORT) $(UNDEFINED)"},
                        {"name": "DATA", "value": data_path},
                    ],
                    "securityContext": {"runAsUser": 0},  # the venv's python is under /root
                    "volumeMounts": [{"name": "data", "mountPath": data_path, "readOnly": True}],
                }
            ],
        },
    }


def test_run_pod_spec_runs_init_containers_then_containers(node: Node, tmp_path: Path) -> None:
    pod = node.pod(named("web"), POD_A_IP)
    data = tmp_path / "data"
    data.mkdir()
    data_path = f"/run/{PREFIX}data"

    running = run_pod_spec(pod, pod_spec(data_path), {"data": data}, workdir=tmp_path / "work")

    assert list(running.init_output) == ["prepare", "whoami"]
    assert running.init_output == {"prepare": "prepared\n", "whoami": "1337 1337\n"}
    assert (data / "greeting").read_text() == f"{POD_A_IP} hi from {data_path}\n"
    log = running.logs["server"]
    assert log == tmp_path / "work" / "server.log"
    wait_until(lambda: log_contains(log, "serving"), message="the server container")
    reply = call_in_netns(node.name, lambda: _read_all(POD_A_IP, 8081))
    greeting = f"{POD_A_IP} hi from {data_path}"
    assert reply == f"{greeting}|{POD_A_IP}:8081|shop/{pod.name}/web-sa|$(PORT) $(UNDEFINED)"
    assert running.processes["server"].poll() is None


def _read_all(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=5) as connection:
        return b"".join(iter(lambda: connection.recv(65536), b"")).decode()


def test_run_pod_spec_init_failure_raises_with_output(node: Node, tmp_path: Path) -> None:
    pod = node.pod(named("a"), POD_A_IP)
    spec = {
        "spec": {
            "initContainers": [{"name": "broken", "command": ["sh", "-c", "echo nope; exit 2"]}],
            "containers": [{"name": "never", "command": ["sleep", "30"]}],
        }
    }
    with pytest.raises(RuntimeError, match=r"(?s)init container broken.*rc 2.*nope"):
        run_pod_spec(pod, spec, {}, workdir=tmp_path)
    assert not (tmp_path / "never.log").exists()


@pytest.mark.parametrize(
    ("container", "error", "match"),
    [
        ({"name": "noentry", "image": "x"}, ValueError, "noentry has no command"),
        (
            {
                "name": "c",
                "command": ["true"],
                "volumeMounts": [{"name": "missing", "mountPath": "/x"}],
            },
            KeyError,
            "missing",
        ),
        (
            {
                "name": "c",
                "command": ["true"],
                "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
            },
            NotImplementedError,
            "secretKeyRef",
        ),
        (
            {
                "name": "c",
                "command": ["true"],
                "env": [{"name": "H", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}],
            },
            NotImplementedError,
            "status.hostIP",
        ),
    ],
)
def test_run_pod_spec_refuses_what_it_cannot_run_before_running_anything(
    node: Node, tmp_path: Path, container: dict[str, Any], error: type[Exception], match: str
) -> None:
    pod = node.pod(named("a"), POD_A_IP)
    marker = tmp_path / "ran"
    spec = {
        "spec": {
            "initContainers": [{"name": "first", "command": ["touch", str(marker)]}],
            "containers": [container],
        }
    }
    with pytest.raises(error, match=match):
        run_pod_spec(pod, spec, {}, workdir=tmp_path)
    assert not marker.exists()


def test_expand_references_follows_the_kubelet() -> None:
    env = {"A": "1", "B": "two"}
    assert expand_references("$(A)-$(B)", env) == "1-two"
    assert expand_references("$$(A)", env) == "$(A)"
    assert expand_references("$(C) stays", env) == "$(C) stays"
    assert expand_references("$A $ $$ $(A", env) == "$A $ $ $(A"
    assert expand_references("ends with $", env) == "ends with $"


# --- native sidecars -----------------------------------------------------------------------


def sidecar(command: str, probe: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    """An init container with ``restartPolicy: Always``: a native sidecar."""
    return {
        "name": "proxy",
        "command": ["sh", "-c", command],
        "restartPolicy": "Always",
        **({"startupProbe": probe} if probe else {}),
        **more,
    }


def test_a_native_sidecar_keeps_running_and_holds_back_the_next_init_until_its_probe_passes(
    node: Node, tmp_path: Path
) -> None:
    pod = node.pod(named("web"), POD_A_IP)
    data = tmp_path / "data"
    data.mkdir(mode=0o777)
    data.chmod(0o777)  # the sidecar's uid writes there
    shared = f"/run/{PREFIX}shared"
    # only the sidecar's uid, env and mounts pass the probe: it must run as the container
    probe_script = (
        f'echo probed >> {shared}/probes; [ "$(id -u)" = 1337 ] && [ "$ROLE" = proxy ] '
        f"&& test -f {shared}/ready"
    )
    proxy = sidecar(
        f"echo starting; sleep 1; touch {shared}/ready; echo ready; exec sleep 30",
        {"exec": {"command": ["sh", "-c", probe_script]}, "periodSeconds": 1},
        env=[{"name": "ROLE", "value": "proxy"}],
        securityContext={"runAsUser": 1337, "runAsGroup": 1337},
        volumeMounts=[{"name": "data", "mountPath": shared}],
    )
    check = {
        "name": "check",
        "command": ["sh", "-c", f"test -f {data}/ready && echo saw ready"],
    }
    spec = {
        "spec": {
            "initContainers": [proxy, check],
            "containers": [{"name": "app", "command": ["sleep", "30"]}],
        }
    }

    running = run_pod_spec(pod, spec, {"data": data}, workdir=tmp_path / "work")

    assert running.init_output == {"check": "saw ready\n"}
    assert list(running.processes) == ["proxy", "app"]
    assert running.processes["proxy"].poll() is None
    assert running.logs["proxy"] == tmp_path / "work" / "proxy.log"
    assert running.logs["proxy"].read_text() == "starting\nready\n"
    attempts = (data / "probes").read_text().count("probed")
    assert 2 <= attempts <= 4  # one a second: the first fails, a later one passes
    pod.stop()
    assert running.processes["proxy"].returncode is not None


def test_a_native_sidecar_without_a_probe_lets_the_next_start_at_once(
    node: Node, tmp_path: Path
) -> None:
    pod = node.pod(named("web"), POD_A_IP)
    spec = {
        "spec": {
            "initContainers": [
                sidecar("echo up; exec sleep 30"),
                {"name": "next", "command": ["true"]},
            ],
            "containers": [{"name": "app", "command": ["sleep", "30"]}],
        }
    }
    running = run_pod_spec(pod, spec, {}, workdir=tmp_path)
    assert running.init_output == {"next": ""}
    assert running.processes["proxy"].poll() is None
    wait_until(lambda: log_contains(running.logs["proxy"], "up"), message="the sidecar's log")


def test_a_sidecar_whose_probe_never_passes_stops_the_pod_naming_it(
    node: Node, tmp_path: Path
) -> None:
    pod = node.pod(named("web"), POD_A_IP)
    probe = {
        "exec": {"command": ["sh", "-c", "echo not listening yet >&2; exit 1"]},
        "periodSeconds": 1,
        "failureThreshold": 2,
    }
    marker = tmp_path / "ran"
    spec = {
        "spec": {
            "initContainers": [sidecar("exec sleep 30", probe)],
            "containers": [{"name": "app", "command": ["touch", str(marker)]}],
        }
    }
    with pytest.raises(
        RuntimeError, match=r"(?s)sidecar proxy .* startup probe failed 2 times.*not listening yet"
    ):
        run_pod_spec(pod, spec, {}, workdir=tmp_path)
    assert not marker.exists()


def test_a_sidecar_that_exits_while_starting_stops_the_pod_with_its_log(
    node: Node, tmp_path: Path
) -> None:
    pod = node.pod(named("web"), POD_A_IP)
    probe = {"exec": {"command": ["false"]}, "periodSeconds": 1, "failureThreshold": 3}
    spec = {
        "spec": {
            "initContainers": [sidecar("echo no certificate; exit 3", probe)],
            "containers": [{"name": "app", "command": ["sleep", "30"]}],
        }
    }
    with pytest.raises(RuntimeError, match=r"(?s)sidecar proxy .* exited \(rc 3\).*no certificate"):
        run_pod_spec(pod, spec, {}, workdir=tmp_path)
    assert not (tmp_path / "app.log").exists()


@pytest.mark.parametrize(
    ("probe", "error", "match"),
    [
        ({"httpGet": {"port": 15021}}, NotImplementedError, "only exec"),
        ({"exec": {"command": ["true"]}, "periodSeconds": 0.5}, ValueError, "whole seconds"),
    ],
)
def test_a_sidecar_probe_that_cannot_be_run_is_refused_before_anything_runs(
    node: Node, tmp_path: Path, probe: dict[str, Any], error: type[Exception], match: str
) -> None:
    pod = node.pod(named("a"), POD_A_IP)
    marker = tmp_path / "ran"
    spec = {
        "spec": {
            "initContainers": [
                {"name": "first", "command": ["touch", str(marker)]},
                sidecar("exec sleep 30", probe),
            ],
            "containers": [{"name": "app", "command": ["sleep", "30"]}],
        }
    }
    with pytest.raises(error, match=match):
        run_pod_spec(pod, spec, {}, workdir=tmp_path)
    assert not marker.exists()

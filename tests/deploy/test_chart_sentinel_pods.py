"""The chart's Redis under Sentinel, its pods run for real: each one a network namespace.

``helm template`` renders a StatefulSet whose pods are a Redis and a Sentinel, each started
by a script of ``files/redis-sentinel/``. Nothing but running them shows that the scripts,
the configurations they write, the ACLs and the pods' names fit together, so each rendered
pod is run here as the kubelet would run it (``trellis_testing.pods``): a network
namespace on a node's bridge, its hosts file standing in for the headless Service's DNS,
every volume a folder bound at its mount path (the ConfigMap's and Secrets' items written
as files, the emptyDirs empty), each container's command with its rendered environment
(the pod's name from the downward API). Only the user is not the chart's (999): the
processes run as root, which owns the files written here.

Then: pod 0 starts as the master and the others replicate it; the Sentinels find each
other; a component's user may ask a Sentinel where the master is and nothing more; a write
acknowledged by a replica (``WAIT``) survives the master being killed; a replica is
promoted; the old master, started again, asks the Sentinels and rejoins as a replica; and
the preStop hook of a master hands over to a replica before it returns.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.helmchart import Rendered, render
from trellis_testing.netns import sweep
from trellis_testing.pods import Node
from trellis_testing.waiting import wait_until

pytestmark = [
    pytest.mark.timeout(300),  # the waits below add up to more than the default 120 s
    pytest.mark.netns,
    pytest.mark.xdist_group("netns"),
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
]

PREFIX = f"tcs-{os.getpid()}-"
HEADLESS = "trellis-redis-headless.trellis-system.svc"
PODS = 3


def host(n: int) -> str:
    return f"trellis-redis-{n}.{HEADLESS}"


@pytest.fixture(scope="module", autouse=True)
def _nothing_left_behind() -> Iterator[None]:
    sweep(PREFIX)
    yield
    sweep(PREFIX)


class RedisPods:
    """The rendered StatefulSet's pods on ``node``: their volumes, and their containers."""

    def __init__(self, rendered: Rendered, node: Node, root: Path) -> None:
        self.rendered = rendered
        self.spec: dict[str, Any] = rendered.get("StatefulSet", "trellis-redis")["spec"]
        self.root = root
        hosts = {host(n): self.ip(n) for n in range(PODS)}
        self.pods = [node.pod(f"{PREFIX}redis-{n}", self.ip(n), hosts) for n in range(PODS)]
        self.containers: dict[tuple[int, str], subprocess.Popen[bytes]] = {}
        users = rendered.secret("trellis-redis-users")
        self.passwords = {name: value.decode() for name, value in users.items()}

    @staticmethod
    def ip(n: int) -> str:
        return f"10.244.9.{10 + n}"

    def volumes(self, n: int) -> dict[str, Path]:
        """Each volume of pod ``n`` as a folder, made once, as the kubelet would fill it."""
        found = {}
        for volume in self.spec["template"]["spec"]["volumes"]:
            where = self.root / f"pod-{n}" / volume["name"]
            found[volume["name"]] = where
            if where.exists():
                continue
            where.mkdir(parents=True)
            if "configMap" in volume:
                data = self.rendered.get("ConfigMap", volume["configMap"]["name"])["data"]
                items = {key: text.encode() for key, text in data.items()}
            elif "secret" in volume:
                secret = self.rendered.secret(volume["secret"]["secretName"])
                wanted = volume["secret"].get("items") or [{"key": k, "path": k} for k in secret]
                items = {item["path"]: secret[item["key"]] for item in wanted}
            else:  # an emptyDir (the data too, with persistence off)
                items = {}
            for name, content in items.items():
                (where / name).write_bytes(content)
        return found

    def start(self, n: int, container: str) -> None:
        [spec] = [c for c in self.spec["template"]["spec"]["containers"] if c["name"] == container]
        env, mounts = self.container(n, container)
        log = self.root / f"pod-{n}" / f"{container}.log"
        pod = self.pods[n]
        self.containers[n, container] = pod.spawn(spec["command"], env=env, mounts=mounts, log=log)

    def container(self, n: int, name: str) -> tuple[dict[str, str], dict[str, Path]]:
        """The environment and mounts of container ``name`` of pod ``n``."""
        [spec] = [c for c in self.spec["template"]["spec"]["containers"] if c["name"] == name]
        env = {}
        for item in spec["env"]:
            field = item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            env[item["name"]] = f"trellis-redis-{n}" if field == "metadata.name" else item["value"]
        env["PATH"] = os.environ["PATH"]
        volumes = self.volumes(n)
        return env, {m["mountPath"]: volumes[m["name"]] for m in spec["volumeMounts"]}

    def pre_stop(self, n: int) -> str:
        """Run the Redis container's preStop hook in pod ``n``, as the kubelet would."""
        [spec] = [c for c in self.spec["template"]["spec"]["containers"] if c["name"] == "redis"]
        env, mounts = self.container(n, "redis")
        command = spec["lifecycle"]["preStop"]["exec"]["command"]
        return self.pods[n].run(command, env=env, mounts=mounts, timeout=40).stdout

    def kill(self, n: int, container: str) -> None:
        """SIGKILL the container's processes (it leads its own process group)."""
        process = self.containers.pop((n, container))
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def cli(self, n: int, user: str, port: int, *command: str) -> str:
        """``redis-cli`` in pod ``n`` (its hosts file resolves the pods' names) as ``user``."""
        env = {"REDISCLI_AUTH": self.passwords[user], "PATH": os.environ["PATH"]}
        argv = ["redis-cli", "-h", host(n), "-p", str(port), "--user", user, "--raw", *command]
        done = self.pods[n].run(argv, env=env, timeout=10)
        return done.stdout.strip()

    def sentinel(self, n: int, *command: str, user: str = "sentinel") -> str:
        return self.cli(n, user, 26379, "sentinel", *command)

    def master(self, n: int) -> str:
        """The master's host, as pod ``n``'s Sentinel names it ("" before it knows one)."""
        try:
            return self.sentinel(n, "get-master-addr-by-name", "trellis").split("\n")[0]
        except RuntimeError:  # not up yet
            return ""

    def log(self, n: int, container: str) -> str:
        """What container ``container`` of pod ``n`` wrote, every start of it."""
        path = self.root / f"pod-{n}" / f"{container}.log"
        return path.read_text() if path.exists() else ""

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.parent.name}/{path.name}\n{path.read_text()[-1500:]}"
            for path in sorted(self.root.glob("pod-*/*.log"))
        )

    def stop(self) -> None:
        for pod in self.pods:
            pod.stop()


@pytest.fixture
def redis_pods(tmp_path: Path) -> Iterator[RedisPods]:
    rendered = render(
        tmp_path / "helm", "redis.mode=sentinel", "redis.persistence.enabled=false",
        "redis.sentinel.downAfterMilliseconds=1000", "redis.sentinel.failoverTimeout=3000",
    )  # fmt: skip
    with Node(f"{PREFIX}node") as node:
        pods = RedisPods(rendered, node, tmp_path)
        try:
            for n in range(PODS):
                for container in ("redis", "sentinel"):
                    pods.start(n, container)
            yield pods
        finally:
            pods.stop()


def settled(pods: RedisPods, master: int) -> bool:
    """Every Sentinel names ``master``, and knows the two replicas and the other two."""
    for n in range(PODS):
        if n in {m for m, c in pods.containers if c == "sentinel"}:
            try:
                state = pods.sentinel(n, "master", "trellis").split("\n")
            except RuntimeError:
                return False
            fields = dict(zip(state[::2], state[1::2], strict=False))
            if (fields.get("ip"), fields.get("num-slaves"), fields.get("num-other-sentinels")) != (
                host(master), "2", "2",
            ):  # fmt: skip
                return False
    return True


def test_the_sentinel_pods_replicate_fail_over_and_rejoin(redis_pods: RedisPods) -> None:
    pods = redis_pods
    try:
        wait_until(lambda: settled(pods, 0), 60, "pod 0 the master, known to every Sentinel")
    except AssertionError:
        raise AssertionError(pods.logs()) from None
    # a component asks where the master is, logging in as on Redis, and may do nothing more
    catalog = pods.sentinel(1, "get-master-addr-by-name", "trellis", user="catalog")
    assert catalog.split("\n") == [host(0), "6379"]
    assert "NOPERM" in pods.sentinel(1, "failover", "trellis", user="catalog")
    assert "NOPERM" in pods.sentinel(1, "set", "trellis", "quorum", "1", user="catalog")
    # an acknowledged write: on a replica before the answer
    assert pods.cli(0, "admin", 6379, "set", "trellis:test:record", "kept") == "OK"
    assert int(pods.cli(0, "admin", 6379, "wait", "1", "5000")) >= 1

    pods.kill(0, "redis")
    promoted = wait_until(
        lambda: next((m for m in (pods.master(1), pods.master(2)) if m not in ("", host(0))), None),
        30,
        "a replica promoted",
    )
    new = int(promoted.split(".")[0].rsplit("-", 1)[1])
    assert pods.cli(new, "admin", 6379, "get", "trellis:test:record") == "kept"

    # the old master asks the Sentinels: it comes back a replica of the master of the
    # newest configuration, though its own Sentinel, asked first, may not have heard of the
    # failover yet (it would name pod 0 itself, which would start as a second master)
    pods.start(0, "redis")

    def started() -> list[str]:
        log = pods.log(0, "redis").splitlines()
        return [line for line in log if line.startswith("redis.start")]

    wait_until(lambda: len(started()) == 2, 30, "the old master started again")
    assert started()[-1] == f"redis.start self={host(0)} master={promoted}", pods.logs()

    def rejoined() -> str | None:
        """The master the Sentinels name now, once pod 0 is its connected replica. On a
        loaded machine a second failover may follow the first (these Sentinels give a
        master up after 1 s): pod 0 follows whichever master is the newest."""
        try:
            role = pods.cli(0, "admin", 6379, "role").split("\n")
        except RuntimeError:
            return None
        current = pods.master(1)
        return current if role[:2] == ["slave", current] and "connected" in role else None

    try:
        master = wait_until(rejoined, 60, "the old master a replica of the new one")
    except AssertionError:
        raise AssertionError(pods.logs()) from None
    new = int(master.split(".")[0].rsplit("-", 1)[1])
    assert pods.cli(0, "admin", 6379, "get", "trellis:test:record") == "kept"
    wait_until(lambda: settled(pods, new), 60, "every Sentinel naming the new master")

    # a master about to be stopped (a rollout, a drain) hands over first; a replica does not
    assert pods.pre_stop(0) == ""
    assert f"redis.handover self={host(new)}" in pods.pre_stop(new)
    assert pods.master(0) not in ("", host(new))


def test_a_sentinel_that_missed_the_failover_makes_no_second_master(
    redis_pods: RedisPods,
) -> None:
    """The old master's own Sentinel, asked first, names the old master (it monitors it
    again, at epoch 0, as one that has not heard of the failover does): the restarted old
    master follows the newest configuration, the other two Sentinels', and starts as a
    replica, not as a second master."""
    pods = redis_pods
    wait_until(lambda: settled(pods, 0), 60, "pod 0 the master, known to every Sentinel")
    pods.kill(0, "redis")
    promoted = wait_until(
        lambda: next((m for m in (pods.master(1), pods.master(2)) if m not in ("", host(0))), None),
        30,
        "a replica promoted",
    )
    wait_until(lambda: pods.master(0) == promoted, 30, "pod 0's Sentinel knowing it")
    assert pods.sentinel(0, "remove", "trellis") == "OK"
    assert pods.sentinel(0, "monitor", "trellis", host(0), "6379", "2") == "OK"
    assert pods.master(0) == host(0)

    pods.start(0, "redis")

    wait_until(lambda: pods.log(0, "redis").count("redis.start") == 2, 30, "pod 0 started again")
    starts = [line for line in pods.log(0, "redis").splitlines() if line.startswith("redis.start")]
    assert starts[-1] == f"redis.start self={host(0)} master={promoted}", pods.logs()

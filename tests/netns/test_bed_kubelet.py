"""The bed's kubelet part without the control plane: a pod's volumes as the kubelet makes
them (a projected ServiceAccount token bound to the pod, emptyDirs any uid may write), and
the launcher through which a pod's uid runs the workspace's Python."""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cryptography
import grpc
import pytest
from kubernetes import client

import trellis_common
from tests.netns.bed import SYSTEM_PYTHON, install_launcher, launcher_script, pod_volumes
from trellis_testing.kubelet import run_pod_spec
from trellis_testing.netns import sweep
from trellis_testing.pods import Node

pytestmark = [
    pytest.mark.xdist_group("netns"),
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
]

PREFIX = f"tbk-{os.getpid()}-"
TOKEN_DIR = "/var/run/secrets/trellis"
EXTRA = "authentication.kubernetes.io/"

#: Run through the launcher as uid 1337: what it can import, and the token it was given.
CHECK_MODULE = """
import base64, json, os, sys
import cryptography, grpc, trellis_common
token = open(os.environ["TOKEN_DIR"] + "/token").read()
payload = token.split(".")[1]
claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
print(json.dumps({
    "uid": os.getuid(),
    "executable": sys.executable,
    "argv": sys.argv[1:],
    "grpc": grpc.__version__,
    "cryptography": cryptography.__version__,
    "trellis_common": trellis_common.__file__,
    "dist_packages": [p for p in sys.path if "dist-packages" in p],
    "pod": claims["kubernetes.io"]["pod"],
}))
"""


@pytest.fixture(scope="module", autouse=True)
def _nothing_left_behind() -> Iterator[None]:
    sweep(PREFIX)
    yield
    sweep(PREFIX)


def claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    decoded: dict[str, Any] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return decoded


def stored_pod(core: Any, volumes: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """A pod of ServiceAccount ``web`` created in the API; its ``metadata.uid`` the API's."""
    core.create_namespaced_service_account("shop", {"metadata": {"name": "web"}})
    obj: dict[str, Any] = {
        "metadata": {"name": "web-1", "namespace": "shop"},
        "spec": {
            "serviceAccountName": "web",
            "volumes": volumes,
            "containers": [{"name": "app", "command": ["true"]}],
            **spec,
        },
    }
    obj["metadata"]["uid"] = core.create_namespaced_pod("shop", obj).metadata.uid
    return obj


def token_volume(**projection: Any) -> dict[str, Any]:
    return {
        "name": "trellis-token",
        "projected": {"sources": [{"serviceAccountToken": projection}]},
    }


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_volumes_hold_a_bound_token_and_writable_empty_dirs(
    kube: tuple[Any, Any], tmp_path: Path
) -> None:
    _, api_client = kube
    core: Any = client.CoreV1Api(api_client)
    volumes = [
        token_volume(audience="trellis", expirationSeconds=7200, path="token"),
        {"name": "scratch", "emptyDir": {}},
        {"name": "memory", "emptyDir": {"medium": "Memory"}},
    ]
    obj = stored_pod(core, volumes)

    made = pod_volumes(core, obj, tmp_path)

    assert set(made) == {"trellis-token", "scratch", "memory"}
    assert mode(made["scratch"]) == mode(made["memory"]) == 0o777
    token_file = made["trellis-token"] / "token"
    assert mode(token_file) == 0o644
    said = claims(token_file.read_text())
    assert said["aud"] == ["trellis"]
    assert said["exp"] - said["iat"] == 7200
    assert said["kubernetes.io"]["pod"] == {"name": "web-1", "uid": obj["metadata"]["uid"]}
    authentication: Any = client.AuthenticationV1Api(api_client)
    review = {"spec": {"token": token_file.read_text(), "audiences": ["trellis"]}}
    extra = authentication.create_token_review(review).status.user.extra
    assert extra[f"{EXTRA}pod-name"] == ["web-1"]
    assert extra[f"{EXTRA}pod-uid"] == [obj["metadata"]["uid"]]


@pytest.mark.parametrize(
    ("volume", "match"),
    [
        (
            {"name": "mixed", "projected": {"sources": [{"configMap": {"name": "ca"}}]}},
            "projected source configMap",
        ),
        ({"name": "huge", "emptyDir": {"medium": "HugePages-2Mi"}}, "HugePages-2Mi"),
        ({"name": "host", "hostPath": {"path": "/"}}, "volume host"),
    ],
)
def test_volumes_the_bed_cannot_make_are_refused(
    kube: tuple[Any, Any], tmp_path: Path, volume: dict[str, Any], match: str
) -> None:
    core: Any = client.CoreV1Api(kube[1])
    obj = stored_pod(core, [volume])
    with pytest.raises(NotImplementedError, match=match):
        pod_volumes(core, obj, tmp_path)


def test_the_launcher_runs_a_module_with_the_workspace_packages() -> None:
    script = launcher_script("trellis_cli.agent")
    assert script.startswith(f"#!{SYSTEM_PYTHON} -S\n")
    site_packages = Path(sys.prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    assert f"site.addsitedir({str(site_packages / 'site-packages')!r})" in script
    assert "runpy.run_module('trellis_cli.agent', run_name='__main__', alter_sys=True)" in script


@pytest.mark.skipif(not SYSTEM_PYTHON.exists(), reason=f"{SYSTEM_PYTHON} is not installed")
def test_a_pods_uid_runs_the_launcher_with_its_bound_token(
    kube: tuple[Any, Any], tmp_path: Path
) -> None:
    core: Any = client.CoreV1Api(kube[1])
    shared = Path(f"/run/{PREFIX}shared")  # any uid may read it, unlike the test's tmp_path
    shared.mkdir(mode=0o755)
    try:
        (shared / "launchcheck.py").write_text(CHECK_MODULE)
        launcher = install_launcher(shared, "launch-check", "launchcheck")
        check = {
            "name": "check",
            "command": [str(launcher), "--flag", "value"],
            "env": [
                {"name": "PYTHONPATH", "value": str(shared)},
                {"name": "TOKEN_DIR", "value": TOKEN_DIR},
            ],
            "securityContext": {"runAsUser": 1337, "runAsGroup": 1337},
            "volumeMounts": [{"name": "trellis-token", "mountPath": TOKEN_DIR}],
        }
        volumes = [token_volume(audience="trellis", path="token")]
        obj = stored_pod(core, volumes, initContainers=[check])
        with Node(f"{PREFIX}node") as node:
            pod = node.pod(f"{PREFIX}web", "10.244.1.2")
            running = run_pod_spec(pod, obj, pod_volumes(core, obj, tmp_path), workdir=tmp_path)
    finally:
        for child in shared.iterdir():
            child.unlink()
        shared.rmdir()

    seen = json.loads(running.init_output["check"])
    assert seen["uid"] == 1337
    assert seen["executable"] == str(SYSTEM_PYTHON)
    assert seen["argv"] == ["--flag", "value"]
    # the venv's packages (the workspace's own, editable), and none of Debian's
    assert seen["trellis_common"] == trellis_common.__file__
    assert (seen["grpc"], seen["cryptography"]) == (grpc.__version__, cryptography.__version__)
    assert seen["dist_packages"] == []
    assert seen["pod"] == {"name": "web-1", "uid": obj["metadata"]["uid"]}

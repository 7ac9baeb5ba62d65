"""The image's build context, checked without a Docker engine (there is none here).

The Dockerfile's build stage is run for real: the build context (the repository less what
``.dockerignore`` leaves out) is copied to a temporary directory, and the stage's ``uv sync``
installs every member into a fresh environment there, from which each service's entry point
must start (``--help``). The rest is read from the Dockerfile: every COPY source is in the
context, and the image runs as a numeric non-root user.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "deploy" / "Dockerfile").read_text()
IGNORED = [
    line.strip()
    for line in (ROOT / ".dockerignore").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]


def ignored(relative: str) -> bool:
    parts = relative.split("/")
    for pattern in IGNORED:
        bare = pattern.removeprefix("**/")
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatch(part, bare) for part in parts):
                return True
        elif any(fnmatch.fnmatch("/".join(parts[: i + 1]), pattern) for i in range(len(parts))):
            return True
    return False


def context(into: Path) -> Path:
    """The build context as Docker sends it (``.dockerignore`` applied)."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for name in files:
        if ignored(name) or not (ROOT / name).is_file():
            continue
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    return into


def entry_points() -> dict[str, str]:
    found = {}
    for pyproject in [*ROOT.glob("libs/*/pyproject.toml"), *ROOT.glob("services/*/pyproject.toml")]:
        found.update(tomllib.loads(pyproject.read_text())["project"].get("scripts", {}))
    return found


def test_every_copy_source_is_in_the_context_and_the_image_is_not_root() -> None:
    copies = re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE, re.MULTILINE)
    sources = [s for line in copies for s in line.split()]
    assert sources, "the Dockerfile copies the workspace"
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not ignored(source), f"{source} is left out by .dockerignore"
    users = re.findall(r"^USER (\S+)$", DOCKERFILE, re.MULTILINE)
    assert users, "the image names its user"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit()
    assert int(uid) != 0  # numeric, so runAsNonRoot can check it
    assert gid.isdigit()
    assert "iptables" in DOCKERFILE  # it is the injector's default init image too
    assert {"trellis", "trellis-catalog", "trellis-endpoints-k8s"} <= set(entry_points())


@pytest.mark.timeout(600)
@pytest.mark.slow  # a real uv install of every member: half a minute
def test_the_build_stage_installs_every_entry_point(tmp_path: Path) -> None:
    source = context(tmp_path / "context")
    assert not (source / "tests").exists()
    assert not (source / ".tools").exists()
    [sync] = re.findall(r"^RUN (uv sync .+)$", DOCKERFILE, re.MULTILINE)
    environment = tmp_path / "opt-trellis"
    uv = shutil.which("uv") or str(ROOT / ".tools" / "bin" / "uv")
    done = subprocess.run(
        [uv, *sync.split()[1:]],
        cwd=source,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "UV_PROJECT_ENVIRONMENT": str(environment), "UV_LINK_MODE": "copy"},
        timeout=540,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for script in entry_points():
        ran = subprocess.run(
            [str(environment / "bin" / script), "--help"],
            capture_output=True, text=True, check=False, timeout=60, cwd=tmp_path,
        )  # fmt: skip
        assert ran.returncode == 0, f"{script}: {ran.stderr[-2000:]}"
    # installed, not linked to the sources: the image drops /src after the build stage
    links = environment.glob("lib/python*/site-packages/*.pth")
    assert [p.name for p in links if str(source) in p.read_text()] == []

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
CHART = Path("deploy") / "helm" / "trellis" / "Chart.yaml"
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
    members = ("libs", "services", "apps")
    for pyproject in [p for m in members for p in ROOT.glob(f"{m}/*/pyproject.toml")]:
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
    # the tests' support and their tools stay out of the image (libs/testing, the dev group)
    [site] = environment.glob("lib/python*/site-packages")
    assert not (site / "trellis_testing").exists()
    assert not (site / "pytest").exists()
    for library in ("trellis_spec", "trellis_identity", "trellis_runtime", "trellis_kube"):
        assert (site / library).is_dir(), library


def stages() -> list[tuple[str, str]]:
    """(base, name) of each FROM of the Dockerfile, in order ("" for an unnamed stage)."""
    found = re.findall(r"^FROM (\S+)(?: AS (\S+))?$", DOCKERFILE, re.MULTILINE)
    return [(base, name) for base, name in found]


def test_the_init_image_is_iptables_on_debian_and_the_default_is_the_trellis_image() -> None:
    named = dict((name, base) for base, name in stages())
    assert named["init"] == "${DEBIAN_IMAGE}"  # no Python in the init container's image
    init = DOCKERFILE.split(" AS init\n", 1)[1].split("\nFROM ", 1)[0]
    assert "apt-get install -y --no-install-recommends iptables" in init
    assert "COPY" not in init  # nothing of Trellis: the injector writes its rules
    last_base, last_name = stages()[-1]
    assert (last_base, last_name) == ("${PYTHON_IMAGE}", "")  # `docker build` gives trellis
    final = DOCKERFILE.rsplit("\nFROM ", 1)[1]
    assert "COPY --from=build /opt/trellis /opt/trellis" in final
    assert "iptables" not in final  # that is the init image's alone now


def fake_builder(folder: Path, name: str, log: Path) -> None:
    """A builder command that records its arguments and succeeds."""
    folder.mkdir(exist_ok=True)
    script = folder / name
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    script.chmod(0o755)


def essentials(folder: Path) -> str:
    """A PATH with only what the Makefile's image target needs besides a builder."""
    folder.mkdir()
    for tool in ("sh", "sed", "make", "test", "env", "uname"):
        found = shutil.which(tool)
        if found:
            (folder / tool).symlink_to(found)
    return str(folder)


def make_image(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-s", "--no-print-directory", "image", *args],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=60,
        env={**os.environ, "PATH": path},
    )  # fmt: skip


@pytest.mark.parametrize("builder", ["docker", "podman", "buildah"])
def test_make_image_builds_both_images_with_the_builder_it_finds(
    tmp_path: Path, builder: str
) -> None:
    log = tmp_path / "calls"
    fake_builder(tmp_path / "bin", builder, log)
    done = make_image(f"{tmp_path / 'bin'}:{essentials(tmp_path / 'base')}")
    assert done.returncode == 0, done.stderr
    version = re.search(r'^appVersion: "(.+)"$', (ROOT / CHART).read_text(), re.MULTILINE)
    assert version is not None
    tag = version.group(1)
    assert log.read_text().splitlines() == [
        "info",
        f"build -f deploy/Dockerfile -t ghcr.io/trellis-mesh/trellis:{tag} .",
        f"build -f deploy/Dockerfile --target init -t ghcr.io/trellis-mesh/trellis-init:{tag} .",
    ]


def test_make_image_without_a_builder_says_so(tmp_path: Path) -> None:
    done = make_image(essentials(tmp_path / "base"))
    assert done.returncode != 0
    assert "no image builder on this machine: install docker, podman or buildah" in done.stderr


def test_make_image_with_a_builder_whose_engine_is_down_says_so(tmp_path: Path) -> None:
    down = tmp_path / "bin" / "docker"
    down.parent.mkdir()
    down.write_text("#!/bin/sh\nexit 1\n")
    down.chmod(0o755)
    done = make_image(f"{down.parent}:{essentials(tmp_path / 'base')}")
    assert done.returncode != 0
    assert "docker is installed, but 'docker info' fails: is its engine running?" in done.stderr

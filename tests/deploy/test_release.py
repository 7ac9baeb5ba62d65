"""What makes a release one thing: one version in every place that states one, a license
everywhere, a CHANGELOG entry for the version, and the files the chart points at."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import yaml

from trellis_injector.settings import InjectorSettings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "trellis"
PROJECTS = [ROOT / "pyproject.toml", *sorted(ROOT.glob("libs/*/pyproject.toml"))]
PROJECTS += sorted(ROOT.glob("services/*/pyproject.toml"))
PROJECTS += sorted(ROOT.glob("apps/*/pyproject.toml"))


def project(path: Path) -> dict[str, object]:
    table: dict[str, object] = tomllib.loads(path.read_text())["project"]
    return table


VERSION = str(project(ROOT / "pyproject.toml")["version"])


def test_one_version_in_every_member_the_chart_the_image_and_what_runs() -> None:
    # the root, 7 libraries (api, common, identity, runtime, kube, spec, testing), 6 services,
    # 1 application (cli)
    assert len(PROJECTS) == 15
    assert {str(p.relative_to(ROOT)): project(p)["version"] for p in PROJECTS} == {
        str(p.relative_to(ROOT)): VERSION for p in PROJECTS
    }
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["tag"] == ""  # the image tag is the appVersion
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert set(re.findall(r"ghcr\.io/trellis-mesh/trellis:(\S+)", dockerfile)) == {VERSION}
    assert set(re.findall(r"ghcr\.io/trellis-mesh/trellis-init:(\S+)", dockerfile)) == {VERSION}
    # what the injector writes into pods when no chart sets it (`trellis up`, a bare run)
    fields = InjectorSettings.model_fields
    assert fields["init_image"].default == f"ghcr.io/trellis-mesh/trellis-init:{VERSION}"
    assert fields["agent_image"].default == f"ghcr.io/trellis-mesh/trellis:{VERSION}"
    assert metadata.version("trellis-common") == VERSION  # what `trellis version` reports


def test_apache_2_license_in_the_repository_every_member_and_the_chart() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text
    assert "Version 2.0, January 2004" in text
    assert {project(p).get("license") for p in PROJECTS} == {"Apache-2.0"}
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["annotations"]["artifacthub.io/license"] == "Apache-2.0"


def test_the_changelog_has_an_entry_for_the_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(VERSION)}\]", changelog, re.MULTILINE)


def test_the_chart_icon_is_a_file_of_the_repository() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    path = chart["icon"].split("/trellis/main/", 1)[1]
    icon = ROOT / path
    assert icon.is_file()
    assert icon.read_text().lstrip().startswith("<svg")

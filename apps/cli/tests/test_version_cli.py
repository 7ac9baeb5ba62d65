"""``trellis version`` and ``trellis completion``: the one version, each component's, and
completion scripts that really complete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from trellis_cli.client import DEFAULT_ADMIN_PORTS
from trellis_cli.main import cli
from trellis_cli.testing import Answer, CannedAdmin, unreachable

VERSION = metadata.version("trellis-common")


def trellis(state_dir: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--state-dir", str(state_dir), *args])


def test_the_client_version_is_the_installed_one_and_asks_nothing(tmp_path: Path) -> None:
    done = trellis(tmp_path, "version", "--client", "-o", "json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output) == {"client": {"version": VERSION}}
    assert trellis(tmp_path, "version", "--client").output == f"client: {VERSION}\n"
    assert not (tmp_path / "services").exists()  # nothing was looked up


def test_each_component_answers_its_version_and_the_silent_ones_say_why(tmp_path: Path) -> None:
    answers = {("GET", "/v1/status"): Answer(200, {"service": "x", "version": "9.9.9"})}
    with CannedAdmin(answers) as admin:
        admin.serve(tmp_path, "catalog", "certmanager")
        unreachable(
            tmp_path, *(n for n in DEFAULT_ADMIN_PORTS if n not in ("catalog", "certmanager"))
        )
        done = trellis(tmp_path, "version", "-o", "yaml")
    assert done.exit_code == 0, done.output
    body = yaml.safe_load(done.output)
    assert body["client"] == {"version": VERSION}
    assert body["components"]["catalog"] == {"version": "9.9.9"}
    assert body["components"]["certmanager"] == {"version": "9.9.9"}
    assert body["components"]["proxy-cp"]["error"].startswith("unreachable (")


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts_name_the_completion_variable(tmp_path: Path, shell: str) -> None:
    done = trellis(tmp_path, "completion", shell)
    assert done.exit_code == 0, done.output
    assert "_TRELLIS_COMPLETE" in done.output


def test_an_unknown_shell_is_refused_naming_the_choices(tmp_path: Path) -> None:
    done = trellis(tmp_path, "completion", "tcsh")
    assert done.exit_code == 2
    assert "'bash', 'zsh', 'fish'" in done.output


def test_completion_completes_lazy_subcommands_and_their_options() -> None:
    """What the bash script asks the program: the real entry point, as the shell runs it."""

    def complete(words: str, index: int) -> list[str]:
        env = {
            **os.environ,
            "_TRELLIS_COMPLETE": "bash_complete",
            "COMP_WORDS": words,
            "COMP_CWORD": str(index),
        }
        program = Path(sys.executable).parent / "trellis"  # the console script, as installed
        done = subprocess.run([str(program)], env=env, capture_output=True, text=True, timeout=30)
        return [line.split(",", 1)[1] for line in done.stdout.splitlines()]

    assert complete("trellis ver", 1) == ["version"]
    assert set(complete("trellis proxy ", 2)) >= {"list", "config", "renew"}
    assert "--client" in complete("trellis version --c", 2)

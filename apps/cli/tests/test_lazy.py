"""The subcommands are imported when run: ``trellis --help`` lists them without importing
one, in the very words their own help gives."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trellis_cli.lazy import LazyGroup
from trellis_cli.main import COMMANDS


@pytest.mark.parametrize("limit", [20, 45, 74, 200])
def test_the_listed_help_is_the_commands_own(limit: int) -> None:
    group = LazyGroup(lazy=COMMANDS)  # nothing loaded yet: every line comes from COMMANDS
    for name, lazy in COMMANDS.items():
        assert group.listed_help(name, limit) == lazy.load().get_short_help_str(limit), name


def test_each_command_loads_from_its_module_under_its_name() -> None:
    for name, lazy in COMMANDS.items():
        assert lazy.load().name == name


def test_help_imports_no_subcommand_and_no_heavy_library() -> None:
    probe = (
        "import sys\n"
        "from trellis_cli.main import cli\n"
        "try:\n"
        "    cli(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "import json\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    listed, _, modules = run.stdout.rpartition("\n[")
    loaded = set(json.loads("[" + modules))
    for name in COMMANDS:
        assert f"  {name} " in listed, name
    modules_of_commands = {lazy.target.split(":")[0] for lazy in COMMANDS.values()}
    assert not loaded & modules_of_commands
    assert not loaded & {"httpx", "grpc", "kubernetes", "fastapi", "rich", "pydantic"}


def test_a_lazy_command_runs() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "trellis_cli.main", "envoy", "--help"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert "The Envoy binary installed by `make bootstrap`." in run.stdout

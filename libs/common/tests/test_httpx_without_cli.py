"""Importing ``trellis_common`` keeps httpx from importing its own command-line client.

httpx imports click, rich and pygments for its CLI whenever they are installed (they are,
beside the trellis CLI): about 0.1 s of CPU at every service start and 0.25 s at every CLI
command, for a client no Trellis process runs. The package marks ``httpx._main`` absent."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

PROBE = """
import json, sys
import {first}
import httpx
with httpx.Client() as client:  # httpx itself works as before
    assert client.get is not None
print(json.dumps(sorted(name for name, module in sys.modules.items() if module is not None)))
"""


def loaded_after(first: str) -> set[str]:
    run = subprocess.run(
        [sys.executable, "-c", PROBE.format(first=first)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return set(json.loads(run.stdout))


@pytest.mark.parametrize("first", ["trellis_common", "trellis_runtime.adminhttp"])
def test_httpx_after_trellis_common_loads_no_cli_of_its_own(first: str) -> None:
    loaded = loaded_after(first)
    assert "httpx" in loaded
    assert not {m for m in loaded if m.split(".")[0] in {"rich", "pygments"}}
    assert "httpx._main" not in loaded


def test_without_trellis_common_httpx_would_load_its_cli() -> None:
    """The control: what the line in ``trellis_common/__init__.py`` saves, so the test above
    cannot pass because httpx stopped doing it by itself (then the line can go)."""
    loaded = loaded_after("sys")
    assert "httpx._main" in loaded
    assert "pygments" in loaded

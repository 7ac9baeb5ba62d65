"""A command that makes one admin request imports no more than it needs.

Each ``trellis`` run pays for its imports, and the test suite runs the CLI hundreds of
times: gRPC and cryptography (a component's own certificate), pydantic-settings (the
services' settings), the Kubernetes client, Redis and rich (tables, which ``--json`` never
prints) cost a tenth to half a second each. Checked in a fresh interpreter per module.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("grpc", "cryptography", "pydantic_settings", "pydantic", "kubernetes", "redis", "rich")
READERS = (
    "trellis_cli.status",
    "trellis_cli.certs",
    "trellis_cli.policy",
    "trellis_cli.proxy",
    "trellis_cli.vm",
    "trellis_cli.spec",
    "trellis_runtime.adminhttp",
)


@pytest.mark.parametrize("module", READERS)
def test_a_read_command_imports_none_of_the_heavy_libraries(module: str) -> None:
    probe = f"import sys, {module}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == [], f"{module} imports {done.stdout.strip()}"


def test_the_probe_sees_a_heavy_import() -> None:
    """The control: the same probe on a module that does import gRPC reports it."""
    probe = "import sys, trellis_identity.identity; print('grpc' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "True"


def test_an_http_client_in_the_cli_does_not_load_trio() -> None:
    """httpcore imports trio for its locks when it is installed; the CLI marks it absent."""
    probe = (
        "import sys, {first} httpx; httpx.Client().close(); "
        "print(sys.modules.get('trio') is not None)"
    )
    run = [sys.executable, "-c"]
    done = subprocess.run([*run, probe.format(first="trellis_cli,")], capture_output=True,
                          text=True, check=True, timeout=60)  # fmt: skip
    assert done.stdout.strip() == "False"
    # the control: without the CLI's package, the same client loads trio (installed here)
    control = subprocess.run([*run, probe.format(first="")], capture_output=True, text=True,
                             check=True, timeout=60)  # fmt: skip
    assert control.stdout.strip() == "True"

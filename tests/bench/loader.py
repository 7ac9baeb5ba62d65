"""Loading a module of the top-level ``bench`` package for its tests.

``bench/`` is run as ``python -m bench`` from the repository, not installed, and pytest
(``--import-mode=importlib``) does not put the repository on ``sys.path``: so ``import bench``
fails in a test, and each test loads the module it tests from its file instead.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py`` as the module ``bench_<name>``, loaded once.

    It is registered in ``sys.modules`` before it runs: its dataclasses look their module up
    there.
    """
    qualified = f"bench_{name}"
    if (loaded := sys.modules.get(qualified)) is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(qualified, BENCH / f"{name}.py")
    assert spec is not None, name
    assert spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    sys.modules[qualified] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[qualified]
        raise
    return module


def run_bench(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m bench ARGS`` from the repository, as ``make bench`` runs it."""
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=BENCH.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )

"""mypy --strict over the whole workspace in one run (``make typecheck``).

mypy names a file's module from its path. Each member's tests folder has a ``conftest.py``
and test modules whose names other members' tests share (``test_store.py``...), and three
members live in folders whose names are not identifiers (``services/proxy-cp``), so mypy
names those files ``conftest``, ``test_store``... and refuses the run ("Duplicate module
named"). ``make typecheck`` used to run mypy once per tests folder to avoid that: ten runs,
each loading the cache of everything again.

Here the module names of files in ``<libs|services>/<member>/tests/`` are given explicitly,
``services.proxy_cp.tests.conftest``, as mypy would name them if the folder's name were an
identifier; relative imports in those tests (``from .conftest import NOW``) resolve against
that package. Everything else keeps the name mypy gives it. The settings are
``pyproject.toml``'s, and the cache is mypy's own (``.mypy_cache``), so a second run checks
only what changed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

#: What is checked when no path is given (``make typecheck``): every member's code and tests,
#: the workspace's tests, benchmarks and tools.
PATHS = (
    "libs/common/src",
    "libs/identity/src",
    "libs/runtime/src",
    "libs/kube/src",
    "apps/cli/src",
    "libs/spec/src",
    "libs/testing/src",
    "services/*/src",
    "libs/*/tests",
    "apps/*/tests",
    "services/*/tests",
    "tests",
    "bench",
    "tools",
    "conftest.py",
)
_MEMBER_TESTS = re.compile(r"^(libs|services)/([^/]+)/tests/(.+)\.py$")


def module_name(source: BuildSource) -> str | None:
    """The module name mypy is to check ``source`` as."""
    found = _MEMBER_TESTS.match(source.path.replace("\\", "/")) if source.path else None
    if found is None:
        return source.module
    kind, member, rest = found.groups()
    parts = [kind, member.replace("-", "_"), "tests", *rest.split("/")]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def main(paths: list[str]) -> int:
    if not paths:
        paths = sorted(str(p) for pattern in PATHS for p in Path().glob(pattern))
    sources, options = process_options(paths)
    sources = [BuildSource(s.path, module_name(s), s.text, s.base_dir, s.followed) for s in sources]
    try:
        messages = build.build(sources, options).errors
    except CompileError as error:  # a file mypy could not read or place: no check ran
        print("\n".join(error.messages))
        return 2
    if messages:
        print("\n".join(messages))
    errors = sum(1 for line in messages if ": error:" in line)
    if errors:
        print(f"Found {errors} errors in {len(sources)} source files")
        return 1
    print(f"Success: no issues found in {len(sources)} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

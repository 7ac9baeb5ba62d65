"""trellis_common: what every Trellis process shares.

One thing happens on import, before any module of the package loads: httpx is told that its
command-line client is absent. httpx imports that client (``httpx._main``: click, rich and
pygments, about 0.15 s of CPU) whenever those packages are installed, and they are, beside the
``trellis`` CLI. No Trellis process runs httpx's own CLI, yet every service, CLI command and
agent paid for it at each start. ``None`` in ``sys.modules`` makes ``import httpx._main``
raise ImportError, which httpx catches (its fallback for when the CLI's dependencies are
missing). Every Trellis process imports this package before httpx: services and agents import
httpx only through ``trellis_runtime`` modules (that package imports this one first), and the
CLI's package imports it first.
"""

import sys

sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

"""trellis_cli.

``trellis_common`` is imported first, for what its import does: httpx without its own
command-line client (see that package's docstring).

And trio is marked absent: httpcore (under httpx) imports it for its locks whenever it is
installed, and the workspace's test tools install it. That was 0.28 s of every ``trellis``
command's 0.6 s; no command runs under trio, and httpcore treats a missing trio as it was
made to (``import trio`` raising ImportError). A process that already imported trio (a test
run's plugins) keeps it.
"""

import sys

import trellis_common  # noqa: F401

sys.modules.setdefault("trio", None)  # type: ignore[arg-type]

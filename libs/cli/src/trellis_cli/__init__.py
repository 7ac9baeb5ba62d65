"""trellis_cli.

``trellis_common`` is imported first, for what its import does: httpx without its own
command-line client (see that package's docstring).
"""

import trellis_common  # noqa: F401

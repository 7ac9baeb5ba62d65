"""trellis_runtime: a Trellis service's runtime, from its settings to its last drained call.

The service runner (:mod:`~trellis_runtime.service`, :mod:`~trellis_runtime.runtime`) and
what it runs: settings, the admin REST app and its clients, the gRPC server, health and
metrics, Redis (connections, ACLs, Sentinel, audits), signaling and the event path, the
registry, the mesh join on start and the revocation follower. It builds on
``trellis_identity`` and ``trellis_common``.

``trellis_common`` is imported first, as every Trellis package does: it keeps httpx from
loading its own command-line client (see its docstring), and :mod:`~trellis_runtime.adminhttp`
imports httpx before anything of ``trellis_common``.
"""

import trellis_common  # noqa: F401  (httpx's CLI marked absent before httpx loads)

"""Root conftest: fixtures every package's tests share (a real Redis, its client)."""

import os

# gRPC's C core logs connection events at info level to stderr; tests want errors only.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

pytest_plugins = ["trellis_common.testing.fixtures"]

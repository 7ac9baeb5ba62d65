"""Root conftest: fixtures every package's tests share (a real Redis, its client)."""

pytest_plugins = ["trellis_common.testing.fixtures"]

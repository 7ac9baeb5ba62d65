"""Root conftest: fixtures every package's tests share (a real Redis, its client), and the
fuzz budgets.

The fuzz suite (every ``test_fuzz_*.py``: hypothesis, and schemathesis, which runs on
hypothesis) takes its budget from one hypothesis profile, chosen by ``TRELLIS_FUZZ_PROFILE``:

- ``ci`` (the default, so ``make test`` and CI): 100 examples per test and no example
  database; the whole suite (96 tests) takes about 35 s on our two-core machine;
- ``fuzz`` (``make fuzz``): 5,000 examples per test, with the example database in
  ``.hypothesis/`` so a failure found once is replayed first next time.

Both turn the per-example deadline off: on a shared two-core machine timing is noise, and a
hang is caught by pytest-timeout instead.
"""

import os

from hypothesis import HealthCheck, settings

# gRPC's C core logs connection events at info level to stderr; tests want errors only.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

pytest_plugins = ["trellis_common.testing.fixtures"]

_SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=_SLOW_IS_FINE,
)
settings.register_profile(
    "fuzz",
    max_examples=5_000,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SLOW_IS_FINE,
)
settings.load_profile(os.environ.get("TRELLIS_FUZZ_PROFILE", "ci"))

"""Test helpers shared by every package's tests: a real Redis (alone, or under Sentinel)
and condition polling.

Nothing here is imported by production code: a package of its own (``libs/testing``, which
only the workspace's dev group installs, never the image) and an import contract in the
root ``pyproject.toml`` keep it so.
"""

from trellis_testing.redis_sentinel import SentinelRedis
from trellis_testing.redis_server import RedisServer, RedisServerError
from trellis_testing.waiting import eventually

__all__ = ["RedisServer", "RedisServerError", "SentinelRedis", "eventually"]

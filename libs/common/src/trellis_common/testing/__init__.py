"""Test helpers shared by every package's tests: a real Redis (alone, or under Sentinel)
and condition polling.

Nothing here is imported by production code.
"""

from trellis_common.testing.redis_sentinel import SentinelRedis
from trellis_common.testing.redis_server import RedisServer, RedisServerError
from trellis_common.testing.waiting import eventually

__all__ = ["RedisServer", "RedisServerError", "SentinelRedis", "eventually"]

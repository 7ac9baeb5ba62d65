"""Test helpers shared by every package's tests: a real Redis and condition polling.

Nothing here is imported by production code.
"""

from trellis_common.testing.redis_server import RedisServer, RedisServerError
from trellis_common.testing.waiting import eventually

__all__ = ["RedisServer", "RedisServerError", "eventually"]

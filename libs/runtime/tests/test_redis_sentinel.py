"""Redis under Sentinel: the ``redis+sentinel://`` URL, durable writes, and a real failover.

The failover tests run a master, two replicas and three sentinels
(:class:`~trellis_testing.SentinelRedis`), SIGKILL the master, and check what a
service relies on: the same client goes on by itself, no write acknowledged with
:func:`~trellis_runtime.redisconn.replicated` is lost, and a subscriber follows the new
master.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError

from trellis_common.backoff import Backoff
from trellis_runtime import redisacl, redisconn
from trellis_runtime.redisconn import NotReplicated, RedisRefused, RedisTarget
from trellis_runtime.sentinelurl import SentinelUrl
from trellis_runtime.signaling import Publisher
from trellis_runtime.subscriber import Subscriber
from trellis_testing import SentinelRedis, eventually
from trellis_testing.signaling import RecordingReceiver, running

pytestmark = pytest.mark.slow

CERTS = "trellis:certmanager:certs"
WORKLOADS = "trellis:endpoints-vm:workloads"


@pytest.fixture(scope="module")
def sentinel_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelRedis]:
    """One set for the tests that do not break it."""
    with SentinelRedis(tmp_path_factory.mktemp("sentinel")) as redis_set:
        yield redis_set


@pytest.fixture
def failing_set(tmp_path: Path) -> Iterator[SentinelRedis]:
    """A set of the test's own: it loses its master."""
    with SentinelRedis(tmp_path / "sentinel") as redis_set:
        yield redis_set


# --- the URL ---------------------------------------------------------------------------


def test_describe_names_the_sentinels_and_the_user_and_never_the_password() -> None:
    url = "redis+sentinel://catalog:s3cret@h1:26379,h2:26380/mymaster/2"
    target = RedisTarget(url)

    assert target.describe() == "sentinel[h1:26379,h2:26380]/mymaster/2 user=catalog"
    assert "s3cret" not in repr(target)


def test_describe_of_a_target_with_a_password_file(tmp_path: Path) -> None:
    secret = tmp_path / "catalog"
    secret.write_text("s3cret\n")
    secret.chmod(0o600)
    target = RedisTarget.create("redis+sentinel://h1/trellis", "", secret, "catalog")

    assert target.describe() == "sentinel[h1:26379]/trellis/0 user=catalog"
    assert "s3cret" not in target.describe() + repr(target)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis+sentinel://u:s3cret@h1:26379", "no master name"),
        ("redis+sentinel://u:s3cret@h1:port/m", "sentinel address 'h1:port'"),
        ("redis+sentinel://u:s3cret@h1,,h2/m", "a sentinel's address is empty"),
        ("redis+sentinel://u:s3cret@h1/m/zero", "/<master-name>[/<db>], db a number"),
        ("redis+sentinel://u:s3cret@h1/m?sentinel_pasword_file=/x", "unknown option"),
        ("redis+sentinel://u:s3cret@h1/m?sentinel_auth=maybe", "sentinel_auth must be"),
        ("redis+sentinel://u:s3cret@h1/m?sentinel_username=x", "needs sentinel_password_file"),
    ],
)
def test_a_bad_sentinel_url_is_refused_naming_the_problem_not_the_password(
    url: str, problem: str
) -> None:
    with pytest.raises(ValueError, match="bad Redis Sentinel URL") as caught:
        redisconn.connect(url)

    assert problem in str(caught.value)
    assert "s3cret" not in str(caught.value)
    assert "u:***@" in str(caught.value)


def test_the_sentinels_are_logged_in_to_as_the_url_says(tmp_path: Path) -> None:
    secret = tmp_path / "sentinel-password"
    secret.write_text("other\n")
    same = SentinelUrl.parse("redis+sentinel://h1/m")
    none = SentinelUrl.parse("redis+sentinel://h1/m?sentinel_auth=none")
    own = SentinelUrl.parse(f"redis+sentinel://h1/m?sentinel_password_file={secret}")

    assert same.sentinel_login("catalog", "pw") == ("catalog", "pw")
    assert none.sentinel_login("catalog", "pw") == (None, None)
    assert own.sentinel_login("catalog", "pw") == ("default", "other")
    missing = SentinelUrl.parse("redis+sentinel://h1/m?sentinel_password_file=/nonexistent")
    with pytest.raises(ValueError, match="sentinel_password_file '/nonexistent' cannot be read"):
        missing.sentinel_login("catalog", "pw")


async def test_replicated_asks_nothing_when_no_replica_is_required() -> None:
    # a client of nothing: no command may be sent
    client = redisconn.connect("redis://127.0.0.1:1/0")
    try:
        assert await redisconn.replicated(client, replicas=0) == 0
    finally:
        await client.aclose()


# --- durable writes, on a healthy set --------------------------------------------------


async def test_replicated_counts_the_replicas_that_have_every_acknowledged_write(
    sentinel_set: SentinelRedis,
) -> None:
    client = redisconn.connect(sentinel_set.target("endpoints-vm"))
    lagging = next(n for n in sentinel_set.nodes if n.port != sentinel_set.master_port())
    try:
        await client.hset(WORKLOADS, "vm-1", "registered")
        assert await redisconn.replicated(client, replicas=2) == 2

        lagging.pause()  # it accepts the stream and acknowledges nothing
        try:
            await client.hset(WORKLOADS, "vm-2", "registered")
            assert await redisconn.replicated(client, replicas=1) == 1
            with pytest.raises(NotReplicated, match=r"^Redis: 1 of the 2 replica\(s\) required"):
                await redisconn.replicated(client, replicas=2, timeout_ms=200)
        finally:
            lagging.resume()
    finally:
        await client.aclose()


async def test_a_component_logs_in_to_the_sentinels_and_redis_with_its_own_user(
    sentinel_set: SentinelRedis,
) -> None:
    client = redisconn.connect(sentinel_set.target("certmanager"))
    try:
        await redisconn.wait_for_redis(client, asyncio.Event())
        await client.hset(CERTS, "serial-1", "record")
        assert await redisconn.replicated(client, replicas=1) >= 1
    finally:
        await client.aclose()


async def test_a_refused_login_through_the_sentinels_is_reported_not_retried(
    sentinel_set: SentinelRedis,
) -> None:
    target = RedisTarget(sentinel_set.plain_url, "catalog", "not-its-password")
    client = redisconn.connect(target)
    try:
        with pytest.raises(RedisRefused, match="refused user 'catalog'") as caught:
            await asyncio.wait_for(redisconn.wait_for_redis(client, asyncio.Event()), 10)
        assert "not-its-password" not in str(caught.value)
    finally:
        await client.aclose()


# --- a failover --------------------------------------------------------------------------


async def durable_write(client: redis.asyncio.Redis, field: str) -> None:
    """A write answered only once a replica has it: retried as a caller's client would
    retry a request answered with an error (while the replicas follow the new master)."""
    while True:
        try:
            await client.hset(CERTS, field, "record")
            await redisconn.replicated(client, replicas=1)
            return
        except (NotReplicated, RedisConnectionError):
            await asyncio.sleep(0.1)


async def test_a_client_rides_over_a_failover_and_no_replicated_write_is_lost(
    failing_set: SentinelRedis,
) -> None:
    client = redisconn.connect(failing_set.target("certmanager"))
    try:
        acknowledged = []
        for n in range(50):
            await client.hset(CERTS, f"before-{n}", "record")
            await redisconn.replicated(client, replicas=1)
            acknowledged.append(f"before-{n}")

        old = await asyncio.to_thread(failing_set.kill_master)
        # the same client, no operator action: it waits out the failover by itself
        await client.hset(CERTS, "during", "record")
        new = await asyncio.to_thread(failing_set.wait_failover)
        assert new != old
        await asyncio.wait_for(durable_write(client, "after"), 30)

        fields = {f.decode() if isinstance(f, bytes) else f for f in await client.hkeys(CERTS)}
        assert set(acknowledged) <= fields
        assert {"during", "after"} <= fields
        admin = redisconn.connect(RedisTarget(failing_set.url))
        try:  # the sentinel and replication users needed nothing they were refused
            refused = await admin.acl_log()
            users = {entry["username"] for entry in refused}
            assert not users & {redisacl.SENTINEL, redisacl.REPLICATION}
        finally:
            await admin.aclose()
    finally:
        await client.aclose()


async def test_a_master_lost_between_the_write_and_the_wait_is_never_taken_for_success(
    failing_set: SentinelRedis,
) -> None:
    client = redisconn.connect(failing_set.target("certmanager"))
    replicas = [n for n in failing_set.nodes if n.port != failing_set.master_port()]
    try:
        await client.hset(CERTS, "warm", "record")  # the pool knows the master
        for replica in replicas:
            replica.pause()
        await client.hset(CERTS, "unsure", "record")  # on the master only, for now
        old = await asyncio.to_thread(failing_set.kill_master)
        for replica in replicas:
            replica.resume()

        # the wait finds the connection broken, and a new master behind the sentinels:
        # asking that one would count replicas that may never have had the write
        with pytest.raises((NotReplicated, RedisConnectionError)):
            await redisconn.replicated(client, replicas=1)
        assert await asyncio.to_thread(failing_set.wait_failover, old) != old
    finally:
        await client.aclose()


async def test_a_subscriber_follows_the_new_master_after_a_failover(
    failing_set: SentinelRedis,
) -> None:
    receiver = RecordingReceiver()
    subscriber = Subscriber(
        failing_set.target("catalog"),
        ["certificates"],
        receiver.on_event,
        receiver.on_resync,
        backoff=Backoff(0.05, 0.5),
        client="catalog",
    )
    publishing = redisconn.connect(failing_set.target("certmanager"))
    publisher = Publisher(publishing, sender="certmanager")
    try:
        async with running(subscriber):
            first = await publisher.publish("certificates", "issued", "a")
            await eventually(lambda: first in receiver.events)
            resyncs = len(receiver.resyncs)

            await asyncio.to_thread(failing_set.kill_master)
            await asyncio.to_thread(failing_set.wait_failover)
            # it subscribed again, on the new master, and resynced as after any reconnect
            await eventually(
                lambda: subscriber.connected and len(receiver.resyncs) > resyncs, timeout=30
            )
            after = await publisher.publish("certificates", "issued", "b")
            await eventually(lambda: after in receiver.events, timeout=10)
    finally:
        await publishing.aclose()

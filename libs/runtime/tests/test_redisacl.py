"""The ACL table against a real Redis 7: each component can do what the shared runtime does
for it (announce, discover, publish, follow), and nothing of another's.

The stores are checked in their own services' tests, which run against a Redis where the
store's client is that component's user (their ``redis_client`` fixture).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from trellis_runtime import redisacl, redisconn
from trellis_runtime.redisacl import COMPONENTS, Component
from trellis_runtime.registry import Announcer, ServiceRecord, discover, registry_key
from trellis_runtime.signaling import Publisher, channel_name, revision_key
from trellis_runtime.subscriber import Subscriber
from trellis_testing import RedisServer, eventually
from trellis_testing.signaling import RecordingReceiver, running

NAMES = sorted(COMPONENTS)


@contextlib.asynccontextmanager
async def as_user(server: RedisServer, user: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = redisconn.connect(server.target(user), retries=0)
    try:
        yield client
    finally:
        await client.aclose()


# --- the text ---------------------------------------------------------------------------


def test_the_aclfile_turns_the_default_user_off_and_holds_no_password() -> None:
    passwords = {name: f"secret-of-{name}" for name in ("admin", *COMPONENTS)}
    text = redisacl.aclfile_text(passwords)
    lines = text.splitlines()
    assert lines[0].startswith("user default off ")
    assert "secret-of" not in text
    assert {line.split()[1] for line in lines} == {"default", *passwords}
    assert f"#{redisacl.password_hash('secret-of-catalog')}" in text


def test_a_user_missing_from_the_table_is_named() -> None:
    with pytest.raises(ValueError, match=r"no ACL rules for \['ghost'\]"):
        redisacl.aclfile_text({"ghost": "x"})


def test_publishing_is_granted_only_in_the_selector_and_only_on_owned_channels() -> None:
    rules = COMPONENTS["proxy-cp"].rules()
    root, selector = rules[:-1], rules[-1]
    assert "+publish" not in root
    assert selector.startswith("(+publish ")
    assert "trellis:events:certificates" not in selector
    assert "&trellis:events:certificates" in root  # it follows certificates: it may subscribe
    assert "trellis:events:views" not in " ".join(rules)  # it watches the catalog over gRPC


def test_password_files_are_0600_in_a_0700_folder_and_kept(tmp_path: Path) -> None:
    files = redisacl.ensure_passwords(tmp_path / "users")
    assert set(files) == {"admin", *COMPONENTS}
    assert (tmp_path / "users").stat().st_mode & 0o777 == 0o700
    before = {name: path.read_text() for name, path in files.items()}
    assert all(path.stat().st_mode & 0o777 == 0o600 for path in files.values())
    (tmp_path / "users" / "catalog").unlink()  # deleting one rotates it
    again = redisacl.ensure_passwords(tmp_path / "users")
    assert again["catalog"].read_text() != before["catalog"]
    assert again["proxy-cp"].read_text() == before["proxy-cp"]


# --- what each component does, as its own user -------------------------------------------


@pytest.mark.parametrize("name", NAMES)
async def test_each_component_can_do_what_the_runtime_does_for_it(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis, name: str
) -> None:
    component = COMPONENTS[name]
    for kind in component.discovers:  # others announced, as admin
        await redis_client.set(registry_key(kind, f"{kind}-1"), _record(kind).to_json())
    async with as_user(redis_server, name) as client:
        assert await client.ping()
        await _announce_and_withdraw(client, component)
        for kind in component.discovers:
            assert [r.kind for r in await discover(client, kind)] == [kind]
        publisher = Publisher(client, sender=name)
        for topic in ("registry", *component.publishes):
            assert (await publisher.publish(topic, "changed", "k")).revision >= 1
            assert await publisher.current_revision(topic) >= 1
        if component.follows:
            await _follow(redis_server, redis_client, component)


async def _announce_and_withdraw(client: redis.asyncio.Redis, component: Component) -> None:
    announcer = Announcer(client, _record(component.kind, component.name), ttl=5)
    stop = asyncio.Event()
    task = asyncio.create_task(announcer.run(stop))
    await eventually(lambda: announcer.announced, message=f"{component.name} announced")
    stop.set()
    await asyncio.wait_for(task, 5)
    assert not announcer.announced


async def _follow(server: RedisServer, admin: redis.asyncio.Redis, component: Component) -> None:
    receiver = RecordingReceiver()
    subscriber = Subscriber(
        lambda: redisconn.connect(server.target(component.name), retries=0),
        component.follows,
        receiver.on_event,
        receiver.on_resync,
        client=component.name,
    )
    async with running(subscriber):  # subscribed, counters read, barrier came back
        topic = component.follows[0]
        await Publisher(admin, sender="owner").publish(topic, "changed", "k")
        await eventually(lambda: [e.topic for e in receiver.events] == [topic])


def _record(kind: str, name: str = "") -> ServiceRecord:
    return ServiceRecord.create(kind, name or f"{kind}-1", "127.0.0.1:1", "127.0.0.1:2")


# --- and nothing of another's -------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
async def test_no_component_touches_another_components_store(
    redis_server: RedisServer, name: str
) -> None:
    others = [k for c in COMPONENTS.values() if c.name != name for k in c.keys]
    async with as_user(redis_server, name) as client:
        for pattern in others:
            key = "trellis:" + pattern.replace("*", "x")
            with pytest.raises(NoPermissionError):
                await client.get(key)
            with pytest.raises(NoPermissionError):
                await client.set(key, "planted")


@pytest.mark.parametrize("name", NAMES)
async def test_no_component_rings_a_bell_it_does_not_own(
    redis_server: RedisServer, name: str
) -> None:
    owned = {"registry", *COMPONENTS[name].publishes}
    foreign = sorted({t for c in COMPONENTS.values() for t in c.publishes} - owned)
    async with as_user(redis_server, name) as client:
        publisher = Publisher(client, sender=name)
        for topic in foreign:
            with pytest.raises(NoPermissionError):
                await client.publish(channel_name(topic), "{}")
            with pytest.raises(ResponseError):  # the script: no counter, no channel
                await publisher.publish(topic, "changed", "k")
            with pytest.raises(NoPermissionError):
                await client.set(revision_key(topic), 1)


@pytest.mark.parametrize("name", NAMES)
async def test_no_component_announces_as_another_kind_or_runs_admin_commands(
    redis_server: RedisServer, name: str
) -> None:
    kinds = sorted({c.kind for c in COMPONENTS.values()} - {COMPONENTS[name].kind})
    async with as_user(redis_server, name) as client:
        for kind in kinds:
            with pytest.raises(NoPermissionError):
                await client.set(registry_key(kind, "impostor"), _record(kind).to_json())
        scripts = (
            ("EVAL", "return 1", "0"),
            ("EVALSHA", "0" * 40, "0"),
            ("SCRIPT", "LOAD", "return 1"),
            ("FUNCTION", "LIST"),
            ("FCALL", "f", "0"),
        )
        admin = (("FLUSHALL",), ("KEYS", "*"), ("CONFIG", "GET", "*"), ("ACL", "LIST"))
        for command in (*admin, *scripts):  # a script would run with all of its rights
            with pytest.raises(NoPermissionError):
                await client.execute_command(*command)  # type: ignore[no-untyped-call]


async def test_a_connection_without_a_password_is_refused(redis_server: RedisServer) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.plain_url)
    try:
        with pytest.raises(AuthenticationError, match="authenticat"):  # NOAUTH
            await client.ping()
    finally:
        await client.aclose()

"""Pytest fixtures shared by every package's tests (loaded by the root conftest.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from trellis_kube import client as kube_client
from trellis_runtime import redisconn
from trellis_testing import redis_backend
from trellis_testing.bell import Bell
from trellis_testing.kube import KubeApi
from trellis_testing.redis_server import RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server on a free port with AOF persistence in the test's tmp dir: a
    container where a Docker engine answers, else the local binary (:mod:`redis_backend`)."""
    server = redis_backend.redis_server(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    """A client (as ``admin``) that retries like a service's would: it rides over a Redis
    restart. A service's tests override it with :func:`component_client`."""
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.01), 8)
    client = redis.asyncio.Redis.from_url(redis_server.url, retry=retry)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def redis_admin(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    """The operator's client (``admin``): what a test inspects or breaks beside a component."""
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        yield client
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def component_client(
    server: RedisServer, component: str
) -> AsyncIterator[redis.asyncio.Redis]:
    """A client logged in as ``component``'s own ACL user, retrying like a service's.

    A service's store tests run on it: they then prove that the ACL table gives the
    component what its store does, and fail the day one of them does more."""
    client = redisconn.connect(server.target(component), retries=8)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def bell() -> Bell:
    """Records the signals a manager sends (:class:`~trellis_testing.bell.Bell`)."""
    return Bell()


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[KubeApi, Any]]:
    """The test Kubernetes API server, and an API client of the official ``kubernetes``
    client for it (through a kubeconfig, as a service would have one)."""
    with KubeApi() as api:
        client = kube_client.api_client(api.write_kubeconfig(tmp_path / "kubeconfig"))
        try:
            yield api, client
        finally:
            client.close()  # type: ignore[no-untyped-call]

"""The admin REST app (health, readiness, metrics, token guard) and its uvicorn runner."""

import asyncio
import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import Depends, FastAPI, Request
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel

from trellis_identity.tokens import AdminToken
from trellis_runtime import admin
from trellis_runtime.health import Health

TOKEN = "s3cret-admin-token"


async def always_ready() -> bool:
    await asyncio.sleep(0)
    return True


async def never_ready() -> bool:
    return False


def broken() -> bool:
    raise RuntimeError("check crashed")


async def broken_async() -> bool:
    raise ConnectionError("redis down")


def client_for(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def guarded_client(registry: CollectorRegistry) -> AsyncIterator[httpx.AsyncClient]:
    app = admin.create_app("test", registry)
    guard = admin.token_guard(AdminToken.of(TOKEN))

    @app.post("/reset", dependencies=[Depends(guard)])
    async def reset() -> dict[str, bool]:
        return {"reset": True}

    async with client_for(app) as client:
        yield client


async def test_healthz(registry: CollectorRegistry) -> None:
    async with client_for(admin.create_app("catalog", registry)) as client:
        response = await client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok", "service": "catalog"}


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"])
async def test_the_api_docs_are_not_served_by_default(
    registry: CollectorRegistry, path: str
) -> None:
    app = admin.create_app("catalog", registry)
    async with client_for(app) as client:
        assert (await client.get(path)).status_code == 404
    assert "/healthz" in app.openapi()["paths"]  # still built in-process, for the fuzz tests


async def test_debug_endpoints_serve_the_api_docs(registry: CollectorRegistry) -> None:
    app = admin.create_app("catalog", registry, debug_endpoints=True)
    async with client_for(app) as client:
        document = await client.get("/openapi.json")
        docs = await client.get("/docs")
        redoc = await client.get("/redoc")
    assert "/healthz" in document.json()["paths"]
    assert docs.status_code == 200
    assert redoc.status_code == 200


async def test_readyz_without_checks_is_ready(registry: CollectorRegistry) -> None:
    async with client_for(admin.create_app("catalog", registry)) as client:
        response = await client.get("/readyz")

    assert response.status_code == 200
    assert response.json() == {"ready": True, "service": "catalog", "checks": {}, "reasons": {}}


async def test_readyz_when_all_checks_pass(registry: CollectorRegistry) -> None:
    ready = asyncio.Event()
    ready.set()
    app = admin.create_app("catalog", registry, {"ca": ready.is_set, "redis": always_ready})

    async with client_for(app) as client:
        response = await client.get("/readyz")

    assert response.status_code == 200
    assert response.json() == {
        "ready": True,
        "service": "catalog",
        "checks": {"ca": True, "redis": True},
        "reasons": {},
    }


@pytest.mark.parametrize("failing", [asyncio.Event().is_set, never_ready])
async def test_readyz_503_names_the_failing_check(
    registry: CollectorRegistry, failing: admin.ReadinessCheck
) -> None:
    app = admin.create_app("catalog", registry, {"redis": always_ready, "ca": failing})

    async with client_for(app) as client:
        response = await client.get("/readyz")

    assert response.status_code == 503
    assert response.json() == {
        "ready": False,
        "service": "catalog",
        "checks": {"redis": True, "ca": False},
        "reasons": {"ca": "check failed"},
    }


@pytest.mark.parametrize("raising", [broken, broken_async])
async def test_readyz_a_raising_check_is_not_ready(
    registry: CollectorRegistry, raising: admin.ReadinessCheck, caplog: pytest.LogCaptureFixture
) -> None:
    app = admin.create_app("catalog", registry, {"ok": lambda: True, "store": raising})

    async with client_for(app) as client:
        response = await client.get("/readyz")

    assert response.status_code == 503
    assert response.json()["checks"] == {"ok": True, "store": False}
    assert [r.getMessage() for r in caplog.records] == ["admin.readiness_check_failed check=store"]


async def test_metrics_come_from_the_given_registry(registry: CollectorRegistry) -> None:
    issued = Counter("trellis_test_certs_issued", "Certificates issued", registry=registry)
    issued.inc(3)
    app = admin.create_app("catalog", registry)

    async with client_for(app) as client:
        response = await client.get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert "trellis_test_certs_issued_total 3.0" in response.text.splitlines()
    assert "python_gc_objects_collected_total" not in response.text  # not the global registry


async def test_a_value_error_is_a_422(registry: CollectorRegistry) -> None:
    app = admin.create_app("catalog", registry)

    @app.get("/boom")
    async def boom() -> None:
        raise ValueError("bad selector")

    async with client_for(app) as client:
        response = await client.get("/boom")

    assert response.status_code == 422
    assert response.json() == {"detail": "bad selector"}


async def test_guard_without_a_token_is_401(guarded_client: httpx.AsyncClient) -> None:
    response = await guarded_client.post("/reset")

    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer" in response.json()["detail"]


async def test_guard_with_another_scheme_is_401(guarded_client: httpx.AsyncClient) -> None:
    response = await guarded_client.post("/reset", headers={"Authorization": f"Basic {TOKEN}"})

    assert response.status_code == 401


@pytest.mark.parametrize("wrong", ["nope", TOKEN + "x", TOKEN[:-1], "ß-not-ascii"])
async def test_guard_with_a_wrong_token_is_403(
    guarded_client: httpx.AsyncClient, wrong: str
) -> None:
    response = await guarded_client.post(
        "/reset", headers=[(b"Authorization", f"Bearer {wrong}".encode())]
    )

    assert response.status_code == 403
    assert response.json() == {"detail": "admin token rejected"}


async def test_guard_with_the_right_token_is_200(guarded_client: httpx.AsyncClient) -> None:
    response = await guarded_client.post("/reset", headers={"Authorization": f"Bearer {TOKEN}"})

    assert response.status_code == 200
    assert response.json() == {"reset": True}


async def test_guard_leaves_unguarded_routes_open(guarded_client: httpx.AsyncClient) -> None:
    response = await guarded_client.get("/healthz")

    assert response.status_code == 200


async def test_admin_server_serves_over_tcp_until_stopped(registry: CollectorRegistry) -> None:
    announced: list[int] = []
    server = admin.AdminServer(
        admin.create_app("catalog", registry), "127.0.0.1", 0, announced.append
    )
    stop = asyncio.Event()

    running = asyncio.create_task(server.run(stop))
    try:
        await asyncio.wait_for(server.started.wait(), 5)

        assert server.port != 0
        assert announced == [server.port]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            response = await client.get("/healthz")
        assert response.status_code == 200
        assert response.json() == {"status": "ok", "service": "catalog"}
    finally:
        stop.set()
        await asyncio.wait_for(running, 5)

    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", server.port)


async def test_readyz_names_a_loop_that_is_down_and_why(registry: CollectorRegistry) -> None:
    health = Health(registry)
    follower = health.loops.register("provider endpoints-vm")
    follower.up()
    follower.down("UNAVAILABLE: connection refused")
    async with client_for(admin.create_app("catalog", registry, {}, health)) as client:
        down = await client.get("/readyz")
        follower.up()
        up = await client.get("/readyz")

    assert down.status_code == 503
    assert down.json()["reasons"] == {
        "loop:provider endpoints-vm": "UNAVAILABLE: connection refused"
    }
    assert up.status_code == 200
    assert up.json()["checks"] == {"loop:provider endpoints-vm": True}


async def test_status_lists_loops_and_rejections(registry: CollectorRegistry) -> None:
    health = Health(registry)
    health.loops.register("certmanager")
    health.rejections.reject("certmanager", "proxy/abc", "service account 'Bad Name!' is invalid")
    async with client_for(admin.create_app("catalog", registry, {}, health)) as client:
        body = (await client.get("/v1/status")).json()
        metrics = (await client.get("/metrics")).text

    assert [(loop["name"], loop["up"], loop["reason"]) for loop in body["loops"]] == [
        ("certmanager", False, "starting")
    ]
    assert [(r["source"], r["key"], r["reason"]) for r in body["rejections"]] == [
        ("certmanager", "proxy/abc", "service account 'Bad Name!' is invalid")
    ]
    assert 'trellis_rejected_records_total{source="certmanager"} 1.0' in metrics
    assert 'trellis_loop_down{loop="certmanager"} 1.0' in metrics


LIMIT = 1000


class Item(BaseModel):
    data: str


@pytest.fixture
def limited() -> tuple[FastAPI, Health, list[int]]:
    """An app with a 1,000-byte body limit, a route that parses JSON and one that reads raw
    bytes; ``handled`` gets the size of every body a route received whole."""
    registry = CollectorRegistry()
    health = Health(registry)
    app = admin.create_app("test", registry, {}, health, max_body_bytes=LIMIT)
    handled: list[int] = []

    @app.post("/items")
    async def items(item: Item) -> dict[str, int]:
        handled.append(len(item.data))
        return {"size": len(item.data)}

    @app.post("/raw")
    async def raw(request: Request) -> dict[str, int]:
        body = await request.body()
        handled.append(len(body))
        return {"size": len(body)}

    return app, health, handled


async def chunks(total: int, size: int = 100) -> AsyncIterator[bytes]:
    """A body sent chunked (no Content-Length)."""
    for start in range(0, total, size):
        yield b"x" * min(size, total - start)


async def test_a_declared_body_over_the_limit_is_413_before_the_route(
    limited: tuple[FastAPI, Health, list[int]],
) -> None:
    app, _, handled = limited
    async with client_for(app) as client:
        response = await client.post("/items", json={"data": "x" * 2000})
        status = (await client.get("/v1/status")).json()

    assert response.status_code == 413
    assert response.json()["limit_bytes"] == LIMIT
    assert "the limit is 1000 bytes" in response.json()["detail"]
    assert f"Content-Length {len(response.request.content)}" in response.json()["detail"]
    assert handled == []
    assert [(r["source"], r["key"]) for r in status["rejections"]] == [
        ("admin-request", "POST /items")
    ]


async def test_a_chunked_body_is_cut_off_once_past_the_limit(
    limited: tuple[FastAPI, Health, list[int]],
) -> None:
    app, _, handled = limited
    async with client_for(app) as client:
        response = await client.post("/raw", content=chunks(5000))

    assert "content-length" not in response.request.headers
    assert response.request.headers["transfer-encoding"] == "chunked"
    assert response.status_code == 413
    assert response.json()["limit_bytes"] == LIMIT
    assert f"more than {LIMIT} bytes read" in response.json()["detail"]
    assert handled == []


async def test_a_chunked_json_body_past_the_limit_is_never_parsed(
    limited: tuple[FastAPI, Health, list[int]],
) -> None:
    app, _, handled = limited

    async def document() -> AsyncIterator[bytes]:
        yield b'{"data": "'
        async for chunk in chunks(3000):
            yield chunk
        yield b'"}'

    async with client_for(app) as client:
        response = await client.post(
            "/items", content=document(), headers={"content-type": "application/json"}
        )

    assert response.status_code == 413
    assert handled == []


async def test_bodies_up_to_the_limit_pass(limited: tuple[FastAPI, Health, list[int]]) -> None:
    app, health, handled = limited
    async with client_for(app) as client:
        declared = await client.post("/raw", content=b"y" * LIMIT)
        streamed = await client.post("/raw", content=chunks(LIMIT))

    assert (declared.status_code, streamed.status_code) == (200, 200)
    assert handled == [LIMIT, LIMIT]
    assert len(health.rejections) == 0


async def test_the_default_limit_is_one_mebibyte(registry: CollectorRegistry) -> None:
    app = admin.create_app("test", registry, {}, Health(registry))

    @app.post("/raw")
    async def raw(request: Request) -> dict[str, int]:
        return {"size": len(await request.body())}

    async with client_for(app) as client:
        fits = await client.post("/raw", content=b"z" * admin.MAX_BODY_BYTES)
        over = await client.post("/raw", content=b"z" * (admin.MAX_BODY_BYTES + 1))
        metrics = (await client.get("/metrics")).text

    assert admin.MAX_BODY_BYTES == 1024 * 1024
    assert fits.json() == {"size": admin.MAX_BODY_BYTES}
    assert over.status_code == 413
    assert 'trellis_rejected_records_total{source="admin-request"} 1.0' in metrics


async def test_uvicorn_answers_413_to_a_client_still_sending(registry: CollectorRegistry) -> None:
    """Over TCP the 413 arrives while the client is still writing (the server drops the rest
    of the body rather than resetting the connection), and the connection stays usable."""
    app = admin.create_app("test", registry, {}, Health(registry), max_body_bytes=LIMIT)

    @app.post("/raw")
    async def raw(request: Request) -> dict[str, int]:
        return {"size": len(await request.body())}

    server = admin.AdminServer(app, "127.0.0.1", 0)
    stop = asyncio.Event()
    running = asyncio.create_task(server.run(stop))
    try:
        await asyncio.wait_for(server.started.wait(), 5)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            declared = await client.post("/raw", content=b"x" * 2_000_000)
            streamed = await client.post("/raw", content=chunks(200_000, 10_000))
            after = await client.get("/healthz")
    finally:
        stop.set()
        await asyncio.wait_for(running, 5)

    assert declared.status_code == streamed.status_code == 413
    assert declared.json()["limit_bytes"] == streamed.json()["limit_bytes"] == LIMIT
    assert after.status_code == 200


async def test_every_refusal_is_logged_and_counted_by_route_template(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    app = admin.create_app("test", registry)
    guard = admin.token_guard(AdminToken.of(TOKEN))

    @app.get("/v1/things/{name}", dependencies=[Depends(guard)])
    async def thing(name: str) -> dict[str, str]:
        return {"name": name}

    with caplog.at_level(logging.INFO, logger="trellis_runtime.refusals"):
        async with client_for(app) as client:
            assert (await client.get("/v1/things/a")).status_code == 401
            wrong = {"authorization": "Bearer wrong"}
            assert (await client.get("/v1/things/b", headers=wrong)).status_code == 403
            right = {"authorization": f"Bearer {TOKEN}"}
            assert (await client.get("/v1/things/c", headers=right)).status_code == 200
            assert (await client.get("/no/such/path")).status_code == 404

    def refused(route: str, status: str) -> float | None:
        labels = {"method": "GET", "route": route, "status": status}
        return registry.get_sample_value("trellis_http_refusals_total", labels)

    assert refused("/v1/things/{name}", "401") == 1
    assert refused("/v1/things/{name}", "403") == 1
    assert refused("/v1/things/{name}", "200") is None  # not a refusal
    assert refused("unmatched", "404") == 1  # the raw path is never a label
    logged = [r.getMessage() for r in caplog.records if r.msg.startswith("http.refused")]
    assert logged[0].startswith("http.refused method=GET route=/v1/things/{name} status=401")
    assert len(logged) == 3


def test_idle_connections_outlast_the_clients_own_keep_alive() -> None:
    """A server that closes an idle connection when the client does races it: the client's
    next request meets a closed socket (no answer). Ours keeps them longer than httpx."""
    server = admin.AdminServer(FastAPI(), "127.0.0.1", 0)
    client_expiry = httpx.Limits().keepalive_expiry
    assert client_expiry is not None
    assert server.config().timeout_keep_alive > 2 * client_expiry


async def test_listings_need_the_admin_token_and_health_stays_open() -> None:
    registry = CollectorRegistry()
    loaded: list[str] = []

    def token() -> AdminToken:
        loaded.append("once")
        return AdminToken.of(TOKEN)

    app = admin.create_app("catalog", registry, reads_token=token)

    @app.get("/v1/proxies")
    async def proxies() -> dict[str, list[str]]:
        return {"proxies": ["a.web.shop"]}

    @app.post("/v1/echo")
    async def echo() -> dict[str, str]:
        return {"ok": "yes"}

    async with client_for(app) as client:
        for path in ("/healthz", "/readyz", "/metrics", "/v1/status"):
            assert (await client.get(path)).status_code == 200, path
        assert loaded == []  # no listing asked yet: the token was not even loaded
        refused = await client.get("/v1/proxies")
        assert refused.status_code == 401
        assert "Bearer <admin token>" in refused.json()["detail"]
        wrong = await client.get("/v1/proxies", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 403
        right = await client.get("/v1/proxies", headers={"Authorization": f"Bearer {TOKEN}"})
        assert right.json() == {"proxies": ["a.web.shop"]}
        assert (await client.post("/v1/echo")).status_code == 200  # not a read: its own guard
        counted = (await client.get("/metrics")).text
    assert 'trellis_http_refusals_total{method="GET"' in counted

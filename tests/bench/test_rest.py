"""The churn's lean REST client against a real uvicorn over TLS: answers read by their
length, connections kept and reused, a closed one replaced, and what it does not read
refused by name."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvicorn
from cryptography import x509
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.bench.loader import bench_module
from trellis_testing.identities import LocalCA
from trellis_testing.waiting import eventually

rest = bench_module("rest")

TOKEN = "Bearer sesame"


async def workloads(request: Request) -> Response:
    if request.headers.get("authorization") != TOKEN:
        return JSONResponse({"detail": "no token"}, status_code=401)
    body = await request.json()
    assert request.client is not None
    return JSONResponse({"name": body["name"], "peer": request.client.port}, status_code=201)


async def remove(request: Request) -> Response:
    return Response(status_code=204)


async def closing(request: Request) -> Response:
    return JSONResponse({"bye": True}, headers={"Connection": "close"})


async def chunked(request: Request) -> Response:
    async def parts() -> AsyncIterator[bytes]:
        yield b"one"
        yield b"two"

    return StreamingResponse(parts())


APP = Starlette(
    routes=[
        Route("/v1/workloads", workloads, methods=["POST"]),
        Route("/v1/workloads/{namespace}/{name}", remove, methods=["DELETE"]),
        Route("/closing", closing, methods=["DELETE"]),
        Route("/chunked", chunked, methods=["DELETE"]),
    ]
)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[str, ssl.SSLContext]]:
    ca = LocalCA()
    leaf = ca.issue("server", [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    (tmp_path / "cert.pem").write_bytes(leaf.cert_chain_pem)
    (tmp_path / "key.pem").write_bytes(leaf.key_pem)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        APP,
        ssl_certfile=str(tmp_path / "cert.pem"),
        ssl_keyfile=str(tmp_path / "key.pem"),
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await eventually(lambda: server.started, 10.0, 0.01)
    context = ssl.create_default_context(cadata=ca.bundle_pem.decode())
    try:
        yield f"https://127.0.0.1:{sock.getsockname()[1]}", context
    finally:
        server.should_exit = True
        await task


async def test_calls_share_one_kept_alive_connection(served: tuple[str, ssl.SSLContext]) -> None:
    url, context = served
    client = rest.LeanClient(url, context, headers={"Authorization": TOKEN})
    try:
        first = await client.post("/v1/workloads", json={"name": "a"})
        gone = await client.delete("/v1/workloads/bookstore/a")
        second = await client.post("/v1/workloads", json={"name": "b"})
    finally:
        await client.aclose()
    assert (first.status_code, second.status_code, gone.status_code) == (201, 201, 204)
    assert gone.content == b""
    bodies = [json.loads(a.text) for a in (first, second)]
    assert [b["name"] for b in bodies] == ["a", "b"]
    assert bodies[0]["peer"] == bodies[1]["peer"]  # the same client port: one connection
    assert first.request.method == "POST"
    assert first.request.url == f"{url}/v1/workloads"


async def test_concurrent_calls_open_connections_of_their_own(
    served: tuple[str, ssl.SSLContext],
) -> None:
    url, context = served
    client = rest.LeanClient(url, context, headers={"Authorization": TOKEN})
    try:
        answers = await asyncio.gather(
            *(client.post("/v1/workloads", json={"name": f"w{i}"}) for i in range(4))
        )
        again = await client.post("/v1/workloads", json={"name": "again"})
    finally:
        await client.aclose()
    peers = {json.loads(a.text)["peer"] for a in answers}
    assert len(peers) == 4
    assert json.loads(again.text)["peer"] in peers  # an idle one was reused


async def test_a_refusal_is_an_answer_and_a_closed_connection_is_replaced(
    served: tuple[str, ssl.SSLContext],
) -> None:
    url, context = served
    client = rest.LeanClient(url, context)  # no token
    try:
        refused = await client.post("/v1/workloads", json={"name": "a"})
        closed = await client.delete("/closing")
        after = await client.delete("/v1/workloads/bookstore/a")
    finally:
        await client.aclose()
    assert refused.status_code == 401
    assert "no token" in refused.text
    assert closed.status_code == 200
    assert after.status_code == 204


async def test_what_it_cannot_read_is_an_error_naming_the_call(
    served: tuple[str, ssl.SSLContext],
) -> None:
    url, context = served
    client = rest.LeanClient(url, context)
    try:
        with pytest.raises(rest.RestError, match=r"DELETE .*/chunked: .*chunked"):
            await client.delete("/chunked")
        # the failed connection was dropped; the client still works
        assert (await client.delete("/v1/workloads/bookstore/x")).status_code == 204
    finally:
        await client.aclose()
    with pytest.raises(ValueError, match="an https URL with a port"):
        rest.LeanClient("http://127.0.0.1", context)

"""The admin REST routes: metadata only, and rotation behind the token."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from prometheus_client import CollectorRegistry

from trellis_certmanager.manager import CertificateManager
from trellis_certmanager.testing import InMemoryCertificateStore, proxy_key
from trellis_certmanager.transport import rest
from trellis_common.model import MeshService
from trellis_identity.tokens import AdminToken
from trellis_runtime import admin
from trellis_runtime.stored import Rejected

TOKEN = "s3cret-token"


@pytest.fixture
async def client(manager: CertificateManager) -> AsyncIterator[httpx.AsyncClient]:
    app = admin.create_app("certmanager", CollectorRegistry(), {"ca": manager.ready.is_set})
    rest.add_routes(app, manager, admin.token_guard(AdminToken.of(TOKEN)))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        yield client


async def test_list_and_get_never_return_keys(
    client: httpx.AsyncClient, manager: CertificateManager
) -> None:
    record = await manager.issue_service(MeshService("bookstore", "bookstore"))
    await manager.issue_proxy(MeshService("bookstore", "bookstore"), public_key=proxy_key())
    listed = await client.get("/v1/certificates")
    assert listed.status_code == 200
    assert len(listed.json()["certificates"]) == 2
    one = await client.get(f"/v1/certificates/{record.common_name}")
    assert one.json()["serial"] == f"{record.serial:x}"
    assert "BEGIN CERTIFICATE" in one.json()["cert_chain_pem"]
    for response in (listed, one):
        assert "PRIVATE KEY" not in response.text
    proxies = await client.get("/v1/certificates", params={"kind": "proxy"})
    assert [c["kind"] for c in proxies.json()["certificates"]] == ["proxy"]


async def test_bad_kind_is_422_naming_it(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/certificates", params={"kind": "banana"})
    assert response.status_code == 422
    assert "kind" in json.dumps(response.json())


async def test_root(client: httpx.AsyncClient, manager: CertificateManager) -> None:
    body = (await client.get("/v1/root")).json()
    assert body["fingerprint_sha256"] == manager.ca.fingerprint
    assert body["trust_bundle_pem"] == manager.ca.trust_bundle_pem.decode()
    pem = await client.get("/v1/root.pem")
    assert pem.text == manager.ca.trust_bundle_pem.decode()
    assert "PRIVATE KEY" not in pem.text + json.dumps(body)


async def test_rotate_needs_the_token(
    client: httpx.AsyncClient, manager: CertificateManager
) -> None:
    record = await manager.issue_service(MeshService("bookstore", "bookstore"))
    url = f"/v1/certificates/{record.common_name}/rotate"
    assert (await client.post(url)).status_code == 401
    wrong = await client.post(url, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 403
    assert manager.get(record.common_name).serial == record.serial
    ok = await client.post(url, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200
    assert ok.json()["certificate"]["serial"] != f"{record.serial:x}"
    assert "PRIVATE KEY" not in ok.text
    missing = await client.post(
        "/v1/certificates/nope/rotate", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert missing.status_code == 404
    assert "nope" in missing.json()["detail"]


async def test_delete_removes_only_records_refused_at_load(
    make_manager: Callable[..., CertificateManager], store: InMemoryCertificateStore
) -> None:
    store.rejected = [Rejected("junk", "trellis:certmanager:certs[junk]", "malformed")]
    manager = make_manager()
    await manager.start()
    record = await manager.issue_service(MeshService("bookstore", "bookstore"))
    app = admin.create_app("certmanager", CollectorRegistry())
    rest.add_routes(app, manager, admin.token_guard(AdminToken.of(TOKEN)))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        assert (await client.delete("/v1/certificates/junk")).status_code == 401
        valid = await client.delete(f"/v1/certificates/{record.common_name}", headers=auth)
        assert valid.status_code == 404
        assert "only those can be deleted" in valid.json()["detail"]
        assert (await client.delete("/v1/certificates/junk", headers=auth)).status_code == 204
        assert (await client.delete("/v1/certificates/junk", headers=auth)).status_code == 404
    assert store.rejected == []
    assert manager.get(record.common_name) == record

"""The admin routes: connected proxies with per-type state, and their configuration with
every private key redacted.

A real control plane builds the snapshots (with the identity's key in an SDS secret); the
streams are registered the way the ADS server registers them.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi import FastAPI

from trellis_proxy_cp import testing as t
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.transport import rest
from trellis_proxy_cp.transport.streams import ProxyStream, StreamRegistry
from trellis_proxy_cp.types import LISTENER, ROUTE, SECRET

STORE_1 = t.proxy_common_name("bookstore", "bookstore", 1)
BUYER_1 = t.proxy_common_name("bookbuyer", "bookbuyer", 2)


@dataclass
class Admin:
    client: httpx.AsyncClient
    cache: SnapshotCache
    control_plane: ProxyControlPlane
    store: ProxyStream
    buyer: ProxyStream


@pytest.fixture
async def admin() -> AsyncIterator[Admin]:
    cache = SnapshotCache()
    control_plane = t.FakeSources().control_plane(cache)
    streams = StreamRegistry()
    store = await t.connect(control_plane, streams, STORE_1)
    snapshot = cache.get(store.key)
    assert snapshot is not None
    t.acknowledge(store, snapshot)
    buyer = await t.connect(control_plane, streams, BUYER_1, protocol="delta")
    app = FastAPI()
    rest.add_routes(app, streams, cache, control_plane)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy-cp") as client:
        yield Admin(client, cache, control_plane, store, buyer)


async def test_proxies_are_listed_with_their_state_per_type(admin: Admin) -> None:
    snapshot = admin.cache.get(admin.store.key)
    assert snapshot is not None
    t.reject(admin.buyer, ROUTE, "v9", "duplicate domain 'reviews'")

    response = await admin.client.get("/v1/proxies")

    assert response.status_code == 200
    proxies = response.json()["proxies"]
    assert [p["proxy"] for p in proxies] == sorted([STORE_1, BUYER_1])
    store = next(p for p in proxies if p["proxy"] == STORE_1)
    assert store["identity"] == "bookstore/bookstore"
    assert store["node_id"] == STORE_1
    assert store["envoy_version"] == "1.40.0"
    assert store["protocol"] == "sotw"
    assert store["snapshot_key"] == admin.store.key
    assert sorted(store["types"]) == ["cds", "eds", "lds", "rds", "sds"]
    for short, url in [("lds", LISTENER), ("sds", SECRET)]:
        assert store["types"][short] == {
            "sent_version": snapshot.version_of(url),
            "acked_version": snapshot.version_of(url),
            "nacks": 0,
            "last_error": None,
        }
    buyer = next(p for p in proxies if p["proxy"] == BUYER_1)
    assert buyer["protocol"] == "delta"
    assert buyer["types"] == {
        "rds": {
            "sent_version": "v9",
            "acked_version": None,
            "nacks": 1,
            "last_error": "duplicate domain 'reviews'",
        }
    }


async def test_groups_are_listed_with_their_proxies_and_last_error(admin: Admin) -> None:
    await admin.control_plane.set_view(
        "bookbuyer/bookbuyer", t.broken_view("bookbuyer/bookbuyer", "2")
    )

    groups = (await admin.client.get("/v1/proxies")).json()["groups"]

    by_identity = {g["identity"]: g for g in groups}
    assert by_identity["bookstore/bookstore"] == {
        "key": admin.store.key,
        "identity": "bookstore/bookstore",
        "proxies": [STORE_1],
        "last_error": "",
    }
    assert "duplicate" in by_identity["bookbuyer/bookbuyer"]["last_error"]


async def test_the_configuration_has_every_type_and_no_private_key(admin: Admin) -> None:
    response = await admin.client.get(f"/v1/proxies/{STORE_1}/config")

    assert response.status_code == 200
    body = response.json()
    assert body["proxy"] == STORE_1
    snapshot = admin.cache.get(admin.store.key)
    assert snapshot is not None
    assert body["version"] == snapshot.version
    policy = admin.control_plane.policies["bookstore/bookstore"]
    assert body["version"].startswith(f"{policy.version}/")
    assert body["version"].endswith("/s1")  # the material's serial
    resources = body["resources"]
    assert list(resources) == ["cds", "eds", "lds", "rds", "sds"]
    assert {r["name"] for r in resources["lds"]} == {"outbound", "inbound"}
    assert [r["cluster_name"] for r in resources["eds"]] == ["bookstore/reviews|9080"]
    certificate = next(r for r in resources["sds"] if r["name"] == "service-cert")
    assert certificate["tls_certificate"]["private_key"] == rest.REDACTED
    # the proxy's own files, named: no key of the service travels
    own = certificate["tls_certificate"]["certificate_chain"]["filename"]
    assert own == f"{t.SIDECAR.workload_dir}/workload.pem"
    for secret in (
        t.KEY_PEM,
        base64.b64encode(t.KEY_PEM),
        t.KEY_PEM.splitlines()[1],  # the key's own base64 line
        base64.b64encode(t.KEY_PEM.splitlines()[1]),
    ):
        assert secret.decode() not in response.text


async def test_the_configuration_can_be_filtered_by_type(admin: Admin) -> None:
    only_sds = (await admin.client.get(f"/v1/proxies/{STORE_1}/config?type=sds")).json()
    two = (await admin.client.get(f"/v1/proxies/{STORE_1}/config?type=rds&type=cds")).json()

    assert list(only_sds["resources"]) == ["sds"]
    assert sorted(r["name"] for r in only_sds["resources"]["sds"]) == [
        "mesh-trust-bundle",
        "service-cert",
    ]
    assert list(two["resources"]) == ["rds", "cds"]


async def test_an_unknown_type_is_named(admin: Admin) -> None:
    response = await admin.client.get(f"/v1/proxies/{STORE_1}/config?type=sds&type=xds")

    assert response.status_code == 422
    assert "xds" in response.json()["detail"]


async def test_an_unknown_proxy_is_not_found(admin: Admin) -> None:
    stranger = t.proxy_common_name("bookstore", "bookstore", 99)

    response = await admin.client.get(f"/v1/proxies/{stranger}/config")

    assert response.status_code == 404
    assert stranger in response.json()["detail"]


async def test_a_proxy_without_a_snapshot_yet_is_not_found(admin: Admin) -> None:
    admin.cache.clear(admin.buyer.key)

    response = await admin.client.get(f"/v1/proxies/{BUYER_1}/config")

    assert response.status_code == 404
    assert "no configuration built" in response.json()["detail"]


def test_redact_replaces_private_keys_at_any_depth() -> None:
    tree = {"a": [{"private_key": {"inline_bytes": "S0VZ"}}, {"privateKey": "x", "keep": 1}]}

    assert rest.redact(tree) == {
        "a": [{"private_key": rest.REDACTED}, {"privateKey": rest.REDACTED, "keep": 1}]
    }

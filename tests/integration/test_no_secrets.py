"""No private key in any output of a full run.

The bookstore mesh runs with real Envoy sidecars and traffic; then everything an operator,
a log shipper, a backup or a scraper could see is gathered: every file in the state
directory (logs included), every admin REST route of every service (with the names that
exist filled in), every metric, every sidecar's config dump, and every value in Redis.
None may hold a private key, in PEM or in DER form (raw, base64 or hex): neither a key we
know (each proxy's, and the service keys proxy-cp serves) nor anything shaped like one.
The scanner is shown to find the keys where they are meant to be (the proxies' own key
files), so it is not blind.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from trellis_testing import RedisServer
from trellis_testing.mesh import Mesh, bookstore

pytestmark = pytest.mark.integration

#: The start of every DER private key Trellis can make (PKCS#8 EC P-256, SEC1 EC P-256,
#: PKCS#8 RSA), whatever the key.
DER_SHAPES = (
    bytes.fromhex("308187020100301306072a8648ce3d020106082a8648ce3d030107"),
    bytes.fromhex("30770201010420"),
    bytes.fromhex("020100300d06092a864886f70d0101010500"),
)


def forms(der: bytes) -> list[bytes]:
    """``der`` raw, in base64 (standard and URL-safe, at every alignment) and in hex."""
    found = [der, der.hex().encode()]
    for shift in range(3):  # the bytes may start anywhere in a longer base64 text
        padded = b"\0" * shift + der
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            found.append(encode(padded)[4:-4])  # what does not depend on the neighbours
    return found


def needles(keys: list[ec.EllipticCurvePrivateKey]) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = [("PEM", b"PRIVATE KEY")]
    for shape in DER_SHAPES:
        out += [("DER shape", f) for f in forms(shape)[:2]]  # raw and hex
        out += [("DER shape (base64)", base64.b64encode(shape)[:-4])]
    for number, key in enumerate(keys):
        for fmt in (
            serialization.PrivateFormat.PKCS8,
            serialization.PrivateFormat.TraditionalOpenSSL,
        ):
            der = key.private_bytes(serialization.Encoding.DER, fmt, serialization.NoEncryption())
            out += [(f"known key {number}", f) for f in forms(der)]
        scalar = key.private_numbers().private_value.to_bytes(32, "big")
        out += [(f"known key {number} (scalar)", f) for f in forms(scalar)[:2]]
    return out


def scan(where: str, data: bytes, looking_for: list[tuple[str, bytes]]) -> list[str]:
    return [f"{what} in {where}" for what, needle in looking_for if needle and needle in data]


def redis_values(url: str) -> Iterator[tuple[str, bytes]]:
    client: Any = redis.Redis.from_url(url)
    for key in client.scan_iter(count=500):
        kind = client.type(key).decode()
        if kind == "string":
            value = [client.get(key) or b""]
        elif kind == "hash":
            value = [k + b"=" + v for k, v in client.hgetall(key).items()]
        elif kind == "set":
            value = list(client.smembers(key))
        elif kind == "zset":
            value = list(client.zrange(key, 0, -1))
        elif kind == "list":
            value = list(client.lrange(key, 0, -1))
        elif kind == "stream":
            value = [json.dumps(str(client.xrange(key))).encode()]
        else:
            value = [kind.encode()]
        yield (
            key.decode(),
            b"\n".join(v if isinstance(v, bytes) else str(v).encode() for v in value),
        )


def rest_outputs(mesh: Mesh) -> Iterator[tuple[str, bytes]]:
    paths = {
        "certmanager": ["/v1/certificates", "/v1/revoked", "/v1/root", "/v1/root.pem"],
        "catalog": ["/v1/views", "/v1/proxies", "/v1/services", "/v1/resources"],
        "endpoints-vm": ["/v1/workloads", "/v1/services", "/v1/documents"],
        "proxy-cp": ["/v1/proxies"],
    }
    certificates = mesh.processes["certmanager"].get("/v1/certificates").json()["certificates"]
    paths["certmanager"] += [f"/v1/certificates/{c['common_name']}" for c in certificates]
    for view in mesh.processes["catalog"].get("/v1/views").json()["views"]:
        paths["catalog"].append(f"/v1/views/{view['identity']}")
    for service, routes in paths.items():
        process = mesh.processes[service]
        for path in [*routes, "/v1/status", "/metrics", "/readyz", "/healthz"]:
            answer = process.get(path)
            yield f"{service} GET {path} ({answer.status_code})", answer.content
    for replica in mesh.proxy_cps[1:]:  # with replicas (make test-replicas): theirs too
        for path in ["/v1/proxies", "/v1/status", "/metrics"]:
            answer = replica.get(path)
            yield f"{replica.instance} GET {path} ({answer.status_code})", answer.content
    for proxy in mesh.proxies():  # each proxy's configuration, where it is connected
        replica = mesh.proxy_cp_of(proxy["proxy"])
        for kind in ("lds", "cds", "rds", "eds", "sds"):
            path = f"/v1/proxies/{proxy['proxy']}/config?type={kind}"
            answer = replica.get(path)
            yield f"{replica.instance} GET {path} ({answer.status_code})", answer.content


def test_no_private_key_in_any_output_after_a_full_run(
    mesh: Mesh, redis_server: RedisServer, state_dir: Path
) -> None:
    v1, v2, buyer = bookstore(mesh)
    for _ in range(5):
        assert buyer.get("bookstore.bookstore:14001", "/books-bought").status_code == 200

    key_files = sorted((mesh.tmp / "proxies").glob("*/key.pem"))
    keys = []
    for path in key_files:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        keys.append(key)
    # (no service key leaves certmanager any more: every proxy has its own key, and no
    # component may ask for a service's; test_certmanager shows them sealed at rest)
    looking_for = needles(keys)
    assert len(keys) == 3  # the three proxies' own keys

    # the scanner is not blind: it finds each proxy's key in its own key file
    for path in key_files:
        data = path.read_bytes()
        assert scan(str(path), data, looking_for)
        der = base64.b64decode(b"".join(data.splitlines()[1:-1]))
        assert scan("the DER of " + str(path), der, looking_for)

    outputs: list[tuple[str, bytes]] = []
    outputs += [(str(p), p.read_bytes()) for p in sorted(state_dir.rglob("*")) if p.is_file()]
    outputs += list(rest_outputs(mesh))
    outputs += list(redis_values(redis_server.url))
    for sidecar in (v1, v2, buyer):
        dump = sidecar.envoy.get("/config_dump?include_eds")
        outputs.append((f"{sidecar.common_name} config_dump", dump.content))

    assert len(outputs) > 40
    assert [where for where, _ in outputs if " GET " in where and "(200)" not in where] == []
    found = [hit for where, data in outputs for hit in scan(where, data, looking_for)]
    assert found == []

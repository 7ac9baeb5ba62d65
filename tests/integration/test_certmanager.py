"""certmanager as a process: real Redis, real gRPC, the CLI, crashes and restarts, and corrupt
state planted in Redis."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest
import redis
from cryptography import x509

from trellis_api import certmanager_pb2 as pb
from trellis_api import certmanager_pb2_grpc as pb_grpc
from trellis_identity import tokens
from trellis_identity.identity import csr_for, new_key
from trellis_runtime.signaling import Event
from trellis_runtime.subscriber import Subscriber
from trellis_testing import RedisServer, eventually
from trellis_testing.identities import allowed_caller
from trellis_testing.services import ServiceProcess, trellis

PROXY_CSR = csr_for(new_key()[1], "a proxy")  # a proxy made its key; certmanager signs it

pytestmark = pytest.mark.integration

SERVICE = pb.MeshService(namespace="bookstore", name="bookstore-v1")


CM = "/trellis.certmanager.v1.CertificateManager/"


async def call(process: ServiceProcess, method: str, request: object) -> object:
    """``method`` as a component the policy lets call it (the injector for proxy
    certificates, proxy-cp for service keys, the catalog to list...)."""
    async with process.channel(allowed_caller(CM + method, request)) as channel:
        stub = pb_grpc.CertificateManagerStub(channel)
        return await getattr(stub, method)(request, timeout=10)


async def root_fingerprint(process: ServiceProcess) -> str:
    root = await call(process, "GetRoot", pb.GetRootRequest())
    assert isinstance(root, pb.RootBundle)
    return root.fingerprint_sha256


async def test_root_and_certificates_survive_crashes_of_certmanager_and_redis(
    certmanager: ServiceProcess, redis_server: RedisServer, state_dir: Path
) -> None:
    fingerprint = await root_fingerprint(certmanager)
    issued = await call(
        certmanager,
        "IssueCertificate",
        pb.IssueCertificateRequest(
            kind=pb.CERTIFICATE_KIND_SERVICE, service=SERVICE, omit_private_key=True
        ),
    )
    assert isinstance(issued, pb.Certificate)

    certmanager.kill()
    certmanager.start()
    assert await root_fingerprint(certmanager) == fingerprint
    got = await call(
        certmanager,
        "GetCertificateInfo",
        pb.GetCertificateRequest(common_name=issued.info.common_name),
    )
    assert isinstance(got, pb.CertificateInfo)
    assert got.serial == issued.info.serial

    redis_server.kill()
    redis_server.start()

    # certmanager rides over the Redis restart and keeps issuing
    async def issues_again() -> bool:
        try:
            await call(
                certmanager,
                "IssueCertificate",
                pb.IssueCertificateRequest(
                    kind=pb.CERTIFICATE_KIND_PROXY, service=SERVICE, csr_pem=PROXY_CSR
                ),
            )
        except grpc.aio.AioRpcError:
            return False
        return True

    await eventually(issues_again, timeout=15, message="certmanager issues after Redis restart")
    certmanager.stop()
    certmanager.start()
    assert await root_fingerprint(certmanager) == fingerprint
    listed = await call(certmanager, "ListCertificates", pb.ListCertificatesRequest())
    assert isinstance(listed, pb.ListCertificatesResponse)
    kinds = sorted(c.kind for c in listed.certificates)
    assert kinds == [pb.CERTIFICATE_KIND_SERVICE, pb.CERTIFICATE_KIND_PROXY]
    assert "PRIVATE KEY" not in certmanager.logs()


async def test_redis_wiped_while_running_is_refilled_from_memory(
    certmanager: ServiceProcess, redis_server: RedisServer
) -> None:
    fingerprint = await root_fingerprint(certmanager)
    await call(
        certmanager,
        "IssueCertificate",
        pb.IssueCertificateRequest(
            kind=pb.CERTIFICATE_KIND_SERVICE, service=SERVICE, omit_private_key=True
        ),
    )
    redis_server.kill()
    redis_server.wipe()
    redis_server.start()
    certmanager.env["TRELLIS_CERTMANAGER_ROTATION_INTERVAL"] = "0.2"

    async def restored() -> bool:
        return "ca.store_restored" in certmanager.logs()

    await eventually(restored, timeout=20, message="certmanager restores the wiped store")
    certmanager.kill()
    certmanager.start()
    assert await root_fingerprint(certmanager) == fingerprint
    listed = await call(certmanager, "ListCertificates", pb.ListCertificatesRequest())
    assert isinstance(listed, pb.ListCertificatesResponse)
    assert len(listed.certificates) == 1


async def test_rotation_reaches_the_bus_and_the_cli(
    certmanager: ServiceProcess, redis_server: RedisServer, state_dir: Path
) -> None:
    issued = await call(
        certmanager,
        "IssueCertificate",
        pb.IssueCertificateRequest(
            kind=pb.CERTIFICATE_KIND_SERVICE, service=SERVICE, omit_private_key=True
        ),
    )
    assert isinstance(issued, pb.Certificate)
    events: list[Event] = []

    async def on_event(event: Event) -> None:
        events.append(event)

    async def on_resync(topic: str) -> None:
        return None

    subscriber = Subscriber(redis_server.url, ["certificates"], on_event, on_resync)
    stop = asyncio.Event()
    task = asyncio.create_task(subscriber.run(stop))
    await eventually(lambda: subscriber.connected, message="subscriber connected")

    rotated = await asyncio.to_thread(
        trellis, state_dir, "certs", "rotate", issued.info.common_name, "--json"
    )
    assert rotated.returncode == 0, rotated.stderr
    body = json.loads(rotated.stdout)
    assert body["certificate"]["serial"] != issued.info.serial
    await eventually(lambda: any(e.kind == "rotated" for e in events), message="rotated event")
    event = next(e for e in events if e.kind == "rotated")
    assert event.key == issued.info.common_name
    assert event.revision == body["revision"]
    stop.set()
    await task

    listed = await asyncio.to_thread(trellis, state_dir, "certs", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "PRIVATE KEY" not in listed.stdout
    assert [c["serial"] for c in json.loads(listed.stdout)["certificates"]] == [
        body["certificate"]["serial"]
    ]
    root = await asyncio.to_thread(trellis, state_dir, "certs", "root")
    assert root.returncode == 0
    x509.load_pem_x509_certificate(root.stdout.encode())
    table = await asyncio.to_thread(trellis, state_dir, "certs", "list")
    assert issued.info.common_name in table.stdout


async def test_cli_errors_are_clear(certmanager: ServiceProcess, state_dir: Path) -> None:
    missing = await asyncio.to_thread(trellis, state_dir, "certs", "rotate", "nope")
    assert missing.returncode == 1
    assert "404" in missing.stderr
    assert "nope" in missing.stderr
    (state_dir / "admin-token").write_text("wrong\n")
    denied = await asyncio.to_thread(trellis, state_dir, "certs", "rotate", "nope")
    assert denied.returncode == 2  # no answer: the token was refused
    assert "403" in denied.stderr
    certmanager.stop()
    down = await asyncio.to_thread(trellis, state_dir, "certs", "list")
    assert down.returncode == 2
    assert "not reachable" in down.stderr
    status = await asyncio.to_thread(trellis, state_dir, "status")
    assert status.returncode == 2  # no service answers: no mesh to judge


# --- corrupt state planted in Redis -------------------------------------------------------

CA_KEY = "trellis:certmanager:ca"
RECORDS_KEY = "trellis:certmanager:certs"


async def test_an_unreadable_ca_stops_certmanager_naming_the_key_and_never_re_roots(
    certmanager: ServiceProcess, redis_server: RedisServer, state_dir: Path
) -> None:
    fingerprint = await root_fingerprint(certmanager)
    marker = state_dir / "certmanager" / "root-fingerprint"
    assert marker.read_text().strip() == fingerprint
    certmanager.stop()
    with redis.Redis.from_url(redis_server.url) as raw:
        raw.set(CA_KEY, '{"cert_pem": "garbage"')

    with pytest.raises(RuntimeError, match="exited with 1") as caught:
        certmanager.start()
    [fatal] = [line for line in certmanager.logs().splitlines() if "ca.fatal" in line]
    assert f"Redis key '{CA_KEY}' cannot be loaded" in fatal
    assert "Restore that key from a backup" in fatal
    assert "Traceback" not in str(caught.value)
    assert marker.read_text().strip() == fingerprint  # the marker stays
    with redis.Redis.from_url(redis_server.url) as raw:
        assert raw.get(CA_KEY) == b'{"cert_pem": "garbage"'  # nothing written over it


async def test_corrupt_records_are_skipped_reported_and_re_issued_or_deleted(
    certmanager: ServiceProcess, redis_server: RedisServer, state_dir: Path
) -> None:
    proxy = await call(
        certmanager,
        "IssueCertificate",
        pb.IssueCertificateRequest(
            kind=pb.CERTIFICATE_KIND_PROXY,
            service=SERVICE,
            service_account="bookstore",
            csr_pem=PROXY_CSR,
        ),
    )
    service = await call(
        certmanager,
        "IssueCertificate",
        pb.IssueCertificateRequest(
            kind=pb.CERTIFICATE_KIND_SERVICE, service=SERVICE, omit_private_key=True
        ),
    )
    assert isinstance(proxy, pb.Certificate)
    assert isinstance(service, pb.Certificate)
    proxy_cn, service_cn = proxy.info.common_name, service.info.common_name
    certmanager.stop()
    with redis.Redis.from_url(redis_server.url) as raw:
        stored = json.loads(raw.hget(RECORDS_KEY, proxy_cn) or b"")
        raw.hset(
            RECORDS_KEY,
            mapping={
                # as an older version that did not validate accounts may have stored it
                proxy_cn: json.dumps({**stored, "service_account": "Bad Name!"}),
                "truncated": json.dumps(stored)[:80],
            },
        )
    certmanager.start()

    listed = await call(certmanager, "ListCertificates", pb.ListCertificatesRequest())
    assert isinstance(listed, pb.ListCertificatesResponse)
    assert [c.common_name for c in listed.certificates] == [service_cn]  # the rest is served
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await call(
            certmanager, "GetCertificateInfo", pb.GetCertificateRequest(common_name=proxy_cn)
        )
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND

    token = tokens.load_or_create_admin_token(state_dir)
    async with certmanager.async_client(
        headers={"Authorization": f"Bearer {token}"}, timeout=10
    ) as admin:
        status = (await admin.get("/v1/status")).json()
        reasons = {r["key"]: r["reason"] for r in status["rejections"]}
        assert sorted(reasons) == [f"{RECORDS_KEY}[{proxy_cn}]", f"{RECORDS_KEY}[truncated]"]
        assert "service account 'Bad Name!'" in reasons[f"{RECORDS_KEY}[{proxy_cn}]"]
        metrics = (await admin.get("/metrics")).text
        assert 'trellis_rejected_records_total{source="redis"} 2.0' in metrics

        reissued = await call(
            certmanager,
            "IssueCertificate",
            pb.IssueCertificateRequest(
                kind=pb.CERTIFICATE_KIND_PROXY,
                service=SERVICE,
                proxy_id=proxy.info.proxy_id,
                service_account="bookstore",
                csr_pem=PROXY_CSR,
            ),
        )
        assert isinstance(reissued, pb.Certificate)
        assert reissued.info.common_name == proxy_cn
        assert (await admin.delete("/v1/certificates/truncated")).status_code == 204
        assert (await admin.get("/v1/status")).json()["rejections"] == []
    with redis.Redis.from_url(redis_server.url) as raw:
        assert sorted(k.decode() for k in raw.hkeys(RECORDS_KEY)) == sorted([proxy_cn, service_cn])


# --- keys at rest and planted CAs ------------------------------------------------------------


def plaintext_ca_json() -> str:
    """A CA as someone without the KEK can write one: in the pre-sealing format, key in clear."""
    import base64
    import datetime as dt

    from trellis_certmanager.domain.authority import generate_root
    from trellis_certmanager.domain.keys import KeyAlgorithm

    now = dt.datetime.now(dt.UTC)
    ca = generate_root(KeyAlgorithm.ECDSA_P256, dt.timedelta(days=30), now, "cluster.local")
    return json.dumps({k: base64.b64encode(v).decode() for k, v in ca.to_pems().items()})


async def test_the_kek_is_a_0600_file_and_redis_holds_no_key_in_the_clear(
    certmanager: ServiceProcess, redis_server: RedisServer, state_dir: Path
) -> None:
    await call(
        certmanager,
        "IssueCertificate",
        pb.IssueCertificateRequest(
            kind=pb.CERTIFICATE_KIND_SERVICE, service=SERVICE, omit_private_key=True
        ),
    )
    kek = state_dir / "certmanager" / "kek"
    assert kek.stat().st_mode & 0o777 == 0o600
    assert kek.parent.stat().st_mode & 0o777 == 0o700
    with redis.Redis.from_url(redis_server.url) as raw:
        stored = [raw.get(CA_KEY) or b"", *raw.hgetall(RECORDS_KEY).values()]
    assert len(stored) == 2
    assert not any(b"PRIVATE KEY" in value for value in stored)
    assert "PRIVATE KEY" not in certmanager.logs()


async def test_a_loose_kek_file_stops_certmanager_with_one_line(
    certmanager: ServiceProcess, state_dir: Path
) -> None:
    certmanager.stop()
    kek = state_dir / "certmanager" / "kek"
    kek.chmod(0o644)
    with pytest.raises(RuntimeError, match="exited with 1"):
        certmanager.start()
    [fatal] = [line for line in certmanager.logs().splitlines() if "kek.fatal" in line]
    assert f"chmod 600 {kek}" in fatal
    kek.chmod(0o600)
    certmanager.start()  # fixed as the line says, it starts


async def test_a_ca_planted_while_stopped_is_refused_at_start(
    certmanager: ServiceProcess, redis_server: RedisServer
) -> None:
    fingerprint = await root_fingerprint(certmanager)
    certmanager.stop()
    planted = plaintext_ca_json()
    with redis.Redis.from_url(redis_server.url) as raw:
        raw.set(CA_KEY, planted)
    with pytest.raises(RuntimeError, match="exited with 1"):
        certmanager.start()
    [line] = [line for line in certmanager.logs().splitlines() if "ca.planted" in line]
    assert f"this mesh's root is {fingerprint}" in line
    assert "never adopted" in line
    with redis.Redis.from_url(redis_server.url) as raw:
        assert raw.get(CA_KEY) == planted.encode()  # neither adopted nor sealed over


async def test_a_ca_planted_while_running_stops_certmanager(
    certmanager: ServiceProcess, redis_server: RedisServer
) -> None:
    fingerprint = await root_fingerprint(certmanager)
    with redis.Redis.from_url(redis_server.url) as raw:
        raw.set(CA_KEY, plaintext_ca_json())
    assert certmanager.process is not None
    code = await asyncio.to_thread(certmanager.process.wait, 30)  # the store guard's next round
    assert code == 1
    [line] = [line for line in certmanager.logs().splitlines() if "ca.planted" in line]
    assert f"is not the one this certmanager serves (root {fingerprint})" in line

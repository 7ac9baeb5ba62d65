"""Two certmanager replicas on one real Redis: issuance from either gives one certificate per
request, and a revocation made on one is seen by the other (``claims.py``, ``replicas.py``,
``coherence.py``).

"Certificates issued twice" is counted the way the issue asks: the distinct serials that
the requests for one (common name, request) got, and the certificates both replicas' own
metrics say they issued: each must be 1.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
from collections.abc import Callable
from typing import Any

import redis.asyncio
from kubernetes import client as k8s
from prometheus_client import CollectorRegistry

from trellis_certmanager.coherence import ReplicaFollower
from trellis_certmanager.componentcerts import ComponentCertificates
from trellis_certmanager.domain.csr import signed_for
from trellis_certmanager.domain.errors import StaleCertificate
from trellis_certmanager.domain.renewal import Renewal
from trellis_certmanager.enrollment import ProxyEnrollment
from trellis_certmanager.identities import ComponentIssuer, JoinRefused
from trellis_certmanager.manager import CertificateManager, utcnow
from trellis_certmanager.testing import InMemoryCertificateStore, proxy_key
from trellis_certmanager.tokenreview import ServiceAccountReviewer
from trellis_common.model import MeshService
from trellis_identity import jointoken
from trellis_identity.identity import csr_for, new_key
from trellis_runtime.events import Signals
from trellis_runtime.health import Health
from trellis_testing import RedisServer
from trellis_testing.waiting import eventually

from .conftest import issued

BOOKSTORE = MeshService("bookstore", "bookstore")


async def test_concurrent_requests_on_both_replicas_get_one_service_certificate(
    pair: tuple[CertificateManager, CertificateManager],
) -> None:
    a, b = pair
    records = await asyncio.gather(
        *(replica.issue_service(BOOKSTORE) for _ in range(6) for replica in (a, b))
    )
    assert len({r.serial for r in records}) == 1  # 0 certificates issued twice
    assert issued(a, "service") + issued(b, "service") == 1


async def test_a_service_certificate_issued_on_one_replica_is_returned_by_the_other(
    pair: tuple[CertificateManager, CertificateManager],
) -> None:
    a, b = pair
    first = await a.issue_service(BOOKSTORE)
    again = await b.issue_service(BOOKSTORE)  # b held nothing: it reads the store
    assert again.serial == first.serial
    assert (await b.lookup(first.common_name)).serial == first.serial
    assert issued(b, "service") == 0


async def test_one_proxy_request_sent_to_both_replicas_gets_one_certificate(
    pair: tuple[CertificateManager, CertificateManager],
) -> None:
    a, b = pair
    key = proxy_key()
    proxy_id = "7f0c4a52-2f1e-4c0e-9a53-1b7a4f1d2c3e"
    records = await asyncio.gather(
        *(r.issue_proxy(BOOKSTORE, proxy_id, public_key=key) for r in (a, b, a, b))
    )
    assert len({r.serial for r in records}) == 1
    assert issued(a, "proxy") + issued(b, "proxy") == 1


async def test_one_renewal_sent_to_both_replicas_renews_once(
    pair: tuple[CertificateManager, CertificateManager],
) -> None:
    a, b = pair
    proxy = await a.issue_proxy(BOOKSTORE, public_key=proxy_key())
    renewal = Renewal(proxy.serial, proxy_key())
    outcomes = await asyncio.gather(
        a.rotate(proxy.common_name, "renewed", renewal),
        b.rotate(proxy.common_name, "renewed", renewal),
        return_exceptions=True,
    )
    renewed = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(renewed) == 1, outcomes
    assert [type(o) for o in outcomes if isinstance(o, BaseException)] == [StaleCertificate]
    assert issued(a, "proxy") + issued(b, "proxy") == 2  # the first one, and its renewal


async def test_one_pod_enrollment_sent_to_both_replicas_gets_one_certificate(
    pair: tuple[CertificateManager, CertificateManager], kube: tuple[Any, Any]
) -> None:
    """The pod's agent enrolls once (one bound token, one CSR), and proxy-cp's call reaches
    both replicas: the API server reviews the token twice, one certificate is issued."""
    core: Any = k8s.CoreV1Api(kube[1])
    core.create_namespaced_service_account("shop", {"metadata": {"name": "web"}})
    pod = core.create_namespaced_pod(
        "shop",
        {
            "metadata": {"name": "web-0"},
            "spec": {"serviceAccountName": "web", "containers": [{"name": "app", "image": "a"}]},
        },
    )
    ref = {"kind": "Pod", "apiVersion": "v1", "name": "web-0", "uid": pod.metadata.uid}
    token = core.create_namespaced_service_account_token(
        "web", "shop", {"spec": {"audiences": ["trellis"], "boundObjectRef": ref}}
    ).status.token
    reviewer = ServiceAccountReviewer(kube[1], "trellis", "trellis-system")
    _, key = new_key()
    csr = csr_for(key, "web")
    enrollments = [ProxyEnrollment(r, reviewer, CollectorRegistry()) for r in pair]
    enrolled = await asyncio.gather(*(e.enroll(token, csr, "web") for e in enrollments))
    assert len({e.proxy.serial for e in enrolled}) == 1
    assert enrolled[0].proxy.proxy_id == pod.metadata.uid
    assert sum(issued(r, "proxy") for r in pair) == 1
    assert signed_for(enrolled[0].proxy.cert_chain_pem, key.public_key())  # the pod's key


async def test_a_join_token_sent_to_both_replicas_works_once(
    pair: tuple[CertificateManager, CertificateManager],
    clients: tuple[redis.asyncio.Redis, redis.asyncio.Redis],
) -> None:
    join_key = secrets.token_bytes(32)
    token = jointoken.mint(join_key, "catalog")  # spent in Redis until it expires (wall time)

    def issuer_of(replica: CertificateManager, client: redis.asyncio.Redis) -> ComponentIssuer:
        return ComponentIssuer(
            lambda: replica.issuer,
            client,
            join_key,
            dt.timedelta(days=1),
            CollectorRegistry(),
            utcnow,
            certs=ComponentCertificates(client, utcnow),
        )

    issuers = [issuer_of(r, c) for r, c in zip(pair, clients, strict=True)]
    _, key = new_key()
    csr = csr_for(key, "catalog")
    outcomes = await asyncio.gather(
        *(i.join(token, csr, "127.0.0.1") for i in issuers), return_exceptions=True
    )
    refused = [o for o in outcomes if isinstance(o, JoinRefused)]
    assert [r.reason for r in refused] == ["spent"], outcomes
    assert len(outcomes) - len(refused) == 1  # the other one joined


async def test_a_revocation_on_one_replica_is_seen_by_the_other_and_by_a_fresh_one(
    pair: tuple[CertificateManager, CertificateManager],
    clients: tuple[redis.asyncio.Redis, redis.asyncio.Redis],
    make_replica: Callable[..., CertificateManager],
) -> None:
    a, b = pair
    proxy = await a.issue_proxy(BOOKSTORE, public_key=proxy_key())
    assert (await b.lookup(proxy.common_name)).serial == proxy.serial  # b serves it too
    await a.revoke(proxy.common_name)
    # b has had no signal: what proxy-cp asks it is read from the store
    assert [r.serial for r in await b.revocations.current(proxy.common_name)] == [proxy.serial]
    fresh = make_replica(clients[1], "certmanager-c")
    await fresh.start()
    assert proxy.serial in fresh.revocations


async def test_a_replica_follows_the_other_replica_s_signals(
    pair: tuple[CertificateManager, CertificateManager],
    redis_server: RedisServer,
) -> None:
    a, b = pair
    health = Health()
    signals = Signals(redis_server.target("certmanager"), health, client="certmanager")
    follower = signals.follow(ReplicaFollower(b))
    stop = asyncio.Event()
    running = asyncio.create_task(signals.run(stop))
    try:
        await asyncio.wait_for(follower.synced.wait(), timeout=10)
        service = await a.issue_service(BOOKSTORE)
        proxy = await a.issue_proxy(BOOKSTORE, public_key=proxy_key())
        await eventually(lambda: proxy.common_name in {r.common_name for r in b.list()})
        assert b.peek(service.common_name).serial == service.serial  # from memory
        rotated = await a.rotate(service.common_name)
        await eventually(lambda: b.peek(service.common_name).serial == rotated.serial)
        await a.revoke(proxy.common_name)
        # the revocation and the record's removal reach the replica as two signals, so the
        # one may be seen a moment before the other: both must come
        await eventually(lambda: proxy.serial in b.revocations)
        await eventually(lambda: proxy.common_name not in {r.common_name for r in b.list()})
    finally:
        stop.set()
        await running


async def test_a_resync_from_a_store_that_lost_its_data_keeps_what_memory_holds(
    manager: CertificateManager, store: InMemoryCertificateStore
) -> None:
    """Redis came back empty: the signals resync, and consumers look records up, before the
    store guard refills it from memory; neither may empty memory first."""
    record = await manager.issue_service(BOOKSTORE)
    proxy = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    await manager.revoke(proxy.common_name)
    store.ca, store.records, store.revoked = None, {}, {}
    await manager.reload()
    assert (await manager.lookup(record.common_name)).serial == record.serial
    assert [r.serial for r in await manager.revocations.current()] == [proxy.serial]
    assert await manager.restore_if_lost()
    assert store.records == {record.common_name: record}
    assert list(store.revoked) == [proxy.serial]  # no revocation lost


async def test_a_signal_read_while_the_store_is_refilled_drops_nothing(
    manager: CertificateManager, store: InMemoryCertificateStore
) -> None:
    """A signal of the record (this replica's own ``issued``) is read from a wiped store just
    before the store guard puts the CA back: it must not drop the record from memory, or
    the refill that follows writes the store back without it (CI saw a restarted
    certmanager list no certificates)."""
    record = await manager.issue_service(BOOKSTORE)
    store.ca, store.records = None, {}
    read, release = asyncio.Event(), asyncio.Event()
    get = store.get

    async def slow_get(common_name: str) -> Any:
        found = await get(common_name)
        read.set()
        await release.wait()
        return found

    store.get = slow_get  # type: ignore[method-assign]
    refresh = asyncio.create_task(manager.refresh(record.common_name))
    await read.wait()  # the refresh read "nothing" from the wiped store
    restore = asyncio.create_task(manager.restore_if_lost())
    for _ in range(20):  # the in-memory store never waits: let the restore run if it may
        await asyncio.sleep(0)
    release.set()
    await refresh
    assert await restore
    assert manager.peek(record.common_name).serial == record.serial
    assert store.records == {record.common_name: record}


async def test_a_component_certificate_issued_on_one_replica_is_revoked_by_the_other(
    clients: tuple[redis.asyncio.Redis, redis.asyncio.Redis],
) -> None:
    a, b = (ComponentCertificates(c, utcnow) for c in clients)
    await asyncio.gather(a.load(), b.load())
    not_after = utcnow() + dt.timedelta(hours=1)
    await a.issued_now("catalog", 0xC0FFEE, not_after)  # b holds nothing of it
    [revoked] = await b.revoke("catalog")  # read again first: b revokes what a issued
    assert revoked.serial == "c0ffee"
    assert [c.serial for c in await a.current_revoked()] == ["c0ffee"]
    assert a.is_revoked("c0ffee")  # a's authorizer refuses it from now on

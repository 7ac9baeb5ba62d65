"""The catalog among real processes: Redis, certmanager, endpoints-vm, catalog."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from trellis_api import catalog_pb2, catalog_pb2_grpc, certmanager_pb2, certmanager_pb2_grpc
from trellis_identity.identity import csr_for, new_key
from trellis_testing import RedisServer, eventually
from trellis_testing import services as service_processes
from trellis_testing.services import ServiceProcess, trellis

PROXY_CSR = csr_for(new_key()[1], "a proxy")  # a proxy made its key; certmanager signs it

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FAST = {"TRELLIS_REGISTRY_TTL": "1"}


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    path = tmp_path / "spec"
    shutil.copytree(ROOT / "examples" / "bookstore", path)
    return path


@pytest.fixture
def mesh(
    state_dir: Path, redis_server: RedisServer, spec_dir: Path
) -> Iterator[dict[str, ServiceProcess]]:
    def process(name: str, module: str, *args: str, **env: str) -> ServiceProcess:
        return ServiceProcess(name, module, state_dir, redis_server, args=args, env={**FAST, **env})

    processes = {
        "certmanager": process("certmanager", "trellis_certmanager.main"),
        "endpoints-vm": process(
            "endpoints-vm",
            "trellis_endpoints_vm.main",
            TRELLIS_ENDPOINTS_VM_REGISTRY_TTL="1",
        ),
        "catalog": process(
            "catalog",
            "trellis_catalog.main",
            "--spec-dir",
            str(spec_dir),
            TRELLIS_CATALOG_SPEC_POLL_INTERVAL="0.1",
            TRELLIS_CATALOG_DISCOVERY_INTERVAL="0.2",
            TRELLIS_CATALOG_PROVIDER_GRACE="2",
        ),
    }
    with service_processes.running(processes):
        yield processes


def register(state_dir: Path, name: str, service: str, port: int) -> None:
    done = trellis(
        state_dir,
        "vm",
        "register",
        "-n",
        "bookstore",
        "--name",
        name,
        "--service",
        service,
        "--address",
        "127.0.0.1",
        "--port",
        f"http={port}",
        "--service-account",
        "bookstore",
    )
    assert done.returncode == 0, done.stderr


def view(catalog: ServiceProcess, identity: str) -> dict[str, Any]:
    body: dict[str, Any] = catalog.get(f"/v1/views/{identity}").json()
    return body


def split_weights(body: dict[str, Any]) -> dict[str, int]:
    root = next(o for o in body.get("outbound", []) if o["name"] == "bookstore")
    return {c["cluster"]: c["weight"] for c in root["routes"][0]["clusters"]}


def endpoints(body: dict[str, Any], cluster: str) -> list[str]:
    found: dict[str, Any] = next((c for c in body.get("clusters", []) if c["name"] == cluster), {})
    return [f"{e['address']}:{e['port']}" for e in found.get("endpoints", [])]


async def onboard(certmanager: ServiceProcess, service: str, account: str) -> str:
    """What the injector does: issue a proxy certificate (the catalog then expects it)."""
    async with certmanager.channel("injector") as channel:
        stub = certmanager_pb2_grpc.CertificateManagerStub(channel)
        issued = await stub.IssueCertificate(
            certmanager_pb2.IssueCertificateRequest(
                kind=certmanager_pb2.CERTIFICATE_KIND_PROXY,
                service=certmanager_pb2.MeshService(namespace=service, name=service),
                service_account=account,
                csr_pem=PROXY_CSR,
            )
        )
    return issued.info.common_name


async def test_views_follow_providers_policies_and_certificates(
    mesh: dict[str, ServiceProcess], state_dir: Path, spec_dir: Path
) -> None:
    catalog, certmanager, provider = mesh["catalog"], mesh["certmanager"], mesh["endpoints-vm"]
    cn = await onboard(certmanager, "bookbuyer", "bookbuyer")
    register(state_dir, "v1-a", "bookstore-v1", 8081)
    register(state_dir, "v2-a", "bookstore-v2", 8082)
    v1, v2 = "bookstore/bookstore-v1|14001", "bookstore/bookstore-v2|14001"

    await eventually(
        lambda: endpoints(view(catalog, "bookbuyer/bookbuyer"), v2) == ["127.0.0.1:8082"],
        timeout=10,
        message="provider endpoints reach the view",
    )
    body = view(catalog, "bookbuyer/bookbuyer")
    assert split_weights(body) == {v1: 80, v2: 20}
    assert body["service_account"] == "bookbuyer"

    # the proxy certificate made the catalog expect bookbuyer and have its service
    # certificate issued (certmanager keeps it; proxy-cp takes it from there)
    def service_certificate() -> dict[str, Any] | None:
        listed = trellis(state_dir, "certs", "list", "--kind", "service", "--json").stdout
        found = [c for c in json.loads(listed)["certificates"] if c["service"] == "bookbuyer"]
        return found[-1] if found else None

    await eventually(lambda: service_certificate() is not None, timeout=10)
    record = service_certificate()
    assert record is not None
    serial = record["serial"]
    lifetime = datetime.fromisoformat(record["not_after"]) - datetime.fromisoformat(
        record["not_before"]
    )
    # MeshConfig (examples/bookstore) sets serviceCertValidityDuration: 24h, jitter 10 %
    assert timedelta(hours=21) < lifetime < timedelta(hours=27)
    proxies = catalog.get("/v1/proxies").json()["proxies"]
    assert [p["common_name"] for p in proxies] == [cn]
    rotated = trellis(state_dir, "certs", "rotate", "bookbuyer.bookbuyer.svc.cluster.local")
    assert rotated.returncode == 0, rotated.stderr
    await eventually(
        lambda: (service_certificate() or {}).get("serial") != serial,
        timeout=10,
        message="a rotation reissues it",
    )

    # a live edit of the weights
    split = spec_dir / "traffic-split.yaml"
    split.write_text(
        split.read_text().replace("weight: 80", "weight: 50").replace("weight: 20", "weight: 50")
    )
    await eventually(
        lambda: split_weights(view(catalog, "bookbuyer/bookbuyer")) == {v1: 50, v2: 50},
        timeout=10,
        message="weights follow the file",
    )

    # the provider dies: its endpoints stay for the grace period (2 s here), then leave;
    # it comes back with its registrations
    provider.kill()
    status = catalog.get("/v1/status").json()
    await eventually(
        lambda: catalog.get("/readyz").json()["reasons"],
        timeout=10,
        message="readyz names the provider's stream while it is down",
    )
    assert endpoints(view(catalog, "bookbuyer/bookbuyer"), v1) == ["127.0.0.1:8081"], status
    await eventually(
        lambda: endpoints(view(catalog, "bookbuyer/bookbuyer"), v1) == [],
        timeout=15,
        message="a dead provider drops out after its grace",
    )
    provider.start()
    await eventually(
        lambda: endpoints(view(catalog, "bookbuyer/bookbuyer"), v1) == ["127.0.0.1:8081"],
        timeout=15,
        message="a provider that comes back joins again",
    )

    # the catalog itself restarts: expected proxies come back from certmanager's records
    catalog.kill()
    catalog.start()
    await eventually(
        lambda: catalog.get("/v1/proxies").json()["proxies"] != [],
        timeout=10,
        message="expected proxies are durable",
    )
    await eventually(
        lambda: endpoints(view(catalog, "bookbuyer/bookbuyer"), v1) == ["127.0.0.1:8081"],
        timeout=15,
    )


async def test_a_watch_hears_each_flush_and_the_policy_cli(
    mesh: dict[str, ServiceProcess], state_dir: Path, spec_dir: Path
) -> None:
    """proxy-cp's watch of the catalog (WatchChanges) over mTLS, as proxy-cp: everything
    first, then a registration's flush, with the moved destination inline."""
    catalog = mesh["catalog"]
    async with catalog.channel("proxy-cp") as channel:
        stub = catalog_pb2_grpc.CatalogStub(channel)
        watch = stub.WatchChanges(catalog_pb2.ListChangesRequest())
        try:
            before = await asyncio.wait_for(watch.read(), 10)
            assert isinstance(before, catalog_pb2.ListChangesResponse)
            assert before.full
            register(state_dir, "v1-a", "bookstore-v1", 8081)
            wanted = {"destination/bookstore/bookstore-v1", "policy/bookstore/bookstore-v1"}
            moved: dict[str, str] = {}
            inline: dict[str, str] = {}
            answers: list[catalog_pb2.ListChangesResponse] = []
            async with asyncio.timeout(10):
                while not wanted <= set(moved):  # one flush, or a few as inputs arrive
                    answer = await watch.read()
                    assert isinstance(answer, catalog_pb2.ListChangesResponse)
                    answers.append(answer)
                    moved |= {c.name: c.version for c in answer.changes}
                    inline |= {r.name: r.version for r in answer.resources}
        finally:
            watch.cancel()
        # each answer is what moved since the one before, after the first (full) one
        cursors = [before.cursor] + [a.cursor for a in answers]
        epoch = before.cursor.rpartition("-")[0]
        assert all(c.rpartition("-")[0] == epoch for c in cursors)
        revisions = [int(c.rpartition("-")[2]) for c in cursors]
        assert revisions == sorted(set(revisions))
        assert not any(a.full for a in answers)
        # bookstore-v1's first endpoint: its destination moved (and its own policy: a
        # service with endpoints is reachable), each listed with its new version
        assert all(moved[n] for n in wanted), moved
        destination = "destination/bookstore/bookstore-v1"
        assert inline[destination] == moved[destination]  # inline, at the listed version
        assert not [n for n in inline if n.startswith("policy/")]  # policies are fetched
        allowed = await stub.CheckPolicy(
            catalog_pb2.CheckPolicyRequest(
                source_namespace="bookbuyer",
                source_service_account="bookbuyer",
                destination_namespace="bookstore",
                destination_service="bookstore",
            )
        )
        assert allowed.allowed

    ok = await asyncio.to_thread(
        trellis,
        state_dir,
        "policy",
        "check",
        "--from",
        "bookbuyer/bookbuyer",
        "--to",
        "bookstore/bookstore",
    )
    assert ok.returncode == 0, ok.stderr
    assert "allowed" in ok.stdout
    denied = await asyncio.to_thread(
        trellis,
        state_dir,
        "policy",
        "check",
        "--from",
        "bookthief/bookthief",
        "--to",
        "bookstore/bookstore-v1",
    )
    assert denied.returncode == 1
    assert "no TrafficTarget" in denied.stdout

    (spec_dir / "broken.yaml").write_text(
        "apiVersion: split.smi-spec.io/v1alpha2\nkind: TrafficSplit\n"
        "metadata: {name: bad, namespace: bookstore}\n"
        "spec: {service: bookstore, backends: [{service: bookstore-v1, weight: -1}]}\n"
    )

    def error_listed() -> bool:
        listed = trellis(state_dir, "spec", "list", "--state", "error", "--json")
        return "broken.yaml" in listed.stdout and "spec.backends[0].weight" in listed.stdout

    await eventually(error_listed, timeout=10, interval=0.3, message="the bad document is listed")
    # the good split is still in force
    assert split_weights(view(catalog, "bookbuyer/bookbuyer")) != {}


async def test_a_service_whose_proxies_run_under_two_accounts_is_listed_not_flipped(
    mesh: dict[str, ServiceProcess], state_dir: Path
) -> None:
    """The earliest proxy's account stays the service's (its policy and SPIFFE id); a later
    proxy under another account is shown by `trellis spec list` and `trellis status`."""
    await onboard(mesh["certmanager"], "bookbuyer", "bookbuyer")
    await onboard(mesh["certmanager"], "bookbuyer", "bookthief")

    def listed() -> list[dict[str, Any]]:
        done = trellis(state_dir, "spec", "list", "--state", "warning", "--json")
        assert done.returncode == 0, done.stderr
        return [r for r in json.loads(done.stdout)["resources"] if r["kind"] == "Service"]

    await eventually(lambda: listed(), timeout=15, message="the conflict listed")
    [conflict] = listed()
    assert (conflict["namespace"], conflict["name"]) == ("bookbuyer", "bookbuyer")
    assert conflict["field"] == "proxies.serviceAccount"
    assert "run as bookbuyer (established" in conflict["reason"]
    assert "bookthief (refused by peers)" in conflict["reason"]
    table = trellis(state_dir, "spec", "list")
    assert "proxies.serviceAccount" in table.stdout
    status = trellis(state_dir, "status")
    assert "proxy-account" in status.stdout
    assert view(mesh["catalog"], "bookbuyer/bookbuyer")["spiffe_id"].endswith("/sa/bookbuyer")

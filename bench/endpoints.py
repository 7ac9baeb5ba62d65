"""Registrations against a real endpoints-vm, and how soon a consumer sees each.

The requirement: register 10,000 workloads across 1,000 services, report registrations per
second and the time from a registration to a consumer knowing of it (median, p99). So this
runs the whole path, as an operator's agents and the catalog would: a real
``redis-server`` (AOF, fsync on every write, like a Redis with persistence),
``endpoints-vm`` as its own process, and in this process a consumer as the catalog follows
a provider (one ``WatchServices`` stream over gRPC, as the catalog's identity:
:class:`bench.load.Consumer`) and ``POST /v1/workloads`` calls over keep-alive
connections, :data:`CONCURRENCY` in flight.
Workload ``i`` is ``bench/w-{i}`` at a unique ``10.x.y.z`` in service
``svc-{i % services}``, port ``http=8080``.

For each registration the POST's send time is kept; the consumer notes when a watch
answer first lists the workload's address. Both clocks are this process's
``perf_counter``, so the latency is POST sent → the answer received and parsed, and
includes this event loop's own delays (the consumer shares it with the HTTP clients). A
burst of changes to one service while an answer is being written goes out in the next
answer, once.

Two floors and a reference, each run over the same workload indices as the
registrations, in :data:`ROUNDS` interleaved rounds (registrations, then each of them):

* ``hset_publish``: HSET of a workload record plus PUBLISH of an event, from this process
  with ``redis.asyncio`` to the same Redis, as many in flight: the floor of "durably store
  and announce";
* ``bare_http``: a bare FastAPI POST route parsing the same body, in its own process
  (:mod:`bench.http_floor`), as many in flight: the floor of HTTP and JSON;
* ``serial_store_announce``: the manager's own Redis calls (HSET, then
  :meth:`~trellis_runtime.signaling.Publisher.publish`), one at a time: a reference, not a
  floor (the manager writes one at a time under its lock, and signals one at a time in
  order, but the two overlap).

The scale is fixed work, not fixed time: the full run (``--seconds 2``, the default) is
10,000 workloads over 1,000 services; shorter runs scale both by ``(seconds / 2) ** 2``, so
``--seconds 0.5`` is a quick check (625 workloads over 62 services). The environment
variables ``TRELLIS_BENCH_WORKLOADS``, ``TRELLIS_BENCH_SERVICES`` and
``TRELLIS_BENCH_CONCURRENCY`` override the scale. ``--warmup`` seconds of registrations (in
another namespace, deregistered afterwards) and of each floor run first. At the end one
``GET /v1/services`` and one gRPC ``ListServices`` of the whole registry are timed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench import http_floor, load, report
from trellis_api import endpoints_pb2 as pb
from trellis_api import endpoints_pb2_grpc as pb_grpc
from trellis_common import components
from trellis_identity import tokens
from trellis_runtime import redisconn, signaling
from trellis_runtime.grpcserver import DEFAULT_OPTIONS
from trellis_testing.identities import join_as
from trellis_testing.redis_server import RedisServer
from trellis_testing.services import ServiceProcess

WORKLOADS = 10_000
SERVICES = 1_000
CONCURRENCY = 8
FULL_SCALE_SECONDS = 2.0  # --seconds at which the full WORKLOADS/SERVICES run
MIN_WORKLOADS = 50
ROUNDS = report.ROUNDS
NAMESPACE = "bench"
EVENT_TIMEOUT = 60.0  # seconds to wait for the consumer to see the last of a round
FLOOR_KEY = "bench:floor:workloads"
FLOOR_CHANNEL = "bench:floor:events"
FLOOR_PREFIX = "bench-floor"  # serial_store_announce's Publisher: bench-floor:rev:endpoints
GRPC_OPTIONS = [("grpc.max_receive_message_length", 256 * 1024 * 1024)]


@dataclass(frozen=True, slots=True)
class Scale:
    workloads: int
    services: int
    concurrency: int

    @classmethod
    def from_env(cls, seconds: float, env: Mapping[str, str] = os.environ) -> Scale:
        factor = min(1.0, seconds / FULL_SCALE_SECONDS) ** 2  # --seconds 0.5: 1/16
        workloads = _env_int(env, "TRELLIS_BENCH_WORKLOADS") or max(
            MIN_WORKLOADS, round(WORKLOADS * factor)
        )
        services = _env_int(env, "TRELLIS_BENCH_SERVICES") or max(
            1, round(workloads * SERVICES / WORKLOADS)
        )
        concurrency = _env_int(env, "TRELLIS_BENCH_CONCURRENCY") or CONCURRENCY
        return cls(workloads, min(services, workloads), concurrency)


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {text!r}")
    return int(text)


def run(*, seconds: float = 2.0, warmup: float = 0.2) -> dict[str, float]:
    scale = Scale.from_env(seconds)
    load.fail_fast_sniffio_import()
    started = time.perf_counter()
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="trellis-bench-")))
        redis_server = stack.enter_context(RedisServer(dir=tmp / "redis"))
        # endpoints-vm joins the mesh through certmanager: its mTLS identity, its admin TLS
        certmanager = stack.enter_context(
            ServiceProcess("certmanager", "trellis_certmanager.main", tmp, redis_server)
        )
        certmanager.start()
        service = stack.enter_context(
            ServiceProcess("endpoints-vm", "trellis_endpoints_vm.main", tmp, redis_server)
        )
        service.start()
        floor = stack.enter_context(http_floor.HttpFloor())
        token = tokens.token_path(tmp).read_text().strip()
        try:
            measured = asyncio.run(
                _measure(scale, service, token, redis_server.url, floor.url, warmup)
            )
        except Exception:
            # The state directory goes with the run: show why the service failed, if it did.
            print(f"endpoints-vm log, last lines:\n{service.logs()[-3000:]}", file=sys.stderr)
            raise
    figures, ratios = _report(scale, measured)
    print(f"  (the whole run took {time.perf_counter() - started:.1f} s, start-up included)")
    return report.results(figures, ratios)


@dataclass(frozen=True, slots=True)
class Measured:
    rates: dict[str, float]
    watch_latencies: list[float]
    resyncs: int  # the consumer's listings after the first (a watch opened again)
    round_trips: list[float]
    service_cpu: float | None  # seconds of CPU the service spent on the registrations
    list_rest: float
    list_rest_bytes: int
    list_grpc: float


async def _measure(
    scale: Scale,
    process: ServiceProcess,
    token: str,
    redis_url: str,
    floor_url: str,
    warmup: float,
) -> Measured:
    limits = httpx.Limits(
        max_connections=scale.concurrency, max_keepalive_connections=scale.concurrency
    )
    endpoint = process.endpoint
    async with AsyncExitStack() as stack:
        # the catalog's identity: the one consumer of endpoints-vm's gRPC API
        identity = join_as(process.state_dir, components.CATALOG)
        channel = await stack.enter_async_context(
            identity.channel(
                endpoint.grpc_address, components.ENDPOINTS_VM, [*DEFAULT_OPTIONS, *GRPC_OPTIONS]
            )
        )
        stub = pb_grpc.EndpointsProviderStub(channel)
        consumer = await load.Consumer.start(stub, NAMESPACE)
        stack.push_async_callback(consumer.close)
        service = await stack.enter_async_context(
            process.async_client(
                headers={"Authorization": f"Bearer {token}"}, limits=limits, timeout=60
            )
        )
        bare = await stack.enter_async_context(
            httpx.AsyncClient(base_url=floor_url, limits=limits, timeout=60)
        )
        redis = redisconn.connect(redis_url)
        stack.push_async_callback(redis.aclose)

        publisher = signaling.Publisher(redis, sender="bench", prefix=FLOOR_PREFIX)
        sent: dict[str, float] = {}
        round_trips: list[float] = []

        async def register(i: int) -> None:
            body = load.registration(NAMESPACE, i, scale.services)
            start = time.perf_counter()
            response = await service.post("/v1/workloads", json=body)
            round_trips.append(time.perf_counter() - start)
            load.expect_status(response, 201)
            sent[body["address"]] = start

        async def hset_publish(i: int) -> None:
            body = load.registration(NAMESPACE, i, scale.services)
            await redis.hset(FLOOR_KEY, f"{NAMESPACE}/{body['name']}", _record(body))
            event = {"topic": "endpoints", "kind": "changed", "key": body["services"][0]}
            await redis.publish(FLOOR_CHANNEL, json.dumps(event, separators=(",", ":")))

        async def store_announce(i: int) -> None:
            body = load.registration(NAMESPACE, i, scale.services)
            await redis.hset(FLOOR_KEY, f"{NAMESPACE}/{body['name']}", _record(body))
            await publisher.publish("endpoints", "changed", f"{NAMESPACE}/{body['services'][0]}")

        async def bare_http(i: int) -> None:
            response = await bare.post(
                "/v1/workloads", json=load.registration(NAMESPACE, i, scale.services)
            )
            load.expect_status(response, 201)

        floors: dict[str, tuple[load.IndexedOp, int]] = {
            "hset_publish": (hset_publish, scale.concurrency),
            "serial_store_announce": (store_announce, 1),
            "bare_http": (bare_http, scale.concurrency),
        }
        await load.warm_up(service, scale.concurrency, warmup)
        for op, concurrency in floors.values():
            await load.for_seconds(op, concurrency, warmup)

        pid = endpoint.pid
        elapsed = dict.fromkeys(("registrations", *floors), 0.0)
        cpu: float | None = 0.0
        for r in range(ROUNDS):
            chunk = range(scale.workloads * r // ROUNDS, scale.workloads * (r + 1) // ROUNDS)
            consumer.expect(load.address(i) for i in chunk)
            cpu_before = load.cpu_seconds(pid)
            elapsed["registrations"] += await load.in_flight(register, chunk, scale.concurrency)
            await consumer.wait(EVENT_TIMEOUT)
            cpu_after = load.cpu_seconds(pid)
            if cpu is None or cpu_before is None or cpu_after is None:
                cpu = None
            else:
                cpu += cpu_after - cpu_before
            for name, (op, concurrency) in floors.items():
                elapsed[name] += await load.in_flight(op, chunk, concurrency)
        latencies = [consumer.first_seen[address] - at for address, at in sent.items()]

        start = time.perf_counter()
        response = await service.get("/v1/services")
        list_rest = time.perf_counter() - start
        load.expect_status(response, 200)
        load.check_listing(response.json()["services"], scale.workloads, scale.services)
        start = time.perf_counter()
        listing = await stub.ListServices(pb.ListServicesRequest(), timeout=120)
        list_grpc = time.perf_counter() - start
        load.check_listing(
            [{"endpoints": s.endpoints} for s in listing.services], scale.workloads, scale.services
        )
        return Measured(
            rates={name: scale.workloads / seconds for name, seconds in elapsed.items()},
            watch_latencies=latencies,
            resyncs=consumer.resyncs,
            round_trips=round_trips,
            service_cpu=cpu,
            list_rest=list_rest,
            list_rest_bytes=len(response.content),
            list_grpc=list_grpc,
        )


def _record(body: dict[str, object]) -> str:
    """A stored record the size of the store's (the body and two timestamps)."""
    now = time.time()
    return json.dumps({**body, "registered_at": now, "last_heartbeat": now}, separators=(",", ":"))


def _report(scale: Scale, m: Measured) -> tuple[list[report.Figure], dict[str, float]]:
    ms = 1000.0
    registrations = report.Figure(
        "registrations",
        m.rates["registrations"],
        "registrations/s",
        f"POST /v1/workloads to endpoints-vm, {scale.concurrency} in flight",
    )
    hset_publish = report.Figure(
        "hset_publish",
        m.rates["hset_publish"],
        "ops/s",
        f"floor: HSET + PUBLISH to the same Redis, {scale.concurrency} in flight",
    )
    serial = report.Figure(
        "serial_store_announce",
        m.rates["serial_store_announce"],
        "ops/s",
        "reference: HSET + Publisher.publish (the manager's Redis calls), 1 in flight",
    )
    bare_http = report.Figure(
        "bare_http",
        m.rates["bare_http"],
        "requests/s",
        f"floor: bare FastAPI POST of the same body, own process, {scale.concurrency} in flight",
    )
    figures = [
        registrations,
        report.Figure(
            "watch_p50",
            load.percentile(m.watch_latencies, 0.50) * ms,
            "ms",
            "POST sent -> the first WatchServices answer listing the address, median",
        ),
        report.Figure(
            "watch_p99",
            load.percentile(m.watch_latencies, 0.99) * ms,
            "ms",
            f"the same, p99 ({m.resyncs} watches opened again after the first)",
        ),
        report.Figure(
            "rest_p50", load.percentile(m.round_trips, 0.50) * ms, "ms", "POST round trip, median"
        ),
        report.Figure(
            "rest_p99", load.percentile(m.round_trips, 0.99) * ms, "ms", "POST round trip, p99"
        ),
    ]
    if m.service_cpu is not None:
        figures.append(
            report.Figure(
                "service_cpu",
                m.service_cpu / scale.workloads * 1e6,
                "us/registration",
                "CPU time of the endpoints-vm process (user + system)",
            )
        )
    figures += [
        hset_publish,
        serial,
        bare_http,
        report.Figure(
            "list_services_rest",
            m.list_rest * ms,
            "ms",
            f"one GET /v1/services: {scale.services:,} services, {scale.workloads:,} "
            f"endpoints, {m.list_rest_bytes / 1e3:,.0f} kB of JSON",
        ),
        report.Figure(
            "list_services_grpc", m.list_grpc * ms, "ms", "one ListServices over gRPC, the same"
        ),
    ]
    report.print_table(
        f"endpoints: {scale.workloads:,} workloads over {scale.services:,} services, "
        f"endpoints-vm and redis-server (AOF, fsync always) as real processes, "
        f"{ROUNDS} interleaved rounds",
        figures,
    )
    ratios = {
        "registrations/hset_publish": report.ratio_line(registrations, hset_publish),
        "registrations/bare_http": report.ratio_line(registrations, bare_http),
        "registrations/serial_store_announce": report.ratio_line(
            registrations, serial, "reference"
        ),
    }
    return figures, ratios

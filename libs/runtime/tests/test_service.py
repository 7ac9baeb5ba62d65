"""The service skeleton: bad settings end the process before it starts; a service's parts
are served (gRPC, admin app with its readiness and routes, registry record, supervised
components) until stop, and everything is taken down after."""

from __future__ import annotations

import asyncio
import platform
from importlib import metadata
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
import redis.asyncio
from prometheus_client.parser import text_string_to_metric_families

from trellis_common import statefile, version
from trellis_runtime import registry
from trellis_runtime.runtime import ServiceRuntime
from trellis_runtime.service import Parts, Service
from trellis_runtime.settings import ServiceSettings
from trellis_testing.identities import local_identity
from trellis_testing.redis_server import RedisServer
from trellis_testing.waiting import eventually


class DemoSettings(ServiceSettings):
    """A demo."""

    service_name: ClassVar[str] = "demo"


class Demo:
    """A service's own objects: a component that runs until stop, a readiness check, a route."""

    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.stopped = asyncio.Event()
        self.ready = asyncio.Event()
        self.runtime: ServiceRuntime | None = None

    async def run(self, stop: asyncio.Event) -> None:
        self.running.set()
        await stop.wait()
        self.stopped.set()

    async def build(self, runtime: ServiceRuntime, settings: DemoSettings) -> Parts:
        self.runtime = runtime
        runtime.identity = IDENTITY  # what joining (or certmanager itself) would give

        def routes(app: object) -> None:
            app.get("/v1/demo")(lambda: {"instance": settings.instance_name})  # type: ignore[attr-defined]

        return Parts(
            components={"demo loop": self.run},
            readiness={"demo": self.ready.is_set},
            routes=routes,
            attributes={"flavour": "plain"},
        )


IDENTITY = local_identity("catalog")


def demo_service(demo: Demo) -> Service[DemoSettings]:
    return Service(DemoSettings, "demo-kind", demo.build, joins=False)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TRELLIS_DEMO_GRPC_PORT", "TRELLIS_DEMO_ADMIN_PORT", "TRELLIS_LOG_FORMAT"):
        monkeypatch.delenv(name, raising=False)


def test_a_bad_flag_value_exits_2_with_one_line_naming_the_setting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = demo_service(Demo()).main(["--admin-port", "70000"])

    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith("trellis-demo: bad setting admin_port (--admin-port / ")
    assert "Traceback" not in err


def test_a_bad_environment_value_exits_2_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRELLIS_DEMO_GRPC_PORT", "many")

    assert demo_service(Demo()).main([]) == 2
    assert "grpc_port (--grpc-port / TRELLIS_DEMO_GRPC_PORT): " in capsys.readouterr().err


def test_help_and_unknown_flags_are_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    service = demo_service(Demo())

    assert service.main(["--help"]) == 0
    assert "--registry-ttl" in capsys.readouterr().out
    assert service.main(["--grcp-port", "1"]) == 2
    assert "unrecognized arguments: --grcp-port" in capsys.readouterr().err


async def test_serves_the_parts_until_stop_then_takes_everything_down(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis, tmp_path: Path
) -> None:
    demo = Demo()
    settings = DemoSettings(
        redis_url=redis_server.url, state_dir=tmp_path, instance="demo-1", admin_token="demo-t"
    )
    stop = asyncio.Event()
    serving = asyncio.create_task(demo_service(demo).serve(settings, stop))

    endpoint = await eventually(lambda: statefile.read_endpoint(tmp_path, "demo-1"))
    assert endpoint is not None
    await eventually(demo.running.is_set)
    assert endpoint.admin_url.startswith("https://")
    context = IDENTITY.client_ssl_context()
    context.check_hostname = False  # the address is 127.0.0.1; the chain is what is checked
    async with httpx.AsyncClient(base_url=endpoint.admin_url, verify=context) as client:
        not_ready = await client.get("/readyz")
        demo.ready.set()
        ready = await client.get("/readyz")
        anonymous = await client.get("/v1/demo")  # a listing: the admin token is needed
        own = await client.get("/v1/demo", headers={"Authorization": "Bearer demo-t"})
        status = (await client.get("/v1/status")).json()
        metrics = (await client.get("/metrics")).text
    records = await eventually(lambda: registry.discover(redis_client, "demo-kind"))
    stop.set()  # before any assertion: a failing one must not leave the service running
    await serving

    assert not_ready.status_code == 503
    assert ready.status_code == 200
    assert anonymous.status_code == 401
    assert own.json() == {"instance": "demo-1"}
    # the one version, in the status and as Prometheus' build-info convention
    assert status["version"] == version.version() == metadata.version("trellis-common")
    build = f'trellis_build_info{{component="demo",python="{platform.python_version()}",'
    assert f'{build}version="{version.version()}"}} 1.0' in metrics
    # the standard process and GC series, and this component's own certificate's expiry
    for series in ("process_cpu_seconds_total", "python_gc_objects_collected_total"):
        assert series in metrics
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
    }
    expiry = IDENTITY.material.leaf.not_valid_after_utc.timestamp()
    assert samples["trellis_component_certificate_expiration_timestamp_seconds"] == expiry
    assert [(r.name, dict(r.attributes)) for r in records] == [
        ("demo-1", {"flavour": "plain", "component": "demo"})
    ]
    assert records[0].grpc_address == endpoint.grpc_address
    assert demo.stopped.is_set()
    assert statefile.read_endpoint(tmp_path, "demo") is None
    assert await registry.discover(redis_client, "demo-kind") == []


async def test_a_build_that_gives_up_ends_the_service_without_serving(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async def give_up(runtime: ServiceRuntime, settings: DemoSettings) -> Parts | None:
        runtime.identity = IDENTITY
        runtime.locator("elsewhere")
        return None

    service = Service(DemoSettings, "demo-kind", give_up, joins=False)
    settings = DemoSettings(redis_url=redis_server.url, state_dir=tmp_path)

    await asyncio.wait_for(service.serve(settings, asyncio.Event()), timeout=10)

    assert statefile.read_endpoint(tmp_path, "demo") is None


async def test_a_build_that_fails_fails_the_service(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async def broken(runtime: ServiceRuntime, settings: DemoSettings) -> Parts:
        raise RuntimeError("no CA")

    service = Service(DemoSettings, "demo-kind", broken, joins=False)
    settings = DemoSettings(redis_url=redis_server.url, state_dir=tmp_path)

    with pytest.raises(RuntimeError, match="no CA"):
        await service.serve(settings, asyncio.Event())
    assert statefile.read_endpoint(tmp_path, "demo") is None


async def test_a_metrics_port_serves_only_metrics_over_plain_http(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """``--metrics-port``: what a Prometheus without a mesh certificate scrapes. The same
    series as the admin port's /metrics, and no other path, method or state."""
    import socket

    with socket.socket() as probe:  # a free port, so the test can name it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    demo = Demo()
    settings = DemoSettings(
        redis_url=redis_server.url,
        state_dir=tmp_path,
        instance="demo-m",
        admin_token="demo-t",
        metrics_port=port,
    )
    stop = asyncio.Event()
    serving = asyncio.create_task(demo_service(demo).serve(settings, stop))
    try:
        await eventually(demo.running.is_set)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            metrics = await client.get("/metrics")  # bound before serving: it waits
            head = await client.head("/metrics")
            other = await client.get("/v1/status")
            posted = await client.post("/metrics", content=b"x")
    finally:
        stop.set()
        await serving

    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain; version=")
    assert 'trellis_build_info{component="demo"' in metrics.text
    assert "process_cpu_seconds_total" in metrics.text
    assert (head.status_code, head.content) == (200, b"")
    assert (other.status_code, other.text) == (404, "only /metrics is served here\n")
    assert posted.status_code == 405


def test_a_metrics_port_out_of_range_is_a_bad_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo_service(Demo()).main(["--metrics-port", "70000"]) == 2
    assert "bad setting metrics_port (--metrics-port / " in capsys.readouterr().err

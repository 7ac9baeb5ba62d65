"""``bench/logtrace.py``: the lines of services' and Envoy's logs in one window, in order."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.bench.loader import bench_module

logtrace = bench_module("logtrace")

SERVICE = """\
ts=2026-11-28T09:00:00.000Z level=debug logger=x workload.registered workload=shop/a
not a log line
ts=2026-11-28T09:00:00.004Z level=debug logger=x signaling.published topic=endpoints
ts=2026-11-28T09:00:00.004Z level=debug logger=x something.else entirely
ts=2026-11-28T09:00:01.000Z level=info logger=x snapshot.set key=late
"""


def envoy(at: datetime, text: str) -> str:
    local = at.astimezone()  # Envoy writes the machine's local time
    return f"[{local:%Y-%m-%d %H:%M:%S}.{local.microsecond // 1000:03d}][7][debug][config] {text}"


def test_lines_of_the_window_in_order_with_their_source() -> None:
    start = datetime(2026, 11, 28, 9, 0, 0, tzinfo=UTC)
    logs = {
        "endpoints-vm": SERVICE,
        "envoy": "\n".join(
            [
                envoy(start.replace(microsecond=2000), "Received DeltaDiscoveryResponse"),
                envoy(start.replace(microsecond=3000), "transport socket match, socket default"),
            ]
        ),
    }
    found = logtrace.window(logs, start.timestamp(), start.timestamp() + 0.01, every=False)
    assert [(round((line.at - start.timestamp()) * 1000), line.source) for line in found] == [
        (0, "endpoints-vm"),
        (2, "envoy"),
        (4, "endpoints-vm"),
    ]
    assert found[1].text.endswith("Received DeltaDiscoveryResponse")
    every = logtrace.window(logs, start.timestamp(), start.timestamp() + 0.01, every=True)
    assert len(every) == 5  # the other event and Envoy's per-host note too; not the late one

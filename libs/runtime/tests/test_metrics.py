"""``MetricFactory``: metrics under the service's prefix, on the registry it was given."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from trellis_runtime.metrics import MetricFactory


def test_metrics_are_named_under_the_prefix_on_the_given_registry() -> None:
    registry = CollectorRegistry()
    make = MetricFactory(registry, "trellis_test")
    make.counter("things", "Things", "kind").labels(kind="a").inc(2)
    make.gauge("level", "Level").set(3)
    make.histogram("seconds", "Time", "kind", buckets=(0.1, 1.0)).labels(kind="b").observe(0.5)

    assert registry.get_sample_value("trellis_test_things_total", {"kind": "a"}) == 2
    assert registry.get_sample_value("trellis_test_level") == 3
    assert registry.get_sample_value("trellis_test_seconds_bucket", {"kind": "b", "le": "1.0"}) == 1
    assert registry.get_sample_value("trellis_test_seconds_bucket", {"kind": "b", "le": "0.1"}) == 0

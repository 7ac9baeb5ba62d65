"""``bench policy`` runs through the real control plane and reports both ratios."""

from __future__ import annotations

from bench import policy


def test_the_policy_benchmark_measures_each_change_against_a_whole_build() -> None:
    found = policy.run(seconds=0.05, warmup=0)
    for name in ("routes_change", "whole_routes_change", "rotation", "whole_rotation"):
        assert found[name] > 0, name
    assert found["routes_change/whole_routes_change"] > 0
    assert found["rotation/whole_rotation"] > 0

"""Per-edge figures from Envoy's admin statistics (the JSON shapes Envoy 1.40 answers)."""

from __future__ import annotations

from typing import Any

import pytest

from trellis_cli.meshedges import (
    DENIED,
    EdgeRates,
    Sample,
    cluster_tls,
    destination,
    read_stats,
)

V1 = "bookstore/bookstore-v1|14001"
V2 = "bookstore/bookstore-v2|14001"
TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"


def stats(
    clusters: dict[str, dict[str, int]],
    no_route: int = 0,
    latency: dict[str, tuple[float | None, float | None]] | None = None,
) -> dict[str, Any]:
    """``/stats?format=json`` as Envoy writes it: counters, then one histograms entry whose
    quantile values are {interval, cumulative} in the order of ``supported_quantiles``."""
    found: list[dict[str, Any]] = [
        {"name": f"cluster.{cluster}.{stat}", "value": value}
        for cluster, counters in clusters.items()
        for stat, value in counters.items()
    ]
    found.append({"name": "http.outbound.no_route", "value": no_route})
    # the same counter under the cluster's "external." prefix must not count twice
    found += [{"name": f"cluster.{c}.external.upstream_rq_2xx", "value": 10**6} for c in clusters]
    supported = [0, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 100]
    computed = []
    for cluster, (p50, p99) in (latency or {}).items():
        values = [{"interval": None, "cumulative": 1.0} for _ in supported]
        values[2] = {"interval": p50, "cumulative": 1.0}
        values[6] = {"interval": p99, "cumulative": 1.0}
        computed.append({"name": f"cluster.{cluster}.upstream_rq_time", "values": values})
        computed.append({"name": f"cluster.{cluster}.external.upstream_rq_time", "values": []})
    found.append({"histograms": {"supported_quantiles": supported, "computed_quantiles": computed}})
    return {"stats": found}


def counters(total: int, ok: int, denied: int = 0, errors: int = 0) -> dict[str, int]:
    return {
        "upstream_rq_total": total,
        "upstream_rq_completed": ok + denied + errors,
        "upstream_rq_2xx": ok,
        "upstream_rq_403": denied,
        "upstream_rq_4xx": denied,
        "upstream_rq_5xx": errors,
    }


def sample(body: dict[str, Any], identity: str = "bookbuyer/bookbuyer", url: str = "a") -> Sample:
    return Sample(url, identity, read_stats(body), {V1: "mtls", V2: "mtls"})


def test_a_cluster_of_a_service_leads_to_it_and_the_meshs_own_lead_nowhere() -> None:
    assert destination(V1) == "bookstore/bookstore-v1"
    for own in ("trellis-xds", "inbound|15113", "egress", "trellis-admin"):
        assert destination(own) is None


def test_counters_and_interval_quantiles_are_read_per_cluster() -> None:
    read = read_stats(stats({V1: counters(10, 9, 1)}, no_route=4, latency={V1: (1.5, 9.0)}))
    assert read.no_route == 4
    assert read.clusters[V1].counters["upstream_rq_2xx"] == 9  # not the external. one
    assert (read.clusters[V1].p50, read.clusters[V1].p99) == (1.5, 9.0)


def test_a_quantile_with_no_request_in_the_interval_is_unknown() -> None:
    read = read_stats(stats({V1: counters(1, 1)}, latency={V1: (None, float("nan"))}))
    assert (read.clusters[V1].p50, read.clusters[V1].p99) == (None, None)


def test_rates_are_the_growth_between_two_scrapes() -> None:
    rates = EdgeRates()
    first = rates.update([sample(stats({V1: counters(100, 100), V2: counters(20, 20)}))], 10.0)
    assert [(e.destination, e.rps, e.success_rate) for e in first] == [
        ("bookstore/bookstore-v1", None, None),
        ("bookstore/bookstore-v2", None, None),
    ]  # one scrape: totals, no rate yet
    assert first[0].requests == 100
    body = stats(
        {V1: counters(180, 176, denied=2, errors=2), V2: counters(20, 20)},
        latency={V1: (1.0, 7.0)},
    )
    second = {e.destination: e for e in rates.update([sample(body)], 12.0)}
    v1 = second["bookstore/bookstore-v1"]
    assert v1.rps == pytest.approx(40.0)
    assert v1.denied_rps == pytest.approx(1.0)
    assert v1.failed_rps == pytest.approx(1.0)
    assert v1.success_rate == pytest.approx(76 / 80)
    assert (v1.p50_ms, v1.p99_ms, v1.as_json()["mtls"]) == (1.0, 7.0, True)
    idle = second["bookstore/bookstore-v2"]
    assert (idle.rps, idle.success_rate) == (0.0, None)  # allowed, configured, unused


def test_requests_without_a_route_are_a_denied_edge() -> None:
    rates = EdgeRates()
    thief = "bookthief/bookthief"
    rates.update([sample(stats({}, no_route=50), thief)], 0.0)
    (edge,) = rates.update([sample(stats({}, no_route=70), thief)], 2.0)
    assert (edge.source, edge.destination) == (thief, DENIED)
    assert edge.rps == edge.denied_rps == pytest.approx(10.0)
    assert edge.success_rate == 0.0
    assert edge.requests == 70


def test_a_restarted_sidecar_counts_from_zero() -> None:
    rates = EdgeRates()
    rates.update([sample(stats({V1: counters(500, 500)}))], 0.0)
    (edge,) = rates.update([sample(stats({V1: counters(6, 6)}))], 2.0)
    assert edge.rps == pytest.approx(3.0)


def test_the_sidecars_of_one_identity_add_up() -> None:
    rates = EdgeRates()
    rates.update(
        [sample(stats({V1: counters(0, 0)}), url=u) for u in ("a", "b")],
        0.0,
    )
    (edge,) = rates.update(
        [
            sample(stats({V1: counters(10, 10)}, latency={V1: (1.0, 2.0)}), url="a"),
            sample(stats({V1: counters(30, 30)}, latency={V1: (3.0, 8.0)}), url="b"),
        ],
        1.0,
    )
    assert edge.rps == pytest.approx(40.0)
    assert edge.p50_ms == pytest.approx((1.0 * 10 + 3.0 * 30) / 40)  # weighted by requests
    assert edge.p99_ms == 8.0  # the worst


def test_a_cluster_presenting_a_certificate_is_mtls() -> None:
    def cluster(name: str, socket: dict[str, Any] | None) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name}
        if socket is not None:
            body["transport_socket"] = socket
        return {"cluster": body}

    mtls = {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": TLS,
            "common_tls_context": {"tls_certificate_sds_secret_configs": [{"name": "cert"}]},
        },
    }
    tls_only = {"name": "tls", "typed_config": {"@type": TLS, "common_tls_context": {}}}
    dump = {"configs": [cluster(V1, mtls), cluster(V2, tls_only), cluster("egress", None)]}
    assert cluster_tls(dump) == {V1: "mtls", V2: "tls", "egress": "plaintext"}

"""Where ``trellis dashboard`` reads the sidecars' traffic: one seam, three sources.

The scraper (:class:`trellis_cli.dashboard.Scraper`) asks its source for one
:class:`Reading` per scrape and knows no more about it:

- :class:`LocalSidecars`: the Envoy admin APIs of the sidecars whose bootstrap files are in
  the state directory, and ``--sidecar`` URLs (a local mesh, ``trellis up``'s demo);
- :class:`trellis_cli.dashpods.ClusterSidecars`: the injected pods of a cluster, each
  sidecar's admin API reached through a port-forward;
- :class:`trellis_cli.dashprom.PrometheusSource`: the sidecars' series in a Prometheus
  server (``--prometheus-url``), which already holds the rates: its reading carries edges.

The two admin-API sources read each sidecar the same way (:class:`AdminReader`): its
identity from ``/server_info`` (the bootstrap's ``node.cluster``, ``<namespace>/<service>``),
its counters and latency quantiles from ``/stats?format=json`` (:data:`STATS_FILTER`), and
its clusters' transport from ``/config_dump``, read again only when a cluster appears or
every few scrapes. A sidecar that cannot be read is an error line of the reading, named,
never a failed scrape.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import yaml

from trellis_cli import meshedges
from trellis_identity.trustctx import system_context

#: The counters, and the latency histogram, of the outbound clusters, and the caller-side
#: denials (no route: the mesh gave the caller no way to the destination).
STATS_FILTER = (
    r"^cluster\.[^.]+\.(upstream_rq_(total|completed|[2345]xx|403)|upstream_cx_connect_fail"
    r"|upstream_rq_time)$|^http\.outbound\.no_route$"
)
#: A sidecar's clusters' transport is read again once in this many scrapes.
TLS_EVERY = 5
#: Seconds one admin request may take (a port-forward adds a round trip to the API server).
TIMEOUT = 3.0


@dataclass(frozen=True)
class Reading:
    """One scrape of a source: the sidecars read, what could not be read (named, for the
    page), the edges when the source computed them (else the scraper turns successive
    samples into rates), and what the page says about the source itself."""

    samples: list[meshedges.Sample]
    errors: list[str] = field(default_factory=list)
    edges: list[meshedges.Edge] | None = None
    source: dict[str, Any] = field(default_factory=dict)


class Source(Protocol):
    def read(self) -> Reading: ...


class AdminReader:
    """Reads sidecars' Envoy admin APIs, and remembers what rarely changes per admin URL."""

    def __init__(self) -> None:
        self._identities: dict[str, str] = {}  # admin URL -> "<ns>/<service>"
        self._tls: dict[str, dict[str, str]] = {}  # admin URL -> its clusters' transport
        self._reads: dict[str, int] = {}
        self._lock = threading.Lock()  # the cluster source reads several sidecars at once

    def sample(self, client: httpx.Client, url: str, key: str | None = None) -> meshedges.Sample:
        """One sidecar at ``url``; ``key`` names it across scrapes (default: the URL, but a
        port-forward's local port changes with its tunnel)."""
        key = key or url
        with self._lock:
            identity = self._identities.get(key)
            reads = self._reads[key] = self._reads.get(key, 0) + 1
            tls = self._tls.get(key)
        if identity is None:
            info = client.get(f"{url}/server_info")
            info.raise_for_status()
            identity = str(info.json()["node"]["cluster"])
        stats = client.get(f"{url}/stats", params={"format": "json", "filter": STATS_FILTER})
        stats.raise_for_status()
        read = meshedges.read_stats(stats.json())
        if tls is None or reads % TLS_EVERY == 0 or not read.clusters.keys() <= tls.keys():
            # the clusters' transport changes only with a new cluster or a new config
            dump = client.get(f"{url}/config_dump", params={"resource": "dynamic_active_clusters"})
            dump.raise_for_status()
            tls = meshedges.cluster_tls(dump.json())
        with self._lock:
            self._identities[key], self._tls[key] = identity, tls
        return meshedges.Sample(sidecar=key, identity=identity, stats=read, tls=tls)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop what is remembered of sidecars not in ``keep`` (gone pods)."""
        kept = set(keep)
        with self._lock:
            for remembered in (self._identities, self._tls, self._reads):
                for key in [k for k in remembered if k not in kept]:
                    del remembered[key]


def client() -> httpx.Client:
    return httpx.Client(timeout=TIMEOUT, verify=system_context())


def sidecars_of(state_dir: Path) -> list[str]:
    """The admin URLs of the sidecars onboarded from this state directory (the demo's):
    each bootstrap file names its own admin address."""
    found = []
    for bootstrap in sorted((state_dir / "demo").glob("*/envoy.yaml")):
        try:
            address = yaml.safe_load(bootstrap.read_text())["admin"]["address"]["socket_address"]
            found.append(f"http://{address['address']}:{address['port_value']}")
        except (OSError, yaml.YAMLError, KeyError, TypeError):
            continue  # a half-written bootstrap: the next scrape sees it whole
    return found


def described(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class LocalSidecars:
    """The sidecars of a local mesh: found in the state directory (``state_dir`` is called
    per scrape: a sidecar onboarded later is read from then on), and ``extra`` URLs."""

    def __init__(self, state_dir: Callable[[], Path], extra: tuple[str, ...] = ()) -> None:
        self.state_dir, self.extra = state_dir, extra
        self.reader = AdminReader()

    def read(self) -> Reading:
        samples, errors = [], []
        with client() as http:
            for url in dict.fromkeys([*sidecars_of(self.state_dir()), *self.extra]):
                try:
                    samples.append(self.reader.sample(http, url))
                except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                    errors.append(f"sidecar {url}: {described(exc)}")
        return Reading(samples, errors, source={"kind": "local", "sidecars": len(samples)})

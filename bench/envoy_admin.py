"""What a real Envoy serves, read from its admin API by polling.

The propagation benchmark (:mod:`bench.propagation`) times a change until an Envoy serves
it. "Serves" is read here from the Envoy's own admin API, not from the control plane:

* an endpoint is served when it is in the cluster's active load assignment:
  ``/config_dump?resource=dynamic_endpoint_configs&include_eds`` is built from the
  cluster's current host sets, so an address there is one the load balancer picks from
  (:func:`eds_addresses`; ``name_regex`` keeps the dump to the clusters asked about);
* a route change is served when the route configuration has it:
  ``/config_dump?resource=dynamic_route_configs`` (:func:`split_weights`);
* ``POST /logging`` lists the loggers' levels (:func:`logger_level`); a level set through
  the same API is applied at once, which makes it the floor of this way of observing.

:class:`Poller` asks over one keep-alive ``http.client`` connection: a poll of a small dump
costs about 0.25 ms of this process's CPU, a quarter of what an httpx client costs, which
matters when the poller shares two cores with the control plane it measures. Its
:meth:`Poller.until` polls every :data:`INTERVAL` seconds and reports when a poll's answer
first showed the change, so a figure is late by up to one interval plus one poll's round
trip: the resolution of everything measured this way.

Standard library only: the tests load this file on its own.
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

INTERVAL = 0.002  # seconds between the starts of two polls
TIMEOUT = 15.0  # seconds: a change not served by then is an error


def eds_path(cluster_prefix: str) -> str:
    """The dump of the load assignments of the clusters whose names start so."""
    regex = urllib.parse.quote(re.escape(cluster_prefix) + ".*", safe="")
    return f"/config_dump?resource=dynamic_endpoint_configs&include_eds&name_regex={regex}"


ROUTES_PATH = "/config_dump?resource=dynamic_route_configs"
LOGGING_PATH = "/logging"


def eds_addresses(body: bytes) -> set[str]:
    """Every endpoint address in an endpoint config dump (:func:`eds_path`)."""
    dump: dict[str, Any] = json.loads(body)
    return {
        lb["endpoint"]["address"]["socket_address"]["address"]
        for config in dump.get("configs", [])
        for locality in config.get("endpoint_config", {}).get("endpoints", [])
        for lb in locality.get("lb_endpoints", [])
    }


def split_weights(body: bytes) -> dict[str, int]:
    """Cluster name → weight, over every weighted route in a route config dump."""
    dump: dict[str, Any] = json.loads(body)
    return {
        cluster["name"]: int(cluster.get("weight", 0))
        for config in dump.get("configs", [])
        for host in config.get("route_config", {}).get("virtual_hosts", [])
        for route in host.get("routes", [])
        for cluster in route.get("route", {}).get("weighted_clusters", {}).get("clusters", [])
    }


def logger_level(body: bytes, logger: str) -> str | None:
    """A logger's level in the answer of ``POST /logging`` ("active loggers:" then one
    ``  name: level`` line each); None when the logger is not listed."""
    for line in body.decode().splitlines():
        name, colon, level = line.strip().partition(": ")
        if colon and name == logger:
            return level
    return None


class Poller:
    """One keep-alive connection to an Envoy's admin API (``http://host:port``)."""

    def __init__(self, admin_url: str) -> None:
        parsed = urllib.parse.urlsplit(admin_url)
        assert parsed.hostname is not None
        assert parsed.port is not None
        self._connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=5)

    def fetch(self, path: str, method: str = "GET") -> bytes:
        """The body of one answer; a dropped keep-alive connection is opened again once."""
        for attempt in (1, 2):
            try:
                self._connection.request(method, path)
                response = self._connection.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException):
                self._connection.close()
                if attempt == 2:
                    raise
                continue
            if response.status != 200:
                raise RuntimeError(f"{method} {path} answered {response.status}: {body[:300]!r}")
            return body
        raise AssertionError("unreachable")

    def until(
        self, path: str, shows: Callable[[bytes], bool], since: float, method: str = "GET"
    ) -> float:
        """Poll ``path`` every :data:`INTERVAL` until ``shows`` holds for an answer; return
        the seconds from ``since`` (a ``time.perf_counter()``) to that answer's arrival."""
        tick = time.perf_counter()
        while True:
            body = self.fetch(path, method)
            now = time.perf_counter()
            if shows(body):
                return now - since
            if now - since > TIMEOUT:
                raise TimeoutError(f"{path}: not shown after {TIMEOUT:g} s")
            tick += INTERVAL
            time.sleep(max(0.0, tick - time.perf_counter()))

    def close(self) -> None:
        self._connection.close()

"""One VM endpoint, from its POST until a real Envoy serves it, hop by hop, from the logs.

``python -m bench.trace`` runs the whole control plane as ``bench propagation`` does
(:func:`bench.fullmesh.running`), with every service logging at debug level and the
observed Envoy's ``config`` and ``upstream`` loggers at debug too. It registers a few
bookstore-v2 workloads one at a time over endpoints-vm's REST API, polls bookbuyer's Envoy
until each is in its load assignment (:class:`bench.envoy_admin.Poller`), and prints, for
the last one, every log line the processes wrote between the POST and that moment, with
its offset from the POST in milliseconds:

* endpoints-vm: the registration (pushed on the catalog's watch at once);
* the catalog: the service changed (its watch answer), the flush;
* proxy-cp: the watch answer applied (``catalog.synced``: any ``GetResources``), the
  snapshot, the push;
* Envoy: the update received and applied.

The log lines carry milliseconds, so each hop is told to about 1 ms; the POST and the poll
are this process's clock, the same wall clock. ``--changes N`` traces N changes and prints
the last (the first ones warm the path up); ``--all`` prints every line of the window,
not only those of the hops (``--all`` shows the debug noise too); ``--churn R`` makes R
other endpoint changes per second meanwhile (:mod:`bench.background`, as ``bench
propagation``'s churn phase), so the trace shows what the change waits behind.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Callable

import httpx

from bench import envoy_admin, fullmesh, load
from bench.background import Background
from bench.logtrace import window
from trellis_testing.mesh import Mesh, Sidecar

SERVICE = "bookstore-v2"
CLUSTER = f"bookstore/{SERVICE}|"
NETWORK = 202  # the traced workloads' addresses: 202.x.y.z
SERVICES = ("endpoints-vm", "catalog", "proxy-cp")


def _logs(mesh: Mesh, buyer: Sidecar) -> dict[str, str]:
    found = {name: mesh.processes[name].logs() for name in SERVICES}
    found["envoy (bookbuyer)"] = buyer.envoy.logs()
    return found


def _serving(address: str) -> Callable[[bytes], bool]:
    return lambda body: address in envoy_admin.eds_addresses(body)


def trace(changes: int, every: bool, churn: float) -> None:
    os.environ["TRELLIS_LOG_LEVEL"] = "DEBUG"  # the services started below inherit it
    with fullmesh.running("trellis-trace-") as (mesh, buyer), contextlib.ExitStack() as load_:
        if churn:
            load_.enter_context(Background(mesh.state_dir, mesh.tmp / "background.log", rate=churn))
        poller = envoy_admin.Poller(buyer.envoy.admin)
        poller.fetch(f"{envoy_admin.LOGGING_PATH}?paths=config:debug,upstream:debug", "POST")
        eds = envoy_admin.eds_path(CLUSTER)
        with httpx.Client(**fullmesh.endpoints_vm(mesh.state_dir)) as rest:
            for index in range(1, changes + 1):
                address = load.address(index, NETWORK)
                body = {
                    "namespace": "bookstore",
                    "name": f"trace-{index}",
                    "services": [SERVICE],
                    "address": address,
                    "ports": [{"name": "http", "number": 14001}],
                    "service_account": "bookstore",
                }
                time.sleep(0.2)  # the previous change's tail (logs, ACKs) is over
                posted, counter = time.time(), time.perf_counter()
                load.expect_status(rest.post("/v1/workloads", json=body), 201)
                answered = time.perf_counter() - counter
                took = poller.until(eds, _serving(address), counter)
        poller.close()
        time.sleep(0.2)  # the last lines are written
        served = posted + took
        print(
            f"workload {body['name']} at {address}: POST answered after {answered * 1000:.1f} ms, "
            f"served by bookbuyer's Envoy after {took * 1000:.1f} ms (polled every 2 ms)"
        )
        for line in window(_logs(mesh, buyer), posted, served, every):
            print(f"{(line.at - posted) * 1000:8.1f} ms  {line.source:<18} {line.text[:150]}")
        print(
            f"{took * 1000:8.1f} ms  {'(this process)':<18} the address in Envoy's load assignment"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.trace", description=__doc__)
    parser.add_argument("--changes", type=int, default=5, help="changes made; the last is shown")
    parser.add_argument("--all", action="store_true", help="every line in the window")
    parser.add_argument(
        "--churn", type=float, default=0.0, help="meanwhile, this many endpoint changes/s"
    )
    args = parser.parse_args(argv)
    trace(max(1, args.changes), args.all, args.churn)


if __name__ == "__main__":
    main()

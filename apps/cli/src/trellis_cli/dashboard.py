"""``trellis dashboard``: a live picture of the mesh in a browser.

Operators ask "who talks to whom, with what success rate and latency, and is it mTLS?", as
linkerd viz, Kiali and OSM's dashboards answer. A browser cannot present the mesh's client
certificate, so, as ``linkerd viz dashboard`` and ``istioctl dashboard`` do, a small local
server on 127.0.0.1 talks to the control plane with the CLI's own credentials
(:class:`~trellis_cli.client.Mesh`, as ``trellis status``, ``policy`` and ``spec list``) and
serves one self-contained page (``dashboard.html``: inline script, no CDN) and the JSON it
polls (``/api/mesh``).

Two sources make the picture, each read on its own schedule by one background thread:

- the catalog's admin API: the services, each identity's view (who may reach it, the routes
  and splits its callers get) and the documents it rejected; these change rarely, so they
  are read every few scrapes;
- the sidecars' traffic, from one of the sources of :mod:`trellis_cli.dashsources`: the
  local sidecars' Envoy admin APIs (their bootstrap files in the state directory, and
  ``--sidecar``); in a cluster (``--kubeconfig``/``--context``, as the other cluster
  commands), the injected pods' admin APIs through port-forwards
  (:mod:`trellis_cli.dashpods`); or, with ``--prometheus-url``, the sidecars' series in
  Prometheus (:mod:`trellis_cli.dashprom`). Counters become per-edge rates in
  :mod:`trellis_cli.meshedges`.

The thread reads only while someone watches: a page polls ``/api/mesh`` every 2 s, and after
:data:`IDLE_AFTER` seconds without a poll the thread sleeps until the next one. ``trellis up``
starts the dashboard with every mesh, and an unwatched dashboard reading six sidecars every
2 s cost 5-6% of a core. A read after a pause starts the rates afresh: a difference over
the pause would be an average over minutes shown as the current rate.

Nothing here can change the mesh: the server answers GETs only, and only on loopback.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any

import click

from trellis_cli import dashsources, meshedges
from trellis_cli.client import Mesh
from trellis_cli.dashsources import sidecars_of as sidecars_of  # the local source's
from trellis_cli.errors import CliError
from trellis_cli.supervisor import ProcessSpec, tcp_ready

DEFAULT_PORT = 15080
#: Policy changes seldom: the catalog is read once in this many scrapes.
POLICY_EVERY = 5
#: Seconds without a poll of ``/api/mesh`` after which the scraper sleeps.
IDLE_AFTER = 30.0


class Scraper:
    """Reads the sidecars and the catalog, and keeps the latest picture for the page."""

    def __init__(
        self,
        mesh: Mesh,
        extra_sidecars: tuple[str, ...] = (),
        source: dashsources.Source | None = None,
    ) -> None:
        self.mesh = mesh
        #: the sidecars' traffic; by default the local mesh's sidecars and ``extra_sidecars``
        self.source = source or dashsources.LocalSidecars(lambda: mesh.state_dir, extra_sidecars)
        self.rates = meshedges.EdgeRates()
        self.policy: dict[str, Any] = {"services": [], "views": {}, "rejected": []}
        self.policy_errors: list[str] = []
        self.scrapes = 0
        self.lock = threading.Lock()
        self.latest: dict[str, Any] = {"generated_at": None, "services": [], "edges": []}
        self.watched_at = time.monotonic()  # the last poll of the page (a start counts as one)
        self.watched = threading.Event()  # set by a poll: wakes a sleeping scraper
        self.sleeping = False  # no page polls: nothing is read

    def run(self, stop: threading.Event, interval: float) -> None:
        while not stop.is_set():
            if time.monotonic() - self.watched_at > IDLE_AFTER:
                self.watched.clear()
                self.sleeping = True
                while not self.watched.wait(1.0):  # 1 s: a stop is noticed soon enough
                    if stop.is_set():
                        return
                self.sleeping = False
                self.rates = meshedges.EdgeRates()  # a rate over the pause would mislead
            try:
                self.scrape_once()
            except Exception as exc:  # noqa: BLE001
                # a surprise must not end the thread: the page would show a stale picture
                # as if it were live; it shows the failure instead, and the next scrape retries
                with self.lock:
                    self.latest = {**self.latest, "errors": [f"scrape failed: {exc!r}"]}
            stop.wait(interval)

    def scrape_once(self) -> dict[str, Any]:
        now = time.monotonic()
        if self.scrapes % POLICY_EVERY == 0:
            self.policy, self.policy_errors = read_policy(self.mesh, self.policy)
        self.scrapes += 1
        reading = self.source.read()
        edges = reading.edges
        if edges is None:
            edges = self.rates.update(reading.samples, now)
        picture = assemble(self.policy, edges, reading.samples)
        picture["errors"] = [*self.policy_errors, *reading.errors]
        picture["source"] = reading.source
        picture["generated_at"] = time.time()
        with self.lock:
            self.latest = picture
        return picture

    def snapshot(self) -> dict[str, Any]:
        """The latest picture; asking for it counts as watching (see :data:`IDLE_AFTER`)."""
        self.watched_at = time.monotonic()
        self.watched.set()
        with self.lock:
            return self.latest


def read_policy(mesh: Mesh, last: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The catalog's services, each identity's view and the rejected documents; on failure,
    the last good answer and why it is old (the page says so, and keeps showing it)."""
    try:
        services = mesh.get_json("catalog", "/v1/services")["services"]
        identities = [v["identity"] for v in mesh.get_json("catalog", "/v1/views")["views"]]
        views = {i: mesh.get_json("catalog", f"/v1/views/{i}") for i in identities}
        documents = mesh.get_json("catalog", "/v1/resources")["resources"]
    except (CliError, KeyError, TypeError) as exc:
        message = exc.format_message() if isinstance(exc, click.ClickException) else repr(exc)
        return last, [f"catalog: {message} (showing the last answer)"]
    rejected = [d for d in documents if d.get("state") in ("error", "warning")]
    return {"services": services, "views": views, "rejected": rejected}, []


def _account(spiffe_id: str) -> str:
    """``spiffe://td/ns/bookbuyer/sa/bookbuyer`` -> ``bookbuyer/bookbuyer``."""
    parts = spiffe_id.split("/")
    if len(parts) >= 7 and parts[3] == "ns" and parts[5] == "sa":
        return f"{parts[4]}/{parts[6]}"
    return spiffe_id


def _match(match: dict[str, Any]) -> str:
    methods = ",".join(match.get("methods", [])) or "*"
    path = match.get("path_exact") or (
        f"{match['path_prefix']}[/...]" if match.get("path_prefix") else match.get("path_regex")
    )
    return f"{methods} {path or '.*'}"


def assemble(
    policy: dict[str, Any], edges: list[meshedges.Edge], samples: list[meshedges.Sample]
) -> dict[str, Any]:
    """The page's JSON: every service (the catalog's, the sidecars' and the edges' ends)
    with who may reach it, the routes its callers get to it and its rejected documents;
    the edges; and the rejected documents that belong to no one service."""
    services: dict[str, dict[str, Any]] = {}

    def node(name: str) -> dict[str, Any]:
        namespace, _, short = name.rpartition("/")
        return services.setdefault(name, {
            "id": name, "namespace": namespace, "name": short or name,
            "kind": "denied" if name == meshedges.DENIED else "service",
            "sidecars": 0, "endpoints": None, "may_reach_it": [], "routes": [], "rejected": [],
        })  # fmt: skip

    for service in policy["services"]:
        node(f"{service['namespace']}/{service['name']}")["endpoints"] = service.get("endpoints")
    for sample in samples:
        node(sample.identity)["sidecars"] += 1
    for edge in edges:
        node(edge.source), node(edge.destination)
    for identity, view in sorted(policy["views"].items()):
        for port in view.get("inbound", []):
            for rule in port.get("rules", []):
                node(identity)["may_reach_it"].append({
                    "policy": rule.get("policy", ""),
                    "from": [_account(s) for s in rule.get("source_spiffe_ids", [])],
                    "requests": [_match(m) for m in rule.get("http", [])],
                    "port": port.get("port"),
                })  # fmt: skip
        for outbound in view.get("outbound", []):
            routes = node(f"{outbound['namespace']}/{outbound['name']}")["routes"]
            for route in outbound.get("routes", []):
                shown = {
                    "name": route.get("name", ""),
                    "match": _match(route.get("match", {})),
                    "backends": [
                        {
                            "service": meshedges.destination(c.get("cluster", ""))
                            or c.get("cluster", ""),
                            "weight": c.get("weight", 0),
                        }
                        for c in route.get("clusters", [])
                    ],
                }
                if shown not in routes:  # every caller gets the same routes, most often
                    routes.append(shown)
    unowned = []
    for document in policy["rejected"]:
        owners = [
            f"{p['namespace']}/{p['name']}"
            for p in document.get("parents", [])
            if p.get("kind") == "Service"
        ] or [f"{document.get('namespace')}/{document.get('name')}"]
        shown_in = [services[o] for o in owners if o in services]
        for owner in shown_in:
            owner["rejected"].append(document)
        if not shown_in:
            unowned.append(document)
    return {
        "services": sorted(services.values(), key=lambda s: s["id"]),
        "edges": [edge.as_json() for edge in edges],
        "rejected": unowned,
    }


def page() -> bytes:
    return resources.files("trellis_cli").joinpath("dashboard.html").read_bytes()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        port = self.server.server_address[1]
        if self.headers.get("host", "") not in (f"127.0.0.1:{port}", f"localhost:{port}"):
            # DNS rebinding: a web page the operator visits may point its own host name at
            # 127.0.0.1 and read the mesh's policies from here; a browser still sends that
            # name as Host, so only the loopback names are served
            self.server.refused += 1
            click.echo(f"dashboard.refused host={self.headers.get('host')!r} path={path}", err=True)
            self._send(HTTPStatus.FORBIDDEN, "text/plain", b"only 127.0.0.1 or localhost\n")
            return
        if path in ("/", "/index.html"):
            self._send(HTTPStatus.OK, "text/html; charset=utf-8", page())
        elif path == "/api/mesh":
            picture = {**self.server.scraper.snapshot(), "refused_requests": self.server.refused}
            body = json.dumps(picture, sort_keys=True).encode()
            self._send(HTTPStatus.OK, "application/json", body)
        elif path == "/healthz":
            self._send(HTTPStatus.OK, "text/plain", b"ok\n")
        else:
            self._send(HTTPStatus.NOT_FOUND, "text/plain", b"not found\n")

    def _send(self, status: HTTPStatus, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.send_header("cache-control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return  # a poll every few seconds is not news


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, scraper: Scraper) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.scraper = scraper
        self.refused = 0  # requests under another Host name (shown in /api/mesh)


@click.command(
    help="A live picture of the mesh in the browser: services, the traffic between them "
    "(rate, success, latency, mTLS), policies and rejected documents. Serves it on "
    "127.0.0.1 with the CLI's credentials, as `istioctl dashboard` does; Ctrl-C stops it. "
    "The traffic comes from the local sidecars, from the injected pods of a cluster "
    "(--kubeconfig/--context: through port-forwards), or from Prometheus (--prometheus-url)."
)
@click.option(
    "--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
    help="Local port of the page (0: any free port).",
)  # fmt: skip
@click.option("--no-open", is_flag=True, help="Do not open a browser; just print the URL.")
@click.option(
    "--interval", type=click.FloatRange(0.5, 60), default=2.0, show_default=True,
    help="Seconds between two reads of the sidecars' statistics.",
)  # fmt: skip
@click.option(
    "--sidecar", "sidecars", multiple=True, metavar="URL",
    help="An Envoy admin URL to read besides the ones found in the state directory "
    "(repeatable), e.g. http://127.0.0.1:15000.",
)  # fmt: skip
@click.option(
    "--prometheus-url", metavar="URL", default=None,
    help="Read the sidecars' Envoy series from this Prometheus (its HTTP API, e.g. "
    "http://127.0.0.1:9090) instead of the sidecars themselves.",
)  # fmt: skip
@click.option(
    "--prometheus-window", default="1m", show_default=True, metavar="DURATION",
    help="With --prometheus-url: the range rates are taken over (30s, 1m, 5m...).",
)  # fmt: skip
@click.option(
    "--pod-namespace", "pod_namespaces", multiple=True, metavar="NAMESPACE",
    help="In a cluster: read the injected pods of this namespace only (repeatable; "
    "default: every namespace, which needs a cluster-wide list on pods).",
)  # fmt: skip
@click.option(
    "--max-forwards", type=click.IntRange(1, 64), default=8, show_default=True,
    help="In a cluster: how many pods are port-forwarded to at once.",
)  # fmt: skip
@click.pass_obj
def dashboard(
    mesh: Mesh,
    port: int,
    no_open: bool,
    interval: float,
    sidecars: tuple[str, ...],
    prometheus_url: str | None,
    prometheus_window: str,
    pod_namespaces: tuple[str, ...],
    max_forwards: int,
) -> None:
    for url in sidecars:
        if not url.startswith(("http://", "https://")):
            raise click.BadParameter(f"{url!r} is not an http:// URL", param_hint="--sidecar")
    source = choose_source(
        mesh, sidecars, prometheus_url, prometheus_window, pod_namespaces, max_forwards
    )
    scraper = Scraper(mesh, tuple(u.rstrip("/") for u in sidecars), source)
    try:
        server = _Server(port, scraper)
    except OSError as exc:
        raise CliError(f"cannot serve the dashboard on 127.0.0.1:{port}: {exc}") from exc
    stop = threading.Event()
    threading.Thread(target=scraper.run, args=(stop, interval), daemon=True).start()
    url = url_of(server.server_address[1])
    click.echo(f"Trellis dashboard: {url} (Ctrl-C stops it)")
    if not no_open:
        import webbrowser

        webbrowser.open(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.server_close()


def choose_source(
    mesh: Mesh,
    sidecars: tuple[str, ...],
    prometheus_url: str | None,
    prometheus_window: str,
    pod_namespaces: tuple[str, ...],
    max_forwards: int,
) -> dashsources.Source | None:
    """The sidecars' traffic: Prometheus if asked, else a cluster's injected pods when the
    command reaches a cluster, else (None) the local sidecars. Options that do not apply to
    the source are refused, named."""
    if prometheus_url is not None:
        from trellis_cli import dashprom

        if not prometheus_url.startswith(("http://", "https://")):
            raise click.BadParameter(
                f"{prometheus_url!r} is not an http:// URL", param_hint="--prometheus-url"
            )
        if sidecars:
            raise click.UsageError("--sidecar and --prometheus-url: give one or the other")
        try:
            return dashprom.PrometheusSource(prometheus_url, prometheus_window)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--prometheus-window") from exc
    cluster = _cluster_of(mesh)  # resolves a cluster now: a bad kubeconfig fails here, named
    if cluster is None:
        if pod_namespaces:
            raise click.UsageError(
                "--pod-namespace applies in a cluster (--kubeconfig or --context); "
                "this dashboard reads the local sidecars"
            )
        return None
    from trellis_cli import dashpods

    click.echo(
        f"reading the injected pods' sidecars through port-forwards ({cluster.where}; "
        f"{max_forwards} at a time)",
        err=True,
    )
    return dashpods.ClusterSidecars(cluster, pod_namespaces, max_forwards, _say)


def _cluster_of(mesh: Mesh) -> Any:
    """The :class:`~trellis_cli.cluster.Cluster` the command reaches, or None for a local
    mesh (``main.MeshOnDemand`` says which without connecting to a local one)."""
    target = getattr(mesh, "target", None)
    if callable(target) and target() is None:
        return None
    return getattr(mesh, "cluster", None)


def _say(message: str) -> None:
    click.echo(message, err=True)


def process_spec(state_dir: Path, port: int = DEFAULT_PORT) -> ProcessSpec:
    """The dashboard as one of ``trellis up``'s supervised processes."""
    return ProcessSpec(
        name="dashboard",
        argv=[
            sys.executable, "-m", "trellis_cli.main", "--state-dir", str(state_dir),
            "dashboard", "--no-open", "--port", str(port),
        ],
        ready=tcp_ready("127.0.0.1", port),
        ports=(port,),
        address=url_of(port),
        after=("catalog",),
    )  # fmt: skip


def url_of(port: int) -> str:
    return f"http://127.0.0.1:{port}/"

"""``trellis status``: every service's health, connected proxies, catalog revision.

For each service, and each replica of one (``catalog-2``, as ``trellis up --replicas``
runs them): its role where it takes part in an election (leader, or standby and who leads),
its readiness checks, the long-lived loops (streams, subscriptions) that
are down and why, and the records it rejected (with the reason, from ``/v1/status``).
Exit code 1 when any service is unhealthy or unreachable, so scripts and CI can wait on it;
2 when none answers at all: then there is no mesh to judge (not started, or another
``--state-dir``), and the message says so.
"""

from __future__ import annotations

from typing import Any

import click
import httpx

from trellis_cli import output
from trellis_cli.client import Mesh
from trellis_cli.errors import NEGATIVE, CliError
from trellis_common import components, statefile
from trellis_runtime import adminhttp


def probe(mesh: Mesh, name: str, versions: dict[str, str] | None = None) -> dict[str, Any]:
    """``name``'s health; its version goes to ``versions`` (for ``-o wide``), which keeps
    the answer's JSON as it always was."""
    url = mesh.admin_url(name)
    try:
        response = adminhttp.request(mesh.state_dir, name, "GET", url + "/readyz", timeout=2.0)
        body = response.json()
        status = _extra(mesh, name, "/v1/status") or {}
        if versions is not None and status.get("version"):
            versions[name] = str(status["version"])
        return {
            "service": name,
            "admin_url": url,
            "healthy": response.status_code == 200,
            "checks": body.get("checks", {}),
            "reasons": body.get("reasons", {}),
            "loops": status.get("loops", []),
            "rejections": status.get("rejections", []),
            "leadership": status.get("leadership", []),
        }
    except (httpx.HTTPError, ValueError, OSError) as exc:  # OSError: no trust bundle
        return {"service": name, "admin_url": url, "healthy": False, "error": type(exc).__name__}


def _replica(name: str) -> bool:
    try:
        return components.of_instance(name) != name
    except components.UnknownComponent:
        return False


def _replica_of(name: str, component: str) -> bool:
    return _replica(name) and components.of_instance(name) == component


def _order(name: str) -> int:
    return int(name.rpartition("-")[2])


def _problems(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"unreachable ({result['error']})"
    parts = [f"{name}: {reason}" for name, reason in result.get("reasons", {}).items()]
    rejected = result.get("rejections", [])
    if rejected:
        parts.append(f"{len(rejected)} rejected record(s)")
    return "; ".join(parts) or "-"


def _role(result: dict[str, Any]) -> str:
    """``leader`` or ``standby (leader: catalog-2)`` for each elected role the replica takes
    part in (certmanager's rotation, endpoints-vm's expiry...); ``-`` for none."""
    roles = []
    for role in result.get("leadership", []):
        if role.get("leading"):
            roles.append(f"{role['name']}: leader")
        else:
            holder = role.get("holder") or "nobody"
            roles.append(f"{role['name']}: standby (leader: {holder})")
    return "; ".join(roles) or "-"


def _extra(mesh: Mesh, name: str, path: str) -> Any:
    """``name``'s JSON answer at ``path``, or None: the admin token sent is the mesh's (a
    cluster's comes from its Secret, not a file), and a refusal is not data."""
    token = mesh.token()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        url = mesh.admin_url(name) + path
        answer = adminhttp.request(mesh.state_dir, name, "GET", url, headers=headers, timeout=2.0)
        return answer.json() if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError, OSError):
        return None


def details(mesh: Mesh, names: list[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    proxy_cps = [n for n in names if n == "proxy-cp" or _replica(n)]
    bodies = [b for n in proxy_cps if (b := _extra(mesh, n, "/v1/proxies")) is not None]
    if bodies:  # each replica lists the proxies connected to it
        proxies = [p for body in bodies for p in body.get("proxies", [])]
        found["connected_proxies"] = len(proxies)
        found["proxies_with_nacks"] = sum(
            1 for p in proxies if any(t.get("nacks") for t in p.get("types", {}).values())
        )
    if "catalog" in names:
        body = _extra(mesh, "catalog", "/v1/views")
        if body is not None:
            found["catalog_revision"] = body.get("revision")
            found["identities"] = len(body.get("views", []))
        resources = _extra(mesh, "catalog", "/v1/resources?state=error")
        if resources is not None:
            found["invalid_documents"] = len(resources.get("resources", []))
    if "endpoints-vm" in names:
        body = _extra(mesh, "endpoints-vm", "/v1/workloads")
        if body is not None:
            workloads = body.get("workloads", [])
            found["workloads"] = len(workloads)
            found["expired_workloads"] = sum(1 for w in workloads if not w.get("alive"))
    return found


def _recorded(
    known: dict[str, statefile.ServiceEndpoint], result: dict[str, Any], field: str
) -> str:
    """What the state directory records of the service (its gRPC address, its process)."""
    endpoint = known.get(result["service"])
    return str(getattr(endpoint, field) or "-") if endpoint is not None else "-"


def _checks(result: dict[str, Any]) -> str:
    checks = result.get("checks", {})
    passing = sum(1 for ok in checks.values() if ok is True)
    return f"{passing}/{len(checks)}" if checks else "-"


def _loops_down(result: dict[str, Any]) -> str:
    down = [loop["name"] for loop in result.get("loops", []) if not loop["up"]]
    return ", ".join(down) or "-"


def _restarts(result: dict[str, Any]) -> str:
    return str(sum(int(loop.get("restarts", 0)) for loop in result.get("loops", [])))


@click.command(
    help="Health of each service of the running mesh; exit 1 if any is unhealthy, 2 if none "
    "answers (the mesh is not running)."
)
@output.format_option
@click.pass_obj
def status(mesh: Mesh, fmt: output.Format) -> None:
    known = statefile.read_endpoints(mesh.state_dir)
    # imports nothing of `trellis up` (its supervisor, the demo, Redis): a status is one request
    names = [name for name in components.START_ORDER if name in known] or list(
        components.START_ORDER
    )
    # the replicas (catalog-2, proxy-cp-2...), each after its component's first
    replicas = sorted((n for n in known if n not in names and _replica(n)), key=_order)
    for replica in replicas:
        component = components.of_instance(replica)
        kin = [i for i, n in enumerate(names) if n == component or _replica_of(n, component)]
        names.insert(max(kin) + 1 if kin else len(names), replica)
    versions: dict[str, str] = {}
    results = [probe(mesh, name, versions) for name in names]
    if all("error" in r for r in results):
        raise CliError(
            f"no Trellis service answers (tried {', '.join(r['admin_url'] for r in results)}): "
            "is the mesh running? Start it with `trellis up` (`make run`), or point --state-dir "
            f"or TRELLIS_STATE_DIR at its state directory (now {mesh.state_dir})"
        )
    extra = details(mesh, names)
    if not output.emit(fmt, {"services": results, "mesh": extra}):
        output.listing(
            fmt,
            "Trellis services",
            [
                output.Column("SERVICE", lambda r: r["service"]),
                output.Column("ADMIN", lambda r: r["admin_url"]),
                output.Column("HEALTH", lambda r: "ok" if r["healthy"] else "UNHEALTHY"),
                output.Column("ROLE", _role),
                output.Column(
                    "LOOPS",
                    lambda r: (
                        f"{sum(1 for loop in r.get('loops', []) if loop['up'])}/"
                        f"{len(r.get('loops', []))} up"
                    ),
                ),
                output.Column("PROBLEMS", _problems),
                output.Column("VERSION", lambda r: versions.get(r["service"], "-"), wide=True),
                output.Column("GRPC", lambda r: _recorded(known, r, "grpc_address"), wide=True),
                output.Column("PID", lambda r: _recorded(known, r, "pid"), wide=True),
                output.Column("CHECKS OK", _checks, wide=True),
                output.Column("LOOPS DOWN", _loops_down, wide=True),
                output.Column("RESTARTS", _restarts, wide=True),
            ],
            results,
        )
        rejected = [(r["service"], x) for r in results for x in r.get("rejections", [])]
        if rejected:
            output.table(
                "Rejected records (skipped; everything else flows)",
                ["SERVICE", "SOURCE", "RECORD", "REASON", "TIMES"],
                [(svc, x["source"], x["key"], x["reason"], str(x["count"])) for svc, x in rejected],
            )
        if extra:
            output.console.print("  ".join(f"{k.replace('_', ' ')}: {v}" for k, v in extra.items()))
    if not all(r["healthy"] for r in results):
        raise SystemExit(NEGATIVE)

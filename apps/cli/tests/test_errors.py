"""Exit codes a script can trust: 0 yes, 1 no, 2 no answer, for every command family.

The commands run through click's runner against admin APIs served over real HTTP with
canned answers (:class:`trellis_cli.testing.CannedAdmin`), and against a state directory
whose services all point at a closed port: a mesh that is not running.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from rich.console import Console

from trellis_cli import output
from trellis_cli.client import DEFAULT_ADMIN_PORTS
from trellis_cli.main import cli
from trellis_cli.testing import Answer, CannedAdmin, unreachable
from trellis_testing.ports import free_port

REPO = Path(__file__).resolve().parents[3]
SERVICES = tuple(DEFAULT_ADMIN_PORTS)
CN = "bookstore-v1.bookstore.svc.cluster.local"


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output, "console", Console(width=240))


@pytest.fixture(autouse=True)
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRELLIS_ADMIN_TOKEN", "test-token")


def trellis(state_dir: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--state-dir", str(state_dir), *args])


def canned(state_dir: Path, answers: dict[tuple[str, str], Answer]) -> CannedAdmin:
    admin = CannedAdmin(answers)
    admin.serve(state_dir, *SERVICES)
    return admin


@pytest.fixture
def stopped_mesh(tmp_path: Path) -> Path:
    unreachable(tmp_path, *SERVICES, port=free_port())
    return tmp_path


def test_the_codes_are_documented_in_help(tmp_path: Path) -> None:
    result = trellis(tmp_path, "--help")

    assert result.exit_code == 0
    text = result.stdout
    assert "Exit codes:" in text
    for line in ("0  success", "1  a negative answer", "2  no answer: a usage error"):
        assert line in text
    assert "not running" in text


# -- 2: the mesh is not running --------------------------------------------------------------

FAMILIES = [
    ("status",),
    ("proxy", "list"),
    ("proxy", "config", "x.y.z"),
    ("policy", "check", "--from", "a/b", "--to", "c/d"),
    ("spec", "list"),
    ("certs", "list"),
    ("certs", "root"),
    ("certs", "rotate", CN),
    ("vm", "list"),
    ("vm", "heartbeat", "-n", "shop", "--name", "cart-1"),
    ("vm", "deregister", "-n", "shop", "--name", "cart-1"),
    (
        "vm",
        "register",
        *("-n", "shop", "--name", "cart-1", "--service", "cart"),
        *("--address", "10.0.0.7", "--port", "http=15003"),
    ),
]


@pytest.mark.parametrize("args", FAMILIES, ids=" ".join)
def test_a_mesh_that_is_not_running_is_exit_2_in_one_line(
    stopped_mesh: Path, args: tuple[str, ...]
) -> None:
    keep_heartbeat_token(stopped_mesh, "shop", "cart-1")
    result = trellis(stopped_mesh, *args)

    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert "Traceback" not in result.output
    assert "is the mesh running? Start it with `trellis up`" in line
    assert f"(now {stopped_mesh})" in line
    assert result.stdout == ""


def test_an_unreachable_service_is_named_with_its_address(stopped_mesh: Path) -> None:
    result = trellis(stopped_mesh, "certs", "list")

    assert "certmanager is not reachable at http://127.0.0.1:" in result.stderr
    assert "/v1/certificates (ConnectError)" in result.stderr


def test_vm_bootstrap_against_a_stopped_mesh_is_2_and_writes_nothing(stopped_mesh: Path) -> None:
    out = stopped_mesh / "cart-proxy"
    result = trellis(
        stopped_mesh,
        *("vm", "bootstrap", "-n", "shop", "--service", "cart", "--app-port", "8080"),
        *("--inbound-port", "15003", "--outbound-port", "15001", "--admin-port", "15000"),
        *("--out", str(out)),
    )

    assert result.exit_code == 2
    assert "injector is not reachable" in result.stderr
    assert not out.exists()


# -- 2: usage errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("nosuchcommand",),
        ("status", "--nosuchflag"),
        ("proxy", "config"),
        ("policy", "check", "--from", "a/b"),
        ("spec", "validate"),
        ("spec", "validate", "no/such/dir"),
        ("certs", "list", "--kind", "nosuchkind"),
        ("vm", "register", "-n", "shop"),
        ("vm", "register", *("-n", "s", "--name", "x", "--service", "s", "--address", "a")),
        ("up", "--quiet", "--verbose"),
        ("up", "--log-max-bytes", "ten"),
    ],
    ids=" ".join,
)
def test_usage_errors_are_2(tmp_path: Path, args: tuple[str, ...]) -> None:
    result = trellis(tmp_path, *args)

    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


# -- answers from a running service ------------------------------------------------------------

HEALTHY = {("GET", "/readyz"): Answer(200, {"checks": {"redis": True}})}


def test_status_healthy_is_0_unhealthy_is_1(tmp_path: Path) -> None:
    with canned(tmp_path, dict(HEALTHY)) as admin:
        healthy = trellis(tmp_path, "status")
        admin.answers[("GET", "/readyz")] = Answer(
            503, {"checks": {"redis": False}, "reasons": {"redis": "connection refused"}}
        )
        unhealthy = trellis(tmp_path, "status", "--json")

    assert healthy.exit_code == 0, healthy.output
    assert "UNHEALTHY" not in healthy.stdout
    assert unhealthy.exit_code == 1, unhealthy.output
    assert '"healthy": false' in unhealthy.stdout


def test_status_with_some_services_down_is_unhealthy_not_unreachable(tmp_path: Path) -> None:
    with canned(tmp_path, dict(HEALTHY)):
        unreachable(tmp_path, "proxy-cp", port=free_port())
        result = trellis(tmp_path, "status")

    assert result.exit_code == 1, result.output
    assert "unreachable (ConnectError)" in result.stdout


def verdict(allowed: bool) -> Answer:
    reason = "TrafficTarget bookstore/t" if allowed else "no TrafficTarget"
    return Answer(200, {"allowed": allowed, "reason": reason, "routes": []})


@pytest.mark.parametrize(
    ("answer", "code"),
    [(verdict(True), 0), (verdict(False), 1), (Answer(503, {"detail": "catalog not ready"}), 2)],
    ids=["allowed", "denied", "failing"],
)
def test_policy_check(tmp_path: Path, answer: Answer, code: int) -> None:
    with canned(tmp_path, {("GET", "/v1/policy/check"): answer}):
        result = trellis(tmp_path, "policy", "check", "--from", "a/b", "--to", "c/d")

    assert result.exit_code == code, result.output
    if code == 2:
        assert result.stderr == "Error: catalog failed to answer (503): catalog not ready\n"


def test_policy_check_prints_grpc_routes_and_what_shapes_the_calls(tmp_path: Path) -> None:
    grpc_route = {
        "path_regex": ".*",
        "methods": [],
        "headers": [],
        "path_exact": "/helloworld.Greeter/SayHello",
        "path_prefix": "",
        "header_matches": [{"name": "x-tenant", "value": "a|b", "regex": True}],
        "query_params": [],
    }
    body = {
        "allowed": True,
        "reason": "allowed by TrafficTarget shop/t",
        "routes": [grpc_route, {**grpc_route, "path_exact": "", "path_prefix": "/admin.A"}],
        "shaped_by": ["GRPCRoute shop/hello (routes)", "Retry shop/r (retryOn 5xx)"],
    }
    with canned(tmp_path, {("GET", "/v1/policy/check"): Answer(200, body)}):
        result = trellis(tmp_path, "policy", "check", "--from", "shop/client", "--to", "shop/hello")

    assert result.exit_code == 0, result.output
    assert "route * /helloworld.Greeter/SayHello x-tenant~a|b" in result.stdout
    assert "route * /admin.A[/...] x-tenant~a|b" in result.stdout
    assert "shaped by GRPCRoute shop/hello (routes)" in result.stdout
    assert "shaped by Retry shop/r (retryOn 5xx)" in result.stdout


ROTATE = ("POST", f"/v1/certificates/{CN}/rotate")
CERT = {"common_name": CN, "serial": "ab" * 16, "not_after": "2030-01-01T00:00:00"}


@pytest.mark.parametrize(
    ("answer", "code", "message"),
    [
        (Answer(200, {"certificate": CERT, "revision": 7}), 0, ""),
        (Answer(404, {"detail": f"no certificate {CN}"}), 1, f"404: no certificate {CN}"),
        (Answer(403, {"detail": "bad token"}), 2, "the admin token was refused"),
        (Answer(500, b"Internal Server Error"), 2, "failed to answer (500)"),
        (Answer(200, b"<html>hello</html>"), 2, "not JSON; is --state-dir"),
    ],
    ids=["rotated", "not-found", "forbidden", "failing", "not-json"],
)
def test_certs_rotate(tmp_path: Path, answer: Answer, code: int, message: str) -> None:
    with canned(tmp_path, {ROTATE: answer}):
        result = trellis(tmp_path, "certs", "rotate", CN)

    assert result.exit_code == code, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_certs_list_is_0(tmp_path: Path) -> None:
    body = {"revision": 3, "certificates": []}
    with canned(tmp_path, {("GET", "/v1/certificates"): Answer(200, body)}):
        result = trellis(tmp_path, "certs", "list")

    assert result.exit_code == 0, result.output
    assert "Certificates (revision 3)" in result.stdout


def keep_heartbeat_token(state_dir: Path, namespace: str, name: str) -> None:
    """As ``trellis vm register`` keeps it."""
    path = state_dir / "heartbeat-tokens" / namespace / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("trellis-hb.a-heartbeat-token\n")


def test_vm_heartbeat_without_a_heartbeat_token_is_2_naming_where_it_looked(
    tmp_path: Path,
) -> None:
    with canned(tmp_path, {}):
        result = trellis(tmp_path, "vm", "heartbeat", "-n", "shop", "--name", "cart-1")

    assert result.exit_code == 2, result.output
    assert "no heartbeat token for shop/cart-1 at " in result.stderr
    assert "`trellis vm register` keeps it there" in result.stderr


def test_vm_heartbeat_of_an_unknown_workload_is_1(tmp_path: Path) -> None:
    keep_heartbeat_token(tmp_path, "shop", "nobody")
    with canned(tmp_path, {}):
        result = trellis(tmp_path, "vm", "heartbeat", "-n", "shop", "--name", "nobody")

    assert result.exit_code == 1, result.output
    assert "endpoints-vm answered 404" in result.stderr


def test_vm_register_refused_as_invalid_is_2_and_names_the_field(tmp_path: Path) -> None:
    refusal = Answer(422, {"detail": "ports[http]: 99999 is not a port (1-65535)"})
    with canned(tmp_path, {("POST", "/v1/workloads"): refusal}):
        result = trellis(
            tmp_path,
            *("vm", "register", "-n", "shop", "--name", "x", "--service", "s"),
            *("--address", "10.0.0.7", "--port", "http=99999"),
        )

    assert result.exit_code == 2, result.output
    assert "endpoints-vm refused the request (422): ports[http]" in result.stderr


def test_vm_deregister_is_0(tmp_path: Path) -> None:
    with canned(tmp_path, {("DELETE", "/v1/workloads/shop/cart-1"): Answer(200, {})}):
        result = trellis(tmp_path, "vm", "deregister", "-n", "shop", "--name", "cart-1")

    assert result.exit_code == 0, result.output
    assert "deregistered shop/cart-1" in result.stdout


def test_a_missing_admin_token_is_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRELLIS_ADMIN_TOKEN")
    with canned(tmp_path, {}):
        result = trellis(tmp_path, "vm", "deregister", "-n", "shop", "--name", "cart-1")

    assert result.exit_code == 2
    assert "no admin token" in result.stderr


# -- spec validate: offline ----------------------------------------------------------------------


def test_spec_validate_valid_is_0_invalid_is_1(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "apiVersion: split.smi-spec.io/v1alpha4\nkind: TrafficSplit\n"
        "metadata: {name: s, namespace: n}\nspec: {service: 7}\n"
    )

    valid = trellis(tmp_path, "spec", "validate", str(REPO / "examples" / "bookstore"))
    invalid = trellis(tmp_path, "spec", "validate", str(broken))

    assert valid.exit_code == 0, valid.output
    assert "0 with errors" in valid.stdout
    assert invalid.exit_code == 1, invalid.output
    assert "1 with errors" in invalid.stdout


def test_spec_validate_names_the_field_of_osm_edge_policies_offline(tmp_path: Path) -> None:
    (tmp_path / "edge.yaml").write_text(
        """apiVersion: policy.openservicemesh.io/v1alpha1
kind: Egress
metadata: {name: httpbin, namespace: curl}
spec:
  sources: [{kind: ServiceAccount, name: curl, namespace: curl}]
  hosts: [httpbin.org]
  ports: [{number: 80, protocol: gopher}]
---
apiVersion: policy.openservicemesh.io/v1alpha1
kind: IngressBackend
metadata: {name: httpbin, namespace: httpbin}
spec:
  backends: [{name: httpbin, port: {number: 14001, protocol: http}}]
  sources: [{kind: IPRange, name: everywhere}]
---
apiVersion: policy.openservicemesh.io/v1alpha1
kind: Egress
metadata: {name: limited, namespace: curl}
spec:
  sources: [{kind: ServiceAccount, name: curl, namespace: curl}]
  hosts: [httpbin.org]
  ports: [{number: 443, protocol: https}]
  matches:
  - {apiGroup: policy.openservicemesh.io/v1alpha1, kind: UpstreamTrafficSetting, name: gone}
"""
    )
    done = trellis(tmp_path, "spec", "validate", "--json", str(tmp_path / "edge.yaml"))
    assert done.exit_code == 1, done.output
    found = {d["key"]: d for d in json.loads(done.stdout)["documents"]}
    assert found["Egress curl/httpbin"]["field"] == "spec.ports[0].protocol"
    assert "gopher" in found["Egress curl/httpbin"]["reason"]
    assert found["IngressBackend httpbin/httpbin"]["field"] == "spec.sources[0].name"
    assert "IPv4 CIDR" in found["IngressBackend httpbin/httpbin"]["reason"]
    # a reference checked offline too: the Egress is ignored until the setting exists
    assert found["Egress curl/limited"]["state"] == "error"
    assert (
        "UpstreamTrafficSetting curl/gone (spec.matches) not found"
        in (found["Egress curl/limited"]["reason"])
    )

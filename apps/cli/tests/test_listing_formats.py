"""``-o table|wide|json|yaml`` (and ``--json``) on every command that lists.

Each answer is made by the owning service's own serializer (certmanager's
``CertificateRecord.metadata``, endpoints-vm's ``workload_json``, the catalog's statuses of
the real ``examples/`` documents, proxy-cp's Destination answers from real Linkerd protobuf
messages...), then served over real HTTP (:class:`~trellis_cli.testing.CannedAdmin`): the
columns are read from what the services really send. ``proxy list`` and ``status`` against
proxy-cp's real admin app are in ``test_proxy_cli.py``.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result
from google.protobuf import json_format
from rich.console import Console

from trellis_api.linkerd import destination_pb2 as dpb
from trellis_certmanager.componentcerts import ComponentCert
from trellis_certmanager.domain.records import CertificateKind, CertificateRecord
from trellis_cli import output
from trellis_cli.client import DEFAULT_ADMIN_PORTS
from trellis_cli.main import cli
from trellis_cli.testing import Answer, CannedAdmin
from trellis_common.documents import all_kinds
from trellis_common.specdir import load_paths
from trellis_endpoints_vm.domain.workloads import Workload
from trellis_endpoints_vm.transport.rest import workload_json
from trellis_identity.onboarding import OnboardingToken
from trellis_proxy_cp.discovery.rest import readable
from trellis_proxy_cp.translate import linkerd
from trellis_spec import mesh as meshspec

REPO = Path(__file__).resolve().parents[3]
NOW = time.time()
FORMATS = ("table", "wide", "json", "yaml")


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables as piped output renders them, whatever terminal the tests run in."""
    monkeypatch.setattr(output, "console", Console(width=400))


@pytest.fixture(autouse=True)
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRELLIS_ADMIN_TOKEN", "test-token")


def certificate() -> dict[str, Any]:
    start = dt.datetime.fromtimestamp(NOW - 3 * 3600, dt.UTC)
    return CertificateRecord(
        common_name="bookstore-v1.bookstore.svc.cluster.local",
        kind=CertificateKind.SERVICE,
        serial=0xC0FFEE0123456789ABCDEF,
        not_before=start,
        not_after=start + dt.timedelta(hours=48),
        renew_after=start + dt.timedelta(hours=32),
        namespace="bookstore",
        service="bookstore-v1",
        service_account="bookstore",
        proxy_id="",
        dns_names=("bookstore-v1.bookstore.svc", "bookstore-v1.bookstore.svc.cluster.local"),
        uris=("spiffe://cluster.local/ns/bookstore/sa/bookstore",),
        issuer="Trellis mesh root",
        fingerprint="ab12" * 16,
        cert_chain_pem=b"",
        key_pem=b"",
    ).metadata()


def workload() -> dict[str, Any]:
    vm = Workload(
        namespace="shop",
        name="cart-1",
        services=("cart",),
        address="10.0.0.7",
        ports=(("http", 15003),),
        labels=(("version", "v2"),),
        service_account="cart-sa",
        locality="eu-west/zone-a",
        network="dc-1",
        weight=3,
        ttl=30.0,
        registered_at=NOW - 2 * 86400,
        last_heartbeat=NOW - 3 * 3600,
    )
    return workload_json(vm, vm.alive(NOW))


def onboarding_token() -> dict[str, Any]:
    return OnboardingToken(
        id="0123456789abcdef",
        namespace="shop",
        service_account="cart-sa",
        created_at=NOW - 7200,
        expires_at=NOW + 3600,
        digest="not shown",
        service="cart",
        uses=2,
    ).metadata()


def identities() -> dict[str, Any]:
    live = ComponentCert("catalog", "a1b2c3d4e5f60718293a", NOW + 86400, NOW - 4 * 86400)
    gone = ComponentCert("injector", "ffeeddccbbaa99887766", NOW + 86400, NOW - 60, NOW - 30)
    return {"issued": [asdict(live), asdict(gone)], "revoked": [asdict(gone)]}


def example_statuses() -> list[dict[str, Any]]:
    """The catalog's statuses of the repository's own examples, built as the catalog does."""
    documents, errors = load_paths([REPO / "examples"], all_kinds())
    built = meshspec.build(documents, errors)
    return [asdict(s) for s in built.statuses.values()]


def destination() -> dict[str, Any]:
    addr = dpb.WeightedAddr(
        addr=linkerd.tcp_address("10.1.2.3", 8080), weight=10000, metric_labels={"pod": "web-1"}
    )
    addr.tls_identity.uri_like_identity.uri = "spiffe://cluster.local/ns/shop/sa/web"
    addr.tls_identity.server_name.name = "web.shop.svc.cluster.local"
    addr.protocol_hint.h2.SetInParent()
    addr.resource_ref.resource.kind = "Pod"
    addr.resource_ref.resource.namespace = "shop"
    addr.resource_ref.resource.name = "web-1"
    update = dpb.Update(add=dpb.WeightedAddrSet(addrs=[addr], metric_labels={"service": "web"}))
    return {"updates": [readable(update)]}


@dataclass(frozen=True)
class Listing:
    args: tuple[str, ...]
    path: str
    body: dict[str, Any]
    columns: tuple[str, ...]  # some of what the plain table shows
    wide_columns: tuple[str, ...]  # what only -o wide adds
    wide_cells: tuple[str, ...]  # cells of the wide columns, from the answer


LISTINGS = {
    "certs list": Listing(
        ("certs", "list"),
        "/v1/certificates",
        {"revision": 4, "certificates": [certificate()]},
        ("COMMON NAME", "SERIAL", "SPIFFE ID"),
        ("NOT BEFORE", "AGE", "DNS NAMES", "ISSUER", "SHA-256"),
        ("c0ffee0123456789abcdef", "3h", "bookstore-v1.bookstore.svc,", "Trellis mesh root"),
    ),
    "vm list": Listing(
        ("vm", "list"),
        "/v1/workloads",
        {"revision": 9, "workloads": [workload()]},
        ("WORKLOAD", "ADDRESS", "PORTS", "STATE"),
        ("LABELS", "LOCALITY", "NETWORK", "WEIGHT", "AGE", "LAST HEARTBEAT"),
        ("version=v2", "eu-west/zone-a", "dc-1", "2d", "3h"),
    ),
    "token list": Listing(
        ("token", "list"),
        "/v1/tokens",
        {"tokens": [onboarding_token()]},
        ("ID", "SERVICE ACCOUNT", "EXPIRES"),
        ("CREATED", "AGE"),
        ("2h",),
    ),
    "identity list": Listing(
        ("identity", "list"),
        "/v1/identities",
        identities(),
        ("COMPONENT", "SERIAL", "REVOKED"),
        ("AGE", "ALSO NAMES", "REVOKED AT"),
        ("a1b2c3d4e5f60718293a", "4d", output.when(NOW - 30)),
    ),
    "spec list": Listing(
        ("spec", "list"),
        "/v1/resources",
        {"source": {"kind": "directory", "path": "examples"}, "resources": example_statuses()},
        ("STATE", "RESOURCE", "WHERE"),
        ("API VERSION", "PARENTS"),
        ("split.smi-spec.io/v1alpha2", "access.smi-spec.io/v1alpha3"),
    ),
    "dst get": Listing(
        ("dst", "get", "web.shop.svc.cluster.local:8080"),
        "/v1/destinations/get",
        destination(),
        ("address", "identity", "hint"),
        ("workload",),
        ("Pod shop/web-1",),
    ),
}


def run(listing: Listing, tmp_path: Path, *extra: str) -> Result:
    with CannedAdmin({("GET", listing.path): Answer(200, listing.body)}) as admin:
        admin.serve(tmp_path, *DEFAULT_ADMIN_PORTS)
        return CliRunner().invoke(cli, ["--state-dir", str(tmp_path), *listing.args, *extra])


def served(body: dict[str, Any]) -> Any:
    """``body`` as it travels: JSON (a tuple arrives as a list)."""
    return json.loads(json.dumps(body))


def header_of(text: str, columns: tuple[str, ...]) -> str:
    return next(line for line in text.splitlines() if all(c in line for c in columns))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", sorted(LISTINGS))
def test_each_listing_prints_each_format(name: str, fmt: str, tmp_path: Path) -> None:
    listing = LISTINGS[name]

    result = run(listing, tmp_path, "-o", fmt)

    assert result.exit_code == 0, result.output
    if fmt == "json":
        assert json.loads(result.stdout) == served(listing.body)  # the answer, as it came
    elif fmt == "yaml":
        assert yaml.safe_load(result.stdout) == served(listing.body)
    else:
        header = header_of(result.stdout, listing.columns)
        for column in listing.wide_columns:
            assert (column in header) == (fmt == "wide"), column
        for cell in listing.wide_cells:
            assert (cell in result.stdout) == (fmt == "wide"), cell


@pytest.mark.parametrize("name", sorted(LISTINGS))
def test_json_is_the_same_as_the_older_flag(name: str, tmp_path: Path) -> None:
    listing = LISTINGS[name]

    assert run(listing, tmp_path, "--json").stdout == run(listing, tmp_path, "-o", "json").stdout


@pytest.mark.parametrize("name", sorted(LISTINGS))
def test_the_default_is_the_table(name: str, tmp_path: Path) -> None:
    listing = LISTINGS[name]

    header = header_of(run(listing, tmp_path).stdout, listing.columns)
    assert header == header_of(run(listing, tmp_path, "-o", "table").stdout, listing.columns)


def test_a_bad_format_names_the_allowed_ones(tmp_path: Path) -> None:
    result = run(LISTINGS["vm list"], tmp_path, "-o", "xml")

    assert result.exit_code == 2
    assert "'xml' is not one of 'table', 'wide', 'json', 'yaml'" in result.stderr


def test_json_with_another_format_is_refused(tmp_path: Path) -> None:
    result = run(LISTINGS["certs list"], tmp_path, "--json", "-o", "wide")

    assert result.exit_code == 2
    assert "--json is the same as -o json; it cannot go with -o wide" in result.stderr


def test_spec_validate_in_every_format(tmp_path: Path) -> None:
    broken = tmp_path / "split.yaml"
    broken.write_text(
        "apiVersion: split.smi-spec.io/v1alpha4\nkind: TrafficSplit\n"
        "metadata: {name: s, namespace: shop}\nspec: {service: web}\n"
    )
    runs = {
        fmt: CliRunner().invoke(cli, ["spec", "validate", str(broken), "-o", fmt])
        for fmt in FORMATS
    }

    assert {fmt: done.exit_code for fmt, done in runs.items()} == dict.fromkeys(FORMATS, 1)
    body = json.loads(runs["json"].stdout)
    assert body["valid"] is False
    assert yaml.safe_load(runs["yaml"].stdout) == body
    assert "API VERSION" in runs["wide"].stdout
    assert "API VERSION" not in runs["table"].stdout
    for fmt, cells in (("table", 5), ("wide", 7)):
        row = next(line for line in runs[fmt].stdout.splitlines() if "TrafficSplit shop/s" in line)
        assert len(row.strip("│ ").split("│")) == cells
        assert "spec.backends" in row


def test_dst_profile_wide_adds_the_routes_labels(tmp_path: Path) -> None:
    profile = dpb.DestinationProfile(fully_qualified_name="web.shop.svc.cluster.local")
    route = profile.routes.add(is_retryable=True, metrics_labels={"route": "get-books"})
    route.condition.path.regex = "/books"
    route.response_classes.add(is_failure=True)
    body = {"profile": readable_profile(profile)}
    listing = Listing(
        ("dst", "profile", "web.shop.svc.cluster.local:8080"),
        "/v1/destinations/profile",
        body,
        (),
        (),
        (),
    )

    table = run(listing, tmp_path, "-o", "table")
    wide = run(listing, tmp_path, "-o", "wide")

    assert table.exit_code == wide.exit_code == 0, table.output + wide.output
    assert "route=get-books" not in table.stdout
    assert "response classes" not in table.stdout
    row = next(line for line in wide.stdout.splitlines() if "get-books" in line)
    assert "route=get-books" in row
    assert row.split("│")[-2].strip() == "1"  # one response class
    assert yaml.safe_load(run(listing, tmp_path, "-o", "yaml").stdout) == body


def readable_profile(profile: dpb.DestinationProfile) -> dict[str, Any]:
    """The profile as proxy-cp's admin API writes it (protobuf's JSON, field names kept)."""
    return json_format.MessageToDict(profile, preserving_proto_field_name=True)

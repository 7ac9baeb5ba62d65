"""``trellis status`` with replicas (``trellis up --replicas``, ``--ha``): every replica is a
row of its own, after its component's first, with its role in each election it takes part
in (leader, or standby and who leads); ``--json`` carries the same."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from trellis_cli.main import cli
from trellis_cli.testing import Answer, CannedAdmin

READY = Answer(200, {"checks": {"redis": True}, "roles": {"certmanager": "leader"}})


def status(leading: bool, holder: str) -> Answer:
    role = {"name": "certmanager", "leading": leading, "holder": holder, "token": 3, "since": 1.0}
    return Answer(200, {"loops": [], "rejections": [], "leadership": [role]})


def test_each_replica_shows_its_role_and_who_leads(tmp_path: Path) -> None:
    with (
        CannedAdmin(
            {("GET", "/readyz"): READY, ("GET", "/v1/status"): status(False, "certmanager-2")}
        ) as first,
        CannedAdmin(
            {("GET", "/readyz"): READY, ("GET", "/v1/status"): status(True, "certmanager-2")}
        ) as second,
        CannedAdmin({("GET", "/readyz"): READY}) as others,
    ):
        first.serve(tmp_path, "certmanager")
        second.serve(tmp_path, "certmanager-2")
        others.serve(tmp_path, "catalog", "catalog-2", "proxy-cp", "endpoints-vm")
        shown = CliRunner().invoke(cli, ["--state-dir", str(tmp_path), "status"])
        listed = CliRunner().invoke(cli, ["--state-dir", str(tmp_path), "status", "--json"])

    assert shown.exit_code == 0, shown.output
    rows = [line for line in shown.stdout.splitlines() if "│" in line or "|" in line]
    names = [row.split()[1] if row.split()[0] in "│|" else row.split()[0] for row in rows]
    assert names.index("certmanager") + 1 == names.index("certmanager-2")
    assert names.index("catalog") + 1 == names.index("catalog-2")
    text = " ".join(shown.stdout.split())
    assert "certmanager: standby (leader: certmanager-2)" in text
    assert "certmanager: leader" in text

    services = {s["service"]: s for s in json.loads(listed.stdout)["services"]}
    assert [r["leading"] for r in services["certmanager-2"]["leadership"]] == [True]
    assert services["certmanager"]["leadership"][0]["holder"] == "certmanager-2"
    assert services["catalog-2"]["leadership"] == []

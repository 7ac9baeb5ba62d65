"""``trellis proxy revoke``: by common name or proxy id, and its exit codes.

The command runs through click's runner against certmanager's admin API served over real
HTTP with canned answers (:class:`trellis_cli.testing.CannedAdmin`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from trellis_cli.client import DEFAULT_ADMIN_PORTS
from trellis_cli.main import cli
from trellis_cli.testing import Answer, CannedAdmin

PROXY_ID = "123e4567-e89b-42d3-a456-426614174000"
CN = f"{PROXY_ID}.bookstore.bookstore"
REVOKE = ("POST", f"/v1/certificates/{CN}/revoke")
REVOKED = {
    "revoked": True,
    "revision": 9,
    "serial": "c0ffee",
    "common_name": CN,
    "not_after": "2030-01-01T00:00:00+00:00",
    "revoked_at": "2029-12-31T00:00:00+00:00",
    "reason": "revoked",
}
LISTED = {"revision": 8, "certificates": [{"common_name": CN, "proxy_id": PROXY_ID}]}


@pytest.fixture(autouse=True)
def admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRELLIS_ADMIN_TOKEN", "test-token")


def trellis(state_dir: Path, answers: dict[tuple[str, str], Answer], *args: str) -> Result:
    admin = CannedAdmin(answers)
    admin.serve(state_dir, *DEFAULT_ADMIN_PORTS)
    with admin:
        return CliRunner().invoke(cli, ["--state-dir", str(state_dir), *args])


def test_revoke_by_common_name(tmp_path: Path) -> None:
    result = trellis(tmp_path, {REVOKE: Answer(200, REVOKED)}, "proxy", "revoke", CN)

    assert result.exit_code == 0, result.output
    assert f"revoked {CN}: serial c0ffee refused from now on (revision 9)" in result.stdout


def test_revoke_by_proxy_id_looks_the_common_name_up(tmp_path: Path) -> None:
    answers = {REVOKE: Answer(200, REVOKED), ("GET", "/v1/certificates"): Answer(200, LISTED)}
    result = trellis(tmp_path, answers, "proxy", "revoke", PROXY_ID, "--json")

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["serial"] == "c0ffee"


def test_an_unknown_proxy_id_is_1(tmp_path: Path) -> None:
    listed = Answer(200, {"revision": 8, "certificates": []})
    result = trellis(tmp_path, {("GET", "/v1/certificates"): listed}, "proxy", "revoke", PROXY_ID)

    assert result.exit_code == 1, result.output
    assert f"no proxy certificate with proxy id {PROXY_ID}" in result.stderr


def test_a_proxy_certmanager_does_not_know_is_1(tmp_path: Path) -> None:
    missing = Answer(404, {"detail": f"no certificate with common name {CN!r}"})
    result = trellis(tmp_path, {REVOKE: missing}, "proxy", "revoke", CN)

    assert result.exit_code == 1, result.output
    assert "404" in result.stderr


def test_a_refused_token_is_2(tmp_path: Path) -> None:
    result = trellis(
        tmp_path, {REVOKE: Answer(403, {"detail": "bad token"})}, "proxy", "revoke", CN
    )

    assert result.exit_code == 2, result.output
    assert "the admin token was refused" in result.stderr


def test_a_name_that_is_neither_is_2_naming_what_is_expected(tmp_path: Path) -> None:
    result = trellis(tmp_path, {}, "proxy", "revoke", "bookstore")

    assert result.exit_code == 2, result.output
    assert "neither a proxy's common name" in result.stderr

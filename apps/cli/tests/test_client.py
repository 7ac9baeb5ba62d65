"""The CLI reaches a service run as replicas (``trellis up --replicas``) through whichever
replica takes the connection, as through a Service: a refused connection delivered
nothing, so asking the next replica is safe."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from trellis_cli.main import cli
from trellis_cli.testing import Answer, CannedAdmin, unreachable

WORKLOADS = {"workloads": [{"name": "vm-1", "namespace": "shop", "alive": True}]}


def test_a_service_whose_first_replica_is_down_answers_through_the_next(tmp_path: Path) -> None:
    with CannedAdmin({("GET", "/v1/workloads"): Answer(200, WORKLOADS)}) as second:
        unreachable(tmp_path, "endpoints-vm")  # the first one was killed
        second.serve(tmp_path, "endpoints-vm-2")
        listed = CliRunner().invoke(cli, ["--state-dir", str(tmp_path), "vm", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert "vm-1" in json.dumps(json.loads(listed.stdout))
    assert [(r.method, r.path) for r in second.received] == [("GET", "/v1/workloads")]


def test_when_no_replica_answers_the_error_names_the_last_address_tried(tmp_path: Path) -> None:
    unreachable(tmp_path, "endpoints-vm")
    unreachable(tmp_path, "endpoints-vm-2", port=7)
    listed = CliRunner().invoke(cli, ["--state-dir", str(tmp_path), "vm", "list"])
    assert listed.exit_code == 2, listed.output
    assert "endpoints-vm is not reachable at http://127.0.0.1:7/v1/workloads" in listed.stderr


def test_an_answer_that_is_an_error_is_not_asked_again_elsewhere(tmp_path: Path) -> None:
    with (
        CannedAdmin({("GET", "/v1/workloads"): Answer(403, {"detail": "no"})}) as first,
        CannedAdmin({("GET", "/v1/workloads"): Answer(200, WORKLOADS)}) as second,
    ):
        first.serve(tmp_path, "endpoints-vm")
        second.serve(tmp_path, "endpoints-vm-2")
        listed = CliRunner().invoke(cli, ["--state-dir", str(tmp_path), "vm", "list"])
    assert listed.exit_code != 0
    assert second.received == []  # a refusal is the service's answer, not an outage

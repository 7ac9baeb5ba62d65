"""Reading AdmissionReview requests and the API server's timeout; writing responses."""

from __future__ import annotations

import base64
import json

import pytest

from trellis_injector.domain import admission
from trellis_injector.domain.admission import MalformedReview


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10s", 10.0), ("30s", 30.0), ("1m30s", 90.0), ("500ms", 0.5), ("1.5s", 1.5)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert admission.parse_timeout(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", [None, "", "10", "ten", "10s junk", "0s", "-1s"])
def test_unreadable_timeouts_are_none(text: str | None) -> None:
    assert admission.parse_timeout(text) is None


def test_a_delete_review_needs_no_object() -> None:
    review = admission.parse_review(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "u1", "operation": "DELETE", "kind": {"kind": "Pod"}},
        }
    )
    assert not review.is_pod_create
    assert review.obj == {}


def test_a_create_without_an_object_is_malformed() -> None:
    with pytest.raises(MalformedReview, match=r"request\.object"):
        admission.parse_review(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {"uid": "u1", "operation": "CREATE", "kind": {"kind": "Pod"}},
            }
        )


def test_responses() -> None:
    patch = [{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]
    allowed = admission.allow("u1", patch, ["x" * 300])["response"]
    assert json.loads(base64.b64decode(allowed["patch"])) == patch
    assert allowed["patchType"] == "JSONPatch"
    assert len(allowed["warnings"][0]) == admission.MAX_WARNING
    denied = admission.deny("u2", 400, "no")["response"]
    assert denied == {"uid": "u2", "allowed": False, "status": {"code": 400, "message": "no"}}

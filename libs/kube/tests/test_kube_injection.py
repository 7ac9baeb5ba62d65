"""Whether a pod is injected, and the exclusion annotations: one answer for the webhook and
for `trellis inject check`."""

from __future__ import annotations

from typing import Any

import pytest

from trellis_kube import injection
from trellis_kube.injection import InvalidAnnotation


def pod(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"generateName": "web-"}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": {"containers": [{"name": "web"}], **spec}}


def test_a_plain_pod_is_injected() -> None:
    decision = injection.decide(pod())
    assert decision.inject
    assert decision.exclusions == injection.Exclusions()


@pytest.mark.parametrize(
    ("the_pod", "outcome"),
    [
        (pod({"trellis.dev/sidecar-injection": "disabled"}), "skipped_opt_out"),
        (pod({"trellis.dev/sidecar-injection": " Disabled "}), "skipped_opt_out"),
        (pod({"trellis.dev/sidecar-injection": "enabled"}), "inject"),
        (pod({"trellis.dev/sidecar-injection": "off"}), "denied_invalid"),
        (pod(containers=[{"name": "web"}, {"name": "envoy"}]), "skipped_already"),
        (pod(hostNetwork=True), "skipped_host_network"),
        (pod({"trellis.dev/outbound-port-exclusion-list": "0"}), "denied_invalid"),
    ],
)
def test_outcomes(the_pod: dict[str, Any], outcome: str) -> None:
    decision = injection.decide(the_pod)
    assert decision.outcome == outcome
    assert decision.reason


def test_exclusion_lists_are_parsed_and_deduplicated() -> None:
    found = injection.exclusions(
        {
            injection.OUTBOUND_PORTS_ANNOTATION: "5432, 6379,5432",
            injection.INBOUND_PORTS_ANNOTATION: "",
            injection.OUTBOUND_RANGES_ANNOTATION: "10.0.0.0/8, 10.1.2.3, 10.0.0.0/8",
        }
    )
    assert found.outbound_ports == (5432, 6379)
    assert found.inbound_ports == ()
    assert found.outbound_ranges == ("10.0.0.0/8", "10.1.2.3/32")


def test_osms_exclusion_annotations_count_and_join_trellis_own() -> None:
    found = injection.exclusions(
        {
            injection.OUTBOUND_PORTS_ANNOTATION: "5432",
            "openservicemesh.io/outbound-port-exclusion-list": "6379,5432",
            "openservicemesh.io/inbound-port-exclusion-list": "9090",
            "openservicemesh.io/outbound-ip-range-exclusion-list": "169.254.169.254",
        }
    )
    assert found.outbound_ports == (5432, 6379)
    assert found.inbound_ports == (9090,)
    assert found.outbound_ranges == ("169.254.169.254/32",)
    with pytest.raises(InvalidAnnotation, match=r"openservicemesh\.io/inbound-port-exclusion-list"):
        injection.exclusions({"openservicemesh.io/inbound-port-exclusion-list": "x"})


@pytest.mark.parametrize(
    ("annotation", "value", "says"),
    [
        (injection.OUTBOUND_PORTS_ANNOTATION, "5432,,6379", "empty item"),
        (injection.OUTBOUND_PORTS_ANNOTATION, "65536", "not a port"),
        (injection.INBOUND_PORTS_ANNOTATION, "-1", "not a port"),
        (injection.OUTBOUND_RANGES_ANNOTATION, "10.0.0.0/40", "not an IP range"),
        (injection.OUTBOUND_RANGES_ANNOTATION, "fd00::/8", "IPv6"),
    ],
)
def test_bad_values_name_the_annotation(annotation: str, value: str, says: str) -> None:
    with pytest.raises(InvalidAnnotation, match=says) as caught:
        injection.exclusions({annotation: value})
    assert caught.value.annotation == annotation
    assert annotation in str(caught.value)


def test_namespace_selection_is_the_monitored_label() -> None:
    label = "trellis.dev/monitored-by"
    assert injection.namespace_selected({label: "trellis"}, label, "trellis")
    assert not injection.namespace_selected({label: "other"}, label, "trellis")
    assert not injection.namespace_selected({}, label, "trellis")

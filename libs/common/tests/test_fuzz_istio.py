"""Fuzzing the ServiceEntry/WorkloadEntry parser with specs built field by field.

Random structures rarely get past the first field; these specs are assembled from valid,
near-valid and wrong values for every field (hosts, ports, resolutions, endpoint
addresses, ...), so the rules relating fields are reached. Whatever the spec: the parser
answers a document or a DocumentError naming a field under ``spec``; and what it accepts
keeps Istio's rules, so endpoints-vm can trust it (checked here again, independently).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from trellis_common.documents import istio
from trellis_common.documents.base import Document, DocumentError, KindRegistry
from trellis_common.specdir import parse_file
from trellis_testing import strategies as fuzz

REGISTRY = KindRegistry()
istio.register(REGISTRY)


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("istio") / "entries.yaml"


def parse(path: Path, document: dict[str, Any], where: str = "spec") -> Document | DocumentError:
    """``document`` through the spec directory's parser; an error must name a field ``where``."""
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    documents, errors = parse_file(path, REGISTRY)
    assert len(documents) + len(errors) == 1, (documents, errors)
    if errors:
        error = errors[0]
        assert isinstance(error, DocumentError)
        assert error.field, f"{error} names no field"
        assert error.field.startswith(where), f"{error} does not name a field in {where}"
        assert f" {error.field}:" in str(error)
        assert error.reason.strip()
        return error
    return documents[0]


def entry(kind: str, version: str, spec: Any) -> dict[str, Any]:
    metadata = {"name": "e", "namespace": "shop"}
    return {"apiVersion": version, "kind": kind, "metadata": metadata, "spec": spec}


def is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def check_workload(entry: istio.WorkloadEntrySpec) -> None:
    address = entry.address
    if entry.is_unix:
        assert address.startswith("unix:///")
        assert len(address) > len("unix:///")
    elif not is_ip(address):
        assert address == address.lower()
        assert "*" not in address
        assert len(address) <= 253
    assert all(1 <= number <= 65535 for number in entry.ports.values())
    assert 0 <= entry.weight <= 2**32 - 1
    assert "" not in entry.locality.split("/") or not entry.locality
    assert entry.service_account == entry.service_account.lower()


def check_service_entry(spec: istio.ServiceEntrySpec) -> None:
    assert spec.hosts
    assert spec.ports
    for host in spec.hosts:
        assert not is_ip(host)
        assert "*" not in host.removeprefix("*.")
    numbers = [p.number for p in spec.ports]
    names = [p.name for p in spec.ports]
    assert len(set(numbers)) == len(numbers)
    assert len(set(names)) == len(names)
    assert all(1 <= n <= 65535 for n in numbers)
    resolution = spec.resolution
    if resolution is istio.Resolution.NONE:
        assert spec.endpoints == ()
    if resolution is istio.Resolution.DNS_ROUND_ROBIN:
        assert len(spec.endpoints) <= 1
    if spec.endpoints:
        assert spec.workload_selector is None
    for endpoint in spec.endpoints:
        check_workload(endpoint)
        if resolution is istio.Resolution.STATIC:
            assert endpoint.is_unix or is_ip(endpoint.address)
        if endpoint.is_unix:
            assert resolution is istio.Resolution.STATIC
            assert len(spec.ports) == 1
        assert set(endpoint.ports) <= set(names)
    assert len(set(spec.export_to)) == len(spec.export_to)
    for alone in ("*", "~"):
        assert alone not in spec.export_to or len(spec.export_to) == 1


@given(
    version=st.sampled_from(istio.API_VERSIONS),
    spec=fuzz.service_entry_specs(),
)
@example(
    version="networking.istio.io/v1",
    spec={"hosts": ["a.example.com"], "ports": [{"number": 80, "name": "http"}], "addresses": []},
)
def test_service_entries_are_taken_consistent_or_refused_naming_the_field(
    spec_file: Path, version: str, spec: dict[str, Any]
) -> None:
    parsed = parse(spec_file, entry("ServiceEntry", version, spec))
    if isinstance(parsed, Document):
        check_service_entry(parsed.resource.spec)


@given(
    version=st.sampled_from(istio.API_VERSIONS),
    spec=fuzz.workload_entry_specs(),
)
def test_workload_entries_are_taken_valid_or_refused_naming_the_field(
    spec_file: Path, version: str, spec: dict[str, Any]
) -> None:
    parsed = parse(spec_file, entry("WorkloadEntry", version, spec))
    if isinstance(parsed, Document):
        check_workload(parsed.resource.spec)


@given(data=st.data())
def test_mutated_service_and_workload_entries(spec_file: Path, data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["ServiceEntry", "WorkloadEntry"]), label="kind")
    document, _ = data.draw(fuzz.mutations(fuzz.seeds(kind), max_mutations=2), label="doc")
    parsed = parse(spec_file, document, where="")
    if isinstance(parsed, Document):
        spec = parsed.resource.spec
        (check_service_entry if kind == "ServiceEntry" else check_workload)(spec)

"""Fuzzing the spec loader, every kind, through the entry point the spec directory uses.

Each example is written to a file and read back with :func:`specdir.parse_file`, as a
``SpecDirectory`` scan reads it (YAML text, several documents, the previous version of each
document). The promises checked, whatever the input:

- nothing but a :class:`DocumentError` comes out: no exception escapes;
- every error explains itself: a reason, and a field path in the document (``spec.ports[0]``)
  unless the whole document or file is wrong (not a mapping, not YAML);
- an invalid new version never replaces the last good one of the same document.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from trellis_common.documents import all_kinds
from trellis_common.documents.base import Document, DocumentError
from trellis_common.specdir import parse_file
from trellis_testing import strategies as fuzz
from trellis_testing.seeds import SEEDS

REGISTRY = all_kinds()
KINDS = sorted(REGISTRY.kinds())
ROOT_FIELDS = {"apiVersion", "kind", "metadata", "spec"}


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One file, rewritten for every example (hypothesis runs examples in one test call)."""
    return tmp_path_factory.mktemp("spec") / "fuzz.yaml"


def load(
    path: Path, content: str | bytes, previous: list[Document] | None = None
) -> tuple[list[Document], list[DocumentError]]:
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return parse_file(path, REGISTRY, None, previous or ())


def dump(*documents: Any) -> str:
    return yaml.safe_dump_all(documents, sort_keys=False, allow_unicode=True)


def explained(error: DocumentError, path: Path, *, whole: bool = False) -> None:
    """``error`` says where and why; ``whole``: it may be about the document as a whole."""
    assert isinstance(error, DocumentError)
    assert error.origin.source == str(path)
    assert error.reason.strip(), f"{error!r} gives no reason"
    if not whole:
        assert error.field, f"{error} names no field"
    if error.field:
        assert f" {error.field}:" in str(error)
        head = error.field.split(".")[0].split("[")[0]
        assert head in ROOT_FIELDS, f"{error} names a field outside any document"


def all_seed_pairs() -> Iterator[tuple[str, str]]:
    for kind in KINDS:
        for version in REGISTRY.versions(kind):
            yield version, kind


def test_the_seeds_cover_every_kind_and_version_and_are_valid(spec_file: Path) -> None:
    assert {(s["apiVersion"], s["kind"]) for s in SEEDS} == set(all_seed_pairs())
    documents, errors = load(spec_file, dump(*SEEDS))
    assert errors == []
    assert len(documents) == len(SEEDS)


@pytest.mark.parametrize("kind", KINDS)
@given(data=st.data())
def test_a_mutated_document_is_taken_or_refused_naming_the_field_and_the_last_good_stays(
    spec_file: Path, kind: str, data: st.DataObject
) -> None:
    seed = data.draw(fuzz.seeds(kind), label="seed")
    previous, errors = load(spec_file, dump(seed))
    assert not errors
    document, _ = data.draw(fuzz.mutations(st.just(seed)), label="mutated")
    documents, errors = load(spec_file, dump(document), previous)

    for error in errors:
        explained(error, spec_file)
    if errors and errors[0].key == previous[0].key:  # the same document, now invalid
        assert documents == previous
        assert documents[0].resource is previous[0].resource
    else:
        assert len(documents) + len(errors) == 1, (documents, errors)
    for taken in documents:
        assert taken.key.kind == kind


def _documents_of_known_kinds() -> st.SearchStrategy[dict[str, Any]]:
    pairs = sorted(all_seed_pairs())
    return st.builds(
        lambda pair, metadata, spec, extra: {
            "apiVersion": pair[0],
            "kind": pair[1],
            "metadata": metadata,
            "spec": spec,
            **extra,
        },
        st.sampled_from(pairs),
        st.one_of(
            st.fixed_dictionaries({"name": fuzz.names()}, optional={"namespace": fuzz.names()}),
            fuzz.yaml_values(),
        ),
        fuzz.yaml_values(),
        st.dictionaries(st.text(max_size=5), fuzz.yaml_values(max_leaves=3), max_size=2),
    )


@given(document=_documents_of_known_kinds())
@example(
    document={
        "apiVersion": "config.trellis.io/v1alpha1",
        "kind": "MeshConfig",
        "metadata": {"name": "m"},
        "spec": {"certificate": {"serviceCertValidityDuration": "9" * 5000 + "h"}},
    }
)
def test_random_structures_of_every_kind_are_refused_naming_the_field(
    spec_file: Path, document: dict[str, Any]
) -> None:
    documents, errors = load(spec_file, dump(document))
    assert len(documents) + len(errors) == 1
    for error in errors:
        explained(error, spec_file)


@given(documents=st.lists(fuzz.yaml_values(), min_size=1, max_size=4))
def test_any_yaml_values_as_documents(spec_file: Path, documents: list[Any]) -> None:
    taken, errors = load(spec_file, dump(*documents))
    assert len(taken) + len(errors) <= len(documents)
    for error in errors:
        explained(error, spec_file, whole=True)


@given(text=st.text(max_size=300) | st.binary(max_size=300))
@example(text="a: &a [*a]\n")  # a recursive alias
@example(text="[" * 2000)  # deeper than the YAML parser recurses
@example(text="{? [1]: x}")  # an unhashable key
@example(text="kind: Service\napiVersion: v1\nmetadata: {name: a}\nspec: {ports: &p [*p]}")
@example(text=b"\xff\xfe\x00bad utf-8")
def test_any_text_as_a_file(spec_file: Path, text: str | bytes) -> None:
    documents, errors = load(spec_file, text)
    for error in errors:
        explained(error, spec_file, whole=True)
    assert all(not math.isnan(d.origin.index) for d in documents)


@given(regex=fuzz.regexes(), in_header=st.booleans())
@example(regex="(" * 3000 + ")" * 3000, in_header=False)  # RecursionError escaped the parser
@example(regex="a{99999999999}", in_header=True)  # so did OverflowError
def test_route_regexes_are_taken_or_refused_naming_the_match(
    spec_file: Path, regex: str, in_header: bool
) -> None:
    match: dict[str, Any] = {"name": "m"}
    if in_header:
        match["headers"] = {"x-user": regex}
    else:
        match["pathRegex"] = regex
    document = {
        "apiVersion": "specs.smi-spec.io/v1alpha4",
        "kind": "HTTPRouteGroup",
        "metadata": {"name": "routes"},
        "spec": {"matches": [match]},
    }
    documents, errors = load(spec_file, dump(document))
    assert len(documents) + len(errors) == 1
    for error in errors:
        explained(error, spec_file)
        where = "spec.matches[0].headers" if in_header else "spec.matches[0].pathRegex"
        assert error.field.startswith(where)

"""Loading one YAML file at a bounded cost: size, alias expansion, recursive aliases."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from trellis_common.documents import yamlfile
from trellis_common.documents.yamlfile import Limits, TooCostly


def laughs(levels: int) -> bytes:
    lines = ['l0: &l0 "lol"']
    for level in range(1, levels + 1):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]")
    return ("\n".join(lines) + "\n").encode()


def test_documents_load_as_safe_yaml(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text("a: &x {k: 1}\nb: *x\nc: {<<: *x, j: 2}\n---\n---\n- !!str 3\n")

    assert yamlfile.load(path) == [
        {"a": {"k": 1}, "b": {"k": 1}, "c": {"k": 1, "j": 2}},
        None,
        ["3"],
    ]


def test_the_size_is_checked_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_bytes(b"a: 1\n" * 20)

    assert yamlfile.load(path, Limits(max_file_bytes=100)) == [{"a": 1}]
    with pytest.raises(TooCostly) as caught:
        yamlfile.load(path, Limits(max_file_bytes=99))
    assert str(caught.value) == (
        "file too large: 100 bytes, over the limit of 99 bytes (max_file_bytes); not read"
    )


def test_a_billion_laughs_is_refused_in_bounded_memory() -> None:
    tracemalloc.start()
    try:
        with pytest.raises(TooCostly) as caught:
            yamlfile.load_bytes(laughs(9), 10_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # 9 ** 9 + 9 ** 8 + ... nodes once expanded; only the composed graph was built.
    assert "more than 10000 extra nodes (490329045 so far, max_alias_nodes)" in str(caught.value)
    assert peak < 1024 * 1024


def test_the_budget_is_the_nodes_aliases_add() -> None:
    text = laughs(2)  # l1: 9 aliases of l0 (9 nodes added); l2: 9 of l1 (9 * 10 added)
    assert yamlfile.load_bytes(text, 99) != []
    with pytest.raises(TooCostly):
        yamlfile.load_bytes(text, 98)


@pytest.mark.parametrize("text", [b"a: &a [1, *a]\n", b"&m {k: *m}\n"])
def test_a_recursive_alias_is_refused(text: bytes) -> None:
    with pytest.raises(TooCostly, match="a recursive alias"):
        yamlfile.load_bytes(text, 10_000)

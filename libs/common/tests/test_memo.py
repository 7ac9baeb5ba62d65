"""Members: conversions reused per collection; sorted_unique: the sort C does."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trellis_common.memo import Members, sorted_unique


@dataclass(frozen=True, slots=True, order=True)
class Point:
    address: str
    port: int
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True, order=True)
class Other:
    address: str
    port: int
    labels: tuple[tuple[str, str], ...] = ()


class Counting:
    def __init__(self) -> None:
        self.calls: list[tuple[Point, object]] = []

    def __call__(self, point: Point, context: object) -> str:
        self.calls.append((point, context))
        if point.port < 0:
            raise ValueError(f"port {point.port}")
        return f"{point.address}:{point.port}@{context}"


def test_by_identity_converts_each_object_once_and_keeps_order() -> None:
    convert = Counting()
    memo: Members[str, Point, str] = Members(convert)
    a, b, c = Point("10.0.0.1", 80), Point("10.0.0.2", 80), Point("10.0.0.3", 80)
    assert memo.convert("svc", [a, b]) == ["10.0.0.1:80@None", "10.0.0.2:80@None"]
    assert memo.convert("svc", [c, b, a]) == [
        "10.0.0.3:80@None",
        "10.0.0.2:80@None",
        "10.0.0.1:80@None",
    ]
    assert [p for p, _ in convert.calls] == [a, b, c]
    assert (memo.hits, memo.misses) == (2, 3)


def test_by_identity_an_equal_new_object_is_converted_again() -> None:
    convert = Counting()
    memo: Members[str, Point, str] = Members(convert)
    memo.convert("svc", [Point("10.0.0.1", 80)])
    memo.convert("svc", [Point("10.0.0.1", 80)])
    assert len(convert.calls) == 2


def test_by_key_an_equal_new_object_is_reused() -> None:
    convert = Counting()
    memo: Members[str, Point, str] = Members(convert, key=lambda p: (p.address, p.port))
    first = memo.convert("svc", [Point("10.0.0.1", 80)])
    again = memo.convert("svc", [Point("10.0.0.1", 80)])
    assert first == again
    assert len(convert.calls) == 1


def test_only_the_last_conversion_of_a_collection_is_kept() -> None:
    convert = Counting()
    memo: Members[str, Point, str] = Members(convert)
    a, b = Point("10.0.0.1", 80), Point("10.0.0.2", 80)
    memo.convert("svc", [a, b])
    memo.convert("svc", [a])  # b left the collection
    memo.convert("svc", [a, b])
    assert [p for p, _ in convert.calls] == [a, b, b]


def test_collections_are_apart() -> None:
    convert = Counting()
    memo: Members[str, Point, str] = Members(convert)
    a = Point("10.0.0.1", 80)
    memo.convert("one", [a])
    memo.convert("two", [a])
    assert len(convert.calls) == 2


def test_a_new_context_converts_everything_again() -> None:
    convert = Counting()
    memo: Members[str, Point, str] = Members(convert)
    a = Point("10.0.0.1", 80)
    assert memo.convert("svc", [a], context="http") == ["10.0.0.1:80@http"]
    assert memo.convert("svc", [a], context="http") == ["10.0.0.1:80@http"]
    assert memo.convert("svc", [a], context="grpc") == ["10.0.0.1:80@grpc"]
    assert [c for _, c in convert.calls] == ["http", "grpc"]


def test_a_conversion_that_raises_keeps_the_last_state() -> None:
    convert = Counting()
    memo: Members[str, Point, str] = Members(convert)
    a = Point("10.0.0.1", 80)
    memo.convert("svc", [a])
    with pytest.raises(ValueError, match="port -1"):
        memo.convert("svc", [a, Point("10.0.0.2", -1)])
    memo.convert("svc", [a])
    assert len(convert.calls) == 2  # a once, the bad one once


def test_forget_and_retain() -> None:
    convert = Counting()
    memo: Members[str, Point, str] = Members(convert)
    a = Point("10.0.0.1", 80)
    for name in ("one", "two", "three"):
        memo.convert(name, [a])
    memo.forget("one")
    memo.forget("missing")
    assert len(memo) == 2
    memo.retain(lambda c: c == "three")
    assert len(memo) == 1
    memo.convert("two", [a])
    memo.convert("three", [a])
    assert len(convert.calls) == 4  # "two" again, "three" reused


points = st.builds(
    Point,
    st.sampled_from(["10.0.0.1", "10.0.0.2", "10.0.0.10", "fe80::1"]),
    st.integers(0, 3),
    st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from("xy")), max_size=2).map(tuple),
)


@given(st.lists(points, max_size=30))
def test_sorted_unique_is_sorted_set(values: list[Point]) -> None:
    found = sorted_unique(values)
    assert found == tuple(sorted(set(values)))
    assert all(type(v) is Point for v in found)


def test_sorted_unique_of_mixed_classes_compares_as_they_would() -> None:
    with pytest.raises(TypeError):  # dataclasses of two classes have no order
        sorted_unique([Point("a", 1), Other("a", 2)])
    assert sorted_unique([]) == ()

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


pool = [Point(f"10.0.0.{i}", i % 3) for i in range(8)]
steps = st.lists(
    st.tuples(
        st.sampled_from(["svc", "other"]),
        st.lists(st.integers(0, len(pool) - 1), max_size=12),  # duplicates and reorders too
        st.sampled_from(["http", "http", "grpc"]),
    ),
    max_size=25,
)


@given(steps)
def test_by_identity_converts_only_what_the_last_list_did_not_hold(
    plan: list[tuple[str, list[int], str]],
) -> None:
    """Against the rule itself: every answer is each member converted, in order, and a
    member converted again only when the collection's last list (same context) lacked it."""
    convert = Counting()
    memo: Members[str, Point, str] = Members(convert)
    last: dict[str, tuple[str, list[Point]]] = {}
    for collection, indices, context in plan:
        members = [pool[i] for i in indices]
        before = len(convert.calls)
        found = memo.convert(collection, members, context)
        assert found == [f"{p.address}:{p.port}@{context}" for p in members]
        held = last.get(collection)
        kept = held[1] if held is not None and held[0] == context else []
        wanted = [p for p in dict.fromkeys(members) if all(p is not k for k in kept)]
        converted = [p for p, _ in convert.calls[before:]]
        assert sorted(map(id, dict.fromkeys(converted))) == sorted(map(id, wanted))
        assert len(converted) <= len(members)
        last[collection] = (context, members)


def test_by_identity_one_member_moved_in_a_long_list_converts_one() -> None:
    convert = Counting()
    memo: Members[str, Point, str] = Members(convert)
    members = [Point(f"10.0.{i // 250}.{i % 250}", 80) for i in range(200)]
    memo.convert("svc", members)
    added = Point("10.1.0.1", 80)
    changed = [*members[:120], added, *members[121:]]  # one out, one in, in its place
    found = memo.convert("svc", changed)
    assert found[120] == "10.1.0.1:80@None"
    assert found[:120] + found[121:] == [
        f"{p.address}:80@None" for p in members if p is not members[120]
    ]
    assert [p for p, _ in convert.calls[200:]] == [added]
    assert (memo.hits, memo.misses) == (199, 201)
    back = memo.convert("svc", [*changed[:10], *changed[11:]])  # one gone
    assert len(back) == 199
    assert len(convert.calls) == 201


def test_the_list_returned_is_the_callers_own() -> None:
    memo: Members[str, Point, str] = Members(Counting())
    a = Point("10.0.0.1", 80)
    memo.convert("svc", [a]).append("mine")
    assert memo.convert("svc", [a]) == ["10.0.0.1:80@None"]


@given(steps)
def test_by_key_converts_only_keys_the_last_list_did_not_hold(
    plan: list[tuple[str, list[int], str]],
) -> None:
    """The same rule by key: new objects each time (as messages parsed anew), equal keys."""
    convert = Counting()
    memo: Members[str, Point, str] = Members(convert, key=lambda p: (p.address, p.port))
    last: dict[str, tuple[str, set[tuple[str, int]]]] = {}
    for collection, indices, context in plan:
        members = [Point(pool[i].address, pool[i].port) for i in indices]  # fresh objects
        before = len(convert.calls)
        found = memo.convert(collection, members, context)
        assert found == [f"{p.address}:{p.port}@{context}" for p in members]
        held = last.get(collection)
        kept = held[1] if held is not None and held[0] == context else set()
        keys = {(p.address, p.port) for p in members}
        converted = [(p.address, p.port) for p, _ in convert.calls[before:]]
        assert set(converted) == keys - kept  # a new key twice in one list: converted twice
        last[collection] = (context, keys)


def test_keys_read_by_the_caller_are_used_as_the_key_would_give_them() -> None:
    converted: list[str] = []

    def convert(member: tuple[str, int], _: object) -> str:
        converted.append(member[0])
        return f"{member[0]}:{member[1]}"

    memo: Members[str, tuple[str, int], str] = Members(convert, key=lambda m: m[0])
    first = [("a", 1), ("b", 2)]
    assert memo.convert("c", first, keys=["a", "b"]) == ["a:1", "b:2"]
    assert memo.convert("c", [("b", 2), ("x", 3)], keys=["b", "x"]) == ["b:2", "x:3"]
    assert converted == ["a", "b", "x"]  # "b" was found by the key given
    with pytest.raises(ValueError, match="one per member"):
        memo.convert("c", first, keys=["a"])
    plain: Members[str, tuple[str, int], str] = Members(convert)
    with pytest.raises(ValueError, match="with a key"):
        plain.convert("c", first, keys=["a", "b"])

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from pathlib import Path

import pytest

from trellis_common.documents.base import (
    DocumentError,
    DocumentKey,
    KindRegistry,
    Origin,
    Resource,
    StrictModel,
    UnreadKind,
)
from trellis_common.documents.yamlfile import Limits
from trellis_common.specdir import SpecChange, SpecDirectory, load_paths
from trellis_testing import eventually

API = "test.trellis.io/v1"


class WidgetSpec(StrictModel):
    size: int
    color: str = "red"


class Widget(Resource[WidgetSpec]):
    pass


class GadgetSpec(StrictModel):
    enabled: bool


class Gadget(Resource[GadgetSpec]):
    pass


@pytest.fixture
def registry() -> KindRegistry:
    registry = KindRegistry()
    registry.register("Widget", [API], Widget)
    registry.register("Gadget", [API], Gadget)
    return registry


def widget(name: str, size: object = 1, namespace: str = "default") -> str:
    return (
        f"apiVersion: {API}\nkind: Widget\n"
        f"metadata: {{name: {name}, namespace: {namespace}}}\nspec: {{size: {size}}}\n"
    )


def gadget(name: str) -> str:
    return f"apiVersion: {API}\nkind: Gadget\nmetadata: {{name: {name}}}\nspec: {{enabled: true}}\n"


def docs(*parts: str) -> str:
    return "---\n".join(parts)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def key(name: str, kind: str = "Widget", namespace: str = "default") -> DocumentKey:
    return DocumentKey(kind, namespace, name)


def names(change: SpecChange) -> tuple[list[str], list[str], list[str]]:
    return (
        [d.key.name for d in change.added],
        [d.key.name for d in change.updated],
        [k.name for k in change.removed],
    )


def size(spec: SpecDirectory, name: str) -> int:
    value: int = spec.current()[key(name)].resource.spec.size
    return value


# Reading


def test_several_documents_per_file_skipping_empty_ones(
    tmp_path: Path, registry: KindRegistry
) -> None:
    path = write(
        tmp_path / "mesh.yaml", docs(widget("a"), "\n", widget("b"), gadget("c")) + "---\n"
    )
    spec = SpecDirectory(tmp_path, registry)

    change = spec.scan()

    assert [d.key for d in change.added] == [key("c", "Gadget"), key("a"), key("b")]
    assert change.errors == ()
    assert spec.current()[key("b")].origin == Origin(str(path), 2)
    assert spec.current()[key("b")].api_version == API


def test_recursive_ignoring_hidden_temp_and_other_files(
    tmp_path: Path, registry: KindRegistry
) -> None:
    write(tmp_path / "a.yaml", widget("a"))
    write(tmp_path / "sub" / "deeper" / "b.yml", widget("b"))
    ignored = [
        ".hidden.yaml",
        "a.yaml~",
        ".a.yaml.swp",
        "a.yaml.swp",
        "a.yaml.swx",
        "a.yaml.tmp",
        "#a.yaml#",
        "notes.txt",
        ".git/c.yaml",
    ]
    for i, name in enumerate(ignored):
        write(tmp_path / name, widget(f"ignored-{i}"))
    (tmp_path / "sub" / "loop").symlink_to(tmp_path, target_is_directory=True)
    (tmp_path / "b-link.yaml").symlink_to(tmp_path / "sub" / "deeper" / "b.yml")
    spec = SpecDirectory(tmp_path, registry)

    change = spec.scan()

    assert sorted(k.name for k in spec.current()) == ["a", "b"]
    assert change.errors == ()  # the file reached twice is read once: no conflict


def test_kinds_filter_skips_other_kinds_but_not_kindless_documents(
    tmp_path: Path, registry: KindRegistry
) -> None:
    other = "apiVersion: other.io/v1\nkind: Unknown\nmetadata: {name: u}\n"
    kindless = f"apiVersion: {API}\nmetadata: {{name: k}}\n"
    write(tmp_path / "a.yaml", docs(widget("w"), gadget("g"), other, kindless, "- a list\n"))

    widgets = SpecDirectory(tmp_path, registry, kinds=["Widget"])
    widgets.scan()
    assert list(widgets.current()) == [key("w")]
    assert [(e.origin.index, e.field) for e in widgets.errors()] == [(3, "kind"), (4, "")]
    assert "mapping" in widgets.errors()[1].reason

    everything = SpecDirectory(tmp_path, registry)
    everything.scan()
    assert sorted(everything.current()) == [key("g", "Gadget"), key("w")]
    assert [e.origin.index for e in everything.errors()] == [2, 3, 4]


def test_unread_kinds_are_reported_as_ignored_by_the_one_reader_that_asks(
    tmp_path: Path, registry: KindRegistry
) -> None:
    grpc_route = (
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\n"
        "metadata: {name: r, namespace: shop}\nspec: {}\n"
    )
    write(tmp_path / "a.yaml", docs(widget("w"), gadget("g"), grpc_route))

    quiet = SpecDirectory(tmp_path, registry, kinds=["Widget"])
    quiet.scan()
    assert quiet.errors() == []  # Gadget is another reader's; GRPCRoute left to the reporter

    reporter = SpecDirectory(tmp_path, registry, kinds=["Widget"], report_unread=True)
    reporter.scan()
    assert list(reporter.current()) == [key("w")]
    [ignored] = reporter.errors()
    assert isinstance(ignored, UnreadKind)
    assert ignored.key == DocumentKey("GRPCRoute", "shop", "r")
    assert ignored.reason == (
        "GRPCRoute (gateway.networking.k8s.io/v1) is not read by any Trellis service: ignored"
    )


# Changes


def test_add_change_delete_each_reported_once(tmp_path: Path, registry: KindRegistry) -> None:
    write(tmp_path / "a.yaml", widget("a"))
    spec = SpecDirectory(tmp_path, registry)
    assert names(spec.scan()) == (["a"], [], [])
    assert spec.scan().empty

    write(tmp_path / "b.yaml", widget("b"))
    assert names(spec.scan()) == (["b"], [], [])
    assert spec.scan().empty

    write(tmp_path / "a.yaml", widget("a", size=2))
    change = spec.scan()
    assert names(change) == ([], ["a"], [])
    assert change.updated[0].resource.spec.size == 2
    assert spec.scan().empty

    write(tmp_path / "a.yaml", "# same documents, new comment\n" + widget("a", size=2))
    assert spec.scan().empty  # re-read, but nothing changed

    (tmp_path / "b.yaml").unlink()
    assert names(spec.scan()) == ([], [], ["b"])
    assert spec.scan().empty
    assert list(spec.current()) == [key("a")]


def test_in_place_rewrite_detected_when_mtime_is_unchanged(
    tmp_path: Path, registry: KindRegistry
) -> None:
    path = write(tmp_path / "a.yaml", widget("a", size=1))
    spec = SpecDirectory(tmp_path, registry)
    spec.scan()
    before = path.stat()

    with path.open("w") as f:  # same inode, different size
        f.write(widget("a", size=1000))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_ino == before.st_ino

    assert names(spec.scan()) == ([], ["a"], [])
    assert size(spec, "a") == 1000


def test_atomic_replace_detected_when_mtime_and_size_are_unchanged(
    tmp_path: Path, registry: KindRegistry
) -> None:
    path = write(tmp_path / "a.yaml", widget("a", size=1))
    spec = SpecDirectory(tmp_path, registry)
    spec.scan()
    before = path.stat()

    tmp = write(tmp_path / ".a.yaml.tmp", widget("a", size=2))  # same size, new inode
    os.utime(tmp, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert spec.scan().empty  # the temp file is not read
    os.replace(tmp, path)
    assert path.stat().st_size == before.st_size

    assert names(spec.scan()) == ([], ["a"], [])
    assert size(spec, "a") == 2


def test_broken_yaml_keeps_previous_documents_and_reports_position(
    tmp_path: Path, registry: KindRegistry
) -> None:
    path = write(tmp_path / "a.yaml", docs(widget("a"), widget("b")))
    spec = SpecDirectory(tmp_path, registry)
    spec.scan()

    write(path, docs(widget("a", size=5), "kind: Widget\nmetadata:\n name: b\n  bad: x\n"))
    change = spec.scan()

    assert names(change) == ([], [], [])
    assert not change.empty  # the errors changed
    [error] = change.errors
    assert error.origin == Origin(str(path))
    assert error.field == ""
    assert "line 9, column 6" in error.reason
    assert "mapping values are not allowed" in error.reason
    assert sorted(spec.current()) == [key("a"), key("b")]
    assert size(spec, "a") == 1  # the half of the file that parsed is not taken either
    assert spec.scan().empty  # reported once

    write(path, docs(widget("a", size=5), widget("b")))
    change = spec.scan()
    assert names(change) == ([], ["a"], [])
    assert change.errors == ()
    assert not change.empty


def test_unreadable_file_keeps_previous_documents(tmp_path: Path, registry: KindRegistry) -> None:
    path = write(tmp_path / "a.yaml", widget("a"))
    spec = SpecDirectory(tmp_path, registry)
    spec.scan()

    path.unlink()
    path.symlink_to(path.name)  # a symlink loop: stat fails with ELOOP
    change = spec.scan()

    assert names(change) == ([], [], [])
    assert [(e.origin.source, e.reason.split(":")[0]) for e in change.errors] == [
        (str(path), "cannot read")
    ]
    assert list(spec.current()) == [key("a")]
    assert spec.scan().empty


def test_invalid_document_keeps_its_previous_version_and_the_other_documents(
    tmp_path: Path, registry: KindRegistry
) -> None:
    path = write(tmp_path / "a.yaml", docs(widget("a"), widget("b"), widget("c")))
    spec = SpecDirectory(tmp_path, registry)
    spec.scan()

    write(path, docs(widget("a", size=2), widget("b", size="big"), widget("d", size="x")))
    change = spec.scan()

    assert names(change) == ([], ["a"], ["c"])  # c was deleted from the file on purpose
    assert sorted(spec.current()) == [key("a"), key("b")]
    assert size(spec, "b") == 1
    assert [(e.key, e.origin.index, e.field) for e in spec.errors()] == [
        (key("b"), 1, "spec.size"),
        (key("d"), 2, "spec.size"),
    ]

    write(path, docs(widget("a", size=2), widget("b", size=3)))
    change = spec.scan()
    assert names(change) == ([], ["b"], [])
    assert change.errors == ()


def test_duplicates_resolved_by_path_order_whatever_the_order_of_arrival(
    tmp_path: Path, registry: KindRegistry
) -> None:
    b = write(tmp_path / "b.yaml", widget("x", size=2))
    spec = SpecDirectory(tmp_path, registry)
    assert names(spec.scan()) == (["x"], [], [])

    a = write(tmp_path / "a.yaml", widget("x", size=1))
    change = spec.scan()
    assert names(change) == ([], ["x"], [])
    assert size(spec, "x") == 1
    [error] = change.errors
    assert error.origin == Origin(str(b), 0)
    assert error.key == key("x")
    assert error.reason == f"conflicts with {Origin(str(a), 0)}"

    a.unlink()
    change = spec.scan()
    assert names(change) == ([], ["x"], [])
    assert size(spec, "x") == 2
    assert change.errors == ()


def test_duplicate_within_one_file(tmp_path: Path, registry: KindRegistry) -> None:
    write(tmp_path / "a.yaml", docs(widget("x", size=1), widget("x", size=2)))
    spec = SpecDirectory(tmp_path, registry)
    spec.scan()
    assert size(spec, "x") == 1
    assert [(e.origin.index, e.reason) for e in spec.errors()] == [
        (1, f"conflicts with {Origin(str(tmp_path / 'a.yaml'), 0)}")
    ]


def test_missing_directory_is_empty_until_it_appears(
    tmp_path: Path, registry: KindRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "spec"
    spec = SpecDirectory(root, registry)
    with caplog.at_level(logging.INFO, logger="trellis_common.specdir"):
        assert spec.scan().empty
        assert spec.scan().empty
        write(root / "a.yaml", widget("a"))
        assert names(spec.scan()) == (["a"], [], [])
        shutil.rmtree(root)
        assert names(spec.scan()) == ([], [], ["a"])
    messages = [r.getMessage() for r in caplog.records]
    assert sum("specdir.missing" in m for m in messages) == 2  # once per disappearance
    assert sum("specdir.found" in m for m in messages) == 1


def test_configmap_data_symlink_swap(tmp_path: Path, registry: KindRegistry) -> None:
    """The kubelet writes a new ``..<timestamp>`` dir, then renames ``..data`` over."""
    write(tmp_path / "..2026_01_01" / "a.yaml", widget("a", size=1))
    (tmp_path / "..data").symlink_to("..2026_01_01")
    (tmp_path / "a.yaml").symlink_to("..data/a.yaml")
    spec = SpecDirectory(tmp_path, registry)

    change = spec.scan()
    assert names(change) == (["a"], [], [])
    assert change.errors == ()
    assert spec.current()[key("a")].origin.source == str(tmp_path / "a.yaml")

    write(tmp_path / "..2026_01_02" / "a.yaml", widget("a", size=2))
    write(tmp_path / "..2026_01_02" / "b.yaml", widget("b"))
    (tmp_path / "..data_tmp").symlink_to("..2026_01_02")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    (tmp_path / "b.yaml").symlink_to("..data/b.yaml")
    shutil.rmtree(tmp_path / "..2026_01_01")

    change = spec.scan()
    assert names(change) == (["b"], ["a"], [])
    assert change.errors == ()
    assert size(spec, "a") == 2


def test_status_lists_documents_and_errors_by_source(
    tmp_path: Path, registry: KindRegistry
) -> None:
    path = write(tmp_path / "a.yaml", docs(widget("a"), widget("b", size="big")))
    spec = SpecDirectory(tmp_path, registry)
    spec.scan()

    assert spec.status() == [
        {
            "key": "Widget default/a",
            "kind": "Widget",
            "namespace": "default",
            "name": "a",
            "apiVersion": API,
            "source": str(path),
            "index": 0,
            "status": "valid",
        },
        {
            "key": "Widget default/b",
            "kind": "Widget",
            "namespace": "default",
            "name": "b",
            "apiVersion": None,
            "source": str(path),
            "index": 1,
            "status": "error",
            "field": "spec.size",
            "reason": spec.errors()[0].reason,
        },
    ]


# Watching


async def test_watch_reports_each_change_once_and_survives_callback_errors(
    tmp_path: Path, registry: KindRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    spec = SpecDirectory(tmp_path, registry)
    changes: list[SpecChange] = []

    async def on_change(change: SpecChange) -> None:
        changes.append(change)
        if len(changes) == 1:
            raise RuntimeError("boom")

    stop = asyncio.Event()
    task = asyncio.create_task(spec.watch(stop, on_change, rescan=0.01))
    try:
        write(tmp_path / "a.yaml", widget("a"))
        await eventually(lambda: len(changes) == 1)
        write(tmp_path / "b.yaml", widget("b"))
        await eventually(lambda: len(changes) == 2)
        scanned = spec.scans
        await eventually(lambda: spec.scans >= scanned + 10)  # many rescans, nothing new
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=2)

    assert [names(c) for c in changes] == [(["a"], [], []), (["b"], [], [])]
    assert any("specdir.on_change_failed" in r.getMessage() for r in caplog.records)


async def test_watch_defers_a_file_being_written_but_not_forever(
    tmp_path: Path, registry: KindRegistry
) -> None:
    path = write(tmp_path / "a.yaml", widget("a"))
    future = time.time_ns() + 3600 * 10**9  # looks modified "just now" on every tick
    os.utime(path, ns=(future, future))
    spec = SpecDirectory(tmp_path, registry)
    seen: list[float] = []

    async def on_change(change: SpecChange) -> None:
        seen.append(time.monotonic())

    stop = asyncio.Event()
    start = time.monotonic()
    task = asyncio.create_task(
        spec.watch(stop, on_change, rescan=3600, settle=10.0, settle_max=0.2)
    )
    try:
        await eventually(lambda: seen)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=2)

    assert seen[0] - start >= 0.2
    assert list(spec.current()) == [key("a")]


NEVER = 3600.0  # no rescan and no poll within a test: what is seen came through inotify


def sizes(spec: SpecDirectory) -> dict[str, int]:
    return {k.name: d.resource.spec.size for k, d in spec.current().items()}


async def test_watch_sees_every_kind_of_edit_through_inotify(
    tmp_path: Path, registry: KindRegistry
) -> None:
    root = tmp_path / "spec"
    spec = SpecDirectory(root, registry)
    stop = asyncio.Event()
    task = asyncio.create_task(spec.watch(stop, _ignore, rescan=NEVER, poll=NEVER))
    try:
        await eventually(lambda: spec.watching()["mode"] == "inotify")
        write(root / "a.yaml", widget("a", size=1))  # the directory appears
        await eventually(lambda: sizes(spec) == {"a": 1})
        (root / "a.yaml").write_text(widget("a", size=2))  # rewritten in place
        await eventually(lambda: sizes(spec) == {"a": 2})
        write(root / "a.yaml.tmp", widget("a", size=3))
        os.replace(root / "a.yaml.tmp", root / "a.yaml")  # replaced (rename over)
        await eventually(lambda: sizes(spec) == {"a": 3})
        (root / "a.yaml").write_text("spec: [unclosed\n")  # invalid: the last good stays
        await eventually(lambda: spec.errors())
        assert sizes(spec) == {"a": 3}
        write(root / "team" / "deeper" / "b.yaml", widget("b"))  # new subdirectories
        await eventually(lambda: sizes(spec) == {"a": 3, "b": 1})
        (root / "team" / "deeper" / "b.yaml").write_text(widget("b", size=2))
        await eventually(lambda: sizes(spec) == {"a": 3, "b": 2})
        write(root / ".real" / "c.yaml", widget("c"))
        (root / "c.yaml").symlink_to(".real/c.yaml")  # a symlink within the directory
        await eventually(lambda: sizes(spec).get("c") == 1)
        (root / ".real" / "c.yaml").write_text(widget("c", size=2))  # its target edited
        await eventually(lambda: sizes(spec).get("c") == 2)
        shutil.rmtree(root / "team")  # deleted
        (root / "a.yaml").unlink()
        await eventually(lambda: sizes(spec) == {"c": 2})
        assert spec.errors() == []
        assert spec.watching() == {"mode": "inotify", "reason": ""}
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=2)


async def test_watch_sees_a_configmap_swap_through_inotify(
    tmp_path: Path, registry: KindRegistry
) -> None:
    write(tmp_path / "..2026_01_01" / "a.yaml", widget("a", size=1))
    (tmp_path / "..data").symlink_to("..2026_01_01")
    (tmp_path / "a.yaml").symlink_to("..data/a.yaml")
    spec = SpecDirectory(tmp_path, registry)
    stop = asyncio.Event()
    task = asyncio.create_task(spec.watch(stop, _ignore, rescan=NEVER, poll=NEVER))
    try:
        await eventually(lambda: sizes(spec) == {"a": 1})
        write(tmp_path / "..2026_01_02" / "a.yaml", widget("a", size=2))
        (tmp_path / "..data_tmp").symlink_to("..2026_01_02")
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
        await eventually(lambda: sizes(spec) == {"a": 2})
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=2)


async def _ignore(change: SpecChange) -> None:
    return None


# Offline validation


def test_load_paths_on_files_and_directories(tmp_path: Path, registry: KindRegistry) -> None:
    write(tmp_path / "d" / "x.yaml", widget("a"))
    write(tmp_path / "d" / "sub" / "y.yml", docs(widget("b"), widget("bad", size="x")))
    write(tmp_path / "d" / "notes.txt", "not: yaml: at all")
    extra = write(tmp_path / "extra.txt", docs(widget("c"), widget("a", size=9)))
    missing = tmp_path / "missing.yaml"

    documents, errors = load_paths(
        [extra, tmp_path / "d", missing, tmp_path / "d" / "x.yaml"], registry
    )

    assert [d.key.name for d in documents] == ["b", "a", "c"]  # d/sub/y.yml < d/x.yaml
    assert [(e.origin.source, e.reason.split(" ")[0]) for e in errors] == [
        (str(tmp_path / "d" / "sub" / "y.yml"), "Input"),
        (str(extra), "conflicts"),
        (str(missing), "no"),
    ]
    assert all(isinstance(e, DocumentError) for e in errors)


def test_load_paths_kinds_filter(tmp_path: Path, registry: KindRegistry) -> None:
    write(tmp_path / "a.yaml", docs(widget("w"), gadget("g")))
    documents, errors = load_paths([tmp_path], registry, kinds={"Gadget"})
    assert [d.key for d in documents] == [key("g", "Gadget")]
    assert errors == []


# Bounds: what one file may cost


def laughs(levels: int = 9) -> str:
    """The "billion laughs": each level is a list of nine aliases of the level below."""
    lines = ['l0: &l0 "lol"']
    for level in range(1, levels + 1):
        below = ", ".join([f"*l{level - 1}"] * 9)
        lines.append(f"l{level}: &l{level} [{below}]")
    return "\n".join(lines) + "\n"


def only_error(spec: SpecDirectory) -> DocumentError:
    (error,) = spec.errors()
    return error


def test_a_file_over_the_size_limit_is_refused_unread_and_its_documents_stay(
    tmp_path: Path, registry: KindRegistry
) -> None:
    path = write(tmp_path / "a.yaml", widget("a", size=1))
    spec = SpecDirectory(tmp_path, registry, limits=Limits(max_file_bytes=300))
    assert names(spec.scan()) == (["a"], [], [])

    write(path, docs(widget("a", size=2), *[widget(f"w{i}") for i in range(5)]))
    change = spec.scan()

    assert names(change) == ([], [], [])
    assert size(spec, "a") == 1
    error = only_error(spec)
    assert error.origin.source == str(path)
    assert error.reason.startswith(f"file too large: {path.stat().st_size} bytes")
    assert "over the limit of 300 bytes (max_file_bytes)" in error.reason

    write(path, widget("a", size=3))
    assert names(spec.scan()) == ([], ["a"], [])
    assert spec.errors() == []


def test_the_default_size_limit_is_one_mebibyte(tmp_path: Path, registry: KindRegistry) -> None:
    padding = "#" * 1023 + "\n"
    write(tmp_path / "big.yaml", widget("big") + padding * 1024)
    write(tmp_path / "fits.yaml", widget("fits") + padding * 1000)
    spec = SpecDirectory(tmp_path, registry)

    assert names(spec.scan()) == (["fits"], [], [])
    assert "over the limit of 1048576 bytes" in only_error(spec).reason


def test_a_billion_laughs_is_refused_naming_the_file(
    tmp_path: Path, registry: KindRegistry
) -> None:
    path = write(tmp_path / "a.yaml", widget("a", size=1))
    spec = SpecDirectory(tmp_path, registry)
    spec.scan()

    write(path, docs(widget("a", size=2), laughs()))
    change = spec.scan()

    assert names(change) == ([], [], [])
    assert size(spec, "a") == 1  # the whole file is refused: its last good version stays
    error = only_error(spec)
    assert error.origin.source == str(path)
    assert "YAML aliases expand to more than 10000 extra nodes" in error.reason
    assert "max_alias_nodes" in error.reason


def test_aliases_within_the_budget_load(tmp_path: Path, registry: KindRegistry) -> None:
    shared = (
        f"apiVersion: {API}\nkind: Widget\n"
        "metadata: {name: b, labels: &labels {team: x}, annotations: *labels}\n"
        "spec: {<<: &defaults {size: 4}, color: blue}\n"
    )
    write(tmp_path / "a.yaml", widget("a"))
    write(tmp_path / "b.yaml", shared)
    write(tmp_path / "c.yaml", laughs(3))  # 9 * 9 * 9 laughs: 918 nodes added; not a document
    spec = SpecDirectory(tmp_path, registry, limits=Limits(max_alias_nodes=1000))

    spec.scan()

    assert sorted(str(k) for k in spec.current()) == ["Widget default/a", "Widget default/b"]
    assert size(spec, "b") == 4
    assert spec.current()[key("b")].resource.metadata.annotations == {"team": "x"}
    # c.yaml was loaded (within the budget), then failed as a document
    assert [(e.origin.source, e.field, e.reason) for e in spec.errors()] == [
        (str(tmp_path / "c.yaml"), "kind", "is required")
    ]


def test_the_alias_budget_counts_the_whole_file(tmp_path: Path, registry: KindRegistry) -> None:
    write(tmp_path / "a.yaml", docs(laughs(3), laughs(3)))
    spec = SpecDirectory(tmp_path, registry, limits=Limits(max_alias_nodes=1000))
    spec.scan()
    assert "more than 1000 extra nodes (1836 so far" in only_error(spec).reason


def test_a_recursive_alias_is_refused(tmp_path: Path, registry: KindRegistry) -> None:
    write(tmp_path / "a.yaml", "loop: &loop [1, *loop]\n")
    spec = SpecDirectory(tmp_path, registry)
    spec.scan()
    assert "a YAML alias refers to a node that contains it" in only_error(spec).reason


def test_a_symlink_out_of_the_directory_is_not_read(tmp_path: Path, registry: KindRegistry) -> None:
    root, elsewhere = tmp_path / "spec", tmp_path / "elsewhere"
    path = write(root / "a.yaml", widget("a", size=1))
    write(root / "inside" / "b.yaml", widget("b"))
    (root / "b.yaml").symlink_to("inside/b.yaml")  # within the directory: followed
    secret = write(elsewhere / "secret.yaml", widget("secret"))
    spec = SpecDirectory(root, registry)
    assert names(spec.scan()) == (["a", "b"], [], [])

    path.unlink()
    path.symlink_to(secret)  # a.yaml replaced by a link out
    (root / "c.yaml").symlink_to(secret)
    change = spec.scan()

    assert names(change) == ([], [], [])
    assert size(spec, "a") == 1  # a.yaml's last good documents stay
    assert "secret" not in {k.name for k in spec.current()}
    assert [(e.origin.source, e.reason) for e in spec.errors()] == [
        (
            str(link),
            f"not read: a symlink to {secret}, outside the spec directory {root} "
            "(symlinks are followed only within it)",
        )
        for link in (path, root / "c.yaml")
    ]


def test_a_directory_symlink_out_of_the_directory_is_not_walked(
    tmp_path: Path, registry: KindRegistry
) -> None:
    root, elsewhere = tmp_path / "spec", tmp_path / "elsewhere"
    write(root / "team" / "a.yaml", widget("a"))
    write(elsewhere / "x.yaml", widget("x"))
    spec = SpecDirectory(root, registry)
    spec.scan()

    shutil.rmtree(root / "team")
    (root / "team").symlink_to(elsewhere, target_is_directory=True)
    change = spec.scan()

    assert names(change) == ([], [], [])  # team/a.yaml's documents stay; x.yaml is not read
    assert [str(k) for k in spec.current()] == ["Widget default/a"]
    error = only_error(spec)
    assert error.origin.source == str(root / "team")
    assert error.reason.startswith(f"not read: a symlink to {elsewhere}, outside")

    (root / "team").unlink()
    assert names(spec.scan()) == ([], [], ["a"])
    assert spec.errors() == []


def test_load_paths_applies_the_same_bounds(tmp_path: Path, registry: KindRegistry) -> None:
    write(tmp_path / "d" / "ok.yaml", widget("ok"))
    write(tmp_path / "d" / "laughs.yaml", laughs())
    outside = write(tmp_path / "outside.yaml", widget("outside"))
    (tmp_path / "d" / "link.yaml").symlink_to(outside)

    d = tmp_path / "d"
    documents, errors = load_paths([d], registry)

    assert [doc.key.name for doc in documents] == ["ok"]
    assert [(Path(e.origin.source).name, e.reason.split(" (")[0]) for e in errors] == [
        ("laughs.yaml", "YAML aliases expand to more than 10000 extra nodes"),
        ("link.yaml", f"not read: a symlink to {outside}, outside the spec directory {d}"),
    ]
    # A file named on the command line is read wherever it points.
    documents, errors = load_paths([tmp_path / "d" / "link.yaml"], registry)
    assert ([d.key.name for d in documents], errors) == (["outside"], [])

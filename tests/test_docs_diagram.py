"""The architecture diagram cannot drift from the repository, nor its copies from its source.

``docs/architecture.mmd`` is the one source (Mermaid, which GitHub renders in Markdown); the
README and ``docs/architecture.md`` carry it in a ```` ```mermaid ```` block, copied as it
is. These tests fail when a copy differs from the source, when the diagram names a box that
is neither a member of the workspace nor a process the project really runs or talks to,
when a service of the workspace is missing from it, and when a line is not one of the
flowchart forms the diagram uses (a typo GitHub would show as a broken picture). No
Mermaid renderer runs here (it needs a browser), so the forms are checked by this small
reader; when the diagram was written it was also parsed by npm ``mermaid`` 11's own parser
(under jsdom), which accepted it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "docs" / "architecture.mmd"
COPIES = [ROOT / "README.md", ROOT / "docs" / "architecture.md"]
BLOCK = re.compile(r"^```mermaid\n(.*?)^```$", re.MULTILINE | re.DOTALL)

#: Boxes that are not workspace members, each with the file that shows the project really
#: runs or speaks to it: a box for something the code does not do fails here.
OUTSIDE = {
    "Redis": "apps/cli/src/trellis_cli/redisprocess.py",
    "Kubernetes API": "libs/kube/src/trellis_kube",
    "Envoy sidecars": "libs/common/src/trellis_common/envoybin.py",
    "Proxyless gRPC clients": "apps/cli/src/trellis_cli/grpcworkload.py",
    "Linkerd Destination clients": "proto/vendor/linkerd2-proxy-api",
    "Pod agent": "apps/cli/src/trellis_cli/agent.py",
}
#: Boxes that are workspace members under another name.
MEMBERS = {"trellis CLI": "apps/cli"}

NODE = re.compile(r'^(\w+)(?:\["(?P<box>[^"]+)"\]|\[\("(?P<cylinder>[^"]+)"\)\])$')
SUBGRAPH = re.compile(r'^subgraph (\w+)\["[^"]+"\]$')
EDGE = re.compile(r'^(?P<left>\w+(?: & \w+)*) (?:-->|-\.->|<-->)\|"[^"|]+"\| (?P<right>\w+)$')


def source() -> str:
    return SOURCE.read_text()


def diagram() -> tuple[dict[str, str], set[str], list[tuple[list[str], str]]]:
    """The diagram's nodes (id: first line of its label), subgraphs and edges; a line
    of any other form fails the test that reads it."""
    nodes: dict[str, str] = {}
    groups: set[str] = set()
    edges: list[tuple[list[str], str]] = []
    depth = 0
    lines = source().splitlines()
    assert lines[0] == "flowchart LR"
    for number, raw in enumerate(lines[1:], start=2):
        line = raw.strip()
        if not line:
            continue
        if found := SUBGRAPH.match(line):
            groups.add(found.group(1))
            depth += 1
        elif line == "end":
            depth -= 1
            assert depth >= 0, f"line {number}: an `end` with no subgraph open"
        elif found := NODE.match(line):
            label = found.group("box") or found.group("cylinder")
            assert found.group(1) not in nodes, f"line {number}: {found.group(1)} twice"
            nodes[found.group(1)] = label.split("<br/>")[0].strip()
        elif found := EDGE.match(line):
            edges.append((found.group("left").split(" & "), found.group("right")))
        else:
            pytest.fail(f"docs/architecture.mmd line {number} is no form the diagram uses: {raw!r}")
    assert depth == 0, "a subgraph is not closed with `end`"
    return nodes, groups, edges


@pytest.mark.parametrize("copy", COPIES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_copy_is_the_source_as_it_is(copy: Path) -> None:
    blocks = BLOCK.findall(copy.read_text())

    assert blocks == [source()], f"{copy.name}'s mermaid block differs from docs/architecture.mmd"


def test_every_line_is_a_flowchart_form_and_every_edge_joins_known_boxes() -> None:
    nodes, groups, edges = diagram()

    assert edges
    for left, right in edges:
        for end in [*left, right]:
            assert end in nodes or end in groups, f"an edge names {end}, which is no box"
    linked = {end for left, right in edges for end in [*left, right]}
    assert set(nodes) <= linked, f"boxes with no edge: {set(nodes) - linked}"


def test_every_box_is_a_workspace_member_or_a_process_the_code_runs() -> None:
    nodes, _, _ = diagram()
    services = {p.parent.name for p in ROOT.glob("services/*/pyproject.toml")}

    for label in nodes.values():
        name = label.split(" (")[0]
        if name in services:
            continue
        if name in MEMBERS:
            assert (ROOT / MEMBERS[name] / "pyproject.toml").is_file(), name
            continue
        assert name in OUTSIDE, f"the diagram's {label!r} is neither a service nor known"
        assert (ROOT / OUTSIDE[name]).exists(), f"{name}: {OUTSIDE[name]} is gone"


def test_every_service_of_the_workspace_is_in_the_diagram() -> None:
    nodes, _, _ = diagram()
    drawn = {label.split(" (")[0] for label in nodes.values()}
    services = {p.parent.name for p in ROOT.glob("services/*/pyproject.toml")}

    assert services, "no services/*/pyproject.toml: is ROOT right?"
    assert services <= drawn, f"services missing from the diagram: {services - drawn}"

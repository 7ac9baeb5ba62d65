"""Generate ``libs/api/src/trellis_api`` from ``proto/`` (or check that it is up to date).

Our own protos live under ``proto/trellis_api/``. Other projects' APIs that Trellis serves
are vendored byte for byte under ``proto/vendor/<project>/`` (their own import paths, e.g.
``import "net.proto"``), generated into ``trellis_api.<module>`` (:data:`VENDORED`): their
top-level imports (``import net_pb2``) are rewritten into that package, which is all that
differs from what upstream's own generator makes.

The generated modules are committed, so a fresh clone imports them without a build step;
``make test`` runs this with ``--check`` and fails when a ``.proto`` changed without
``make proto``. Uses grpcio-tools' bundled protoc and mypy-protobuf for typed stubs.
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.resources
import re
import subprocess
import sys
import tempfile
from pathlib import Path

GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
VENDOR = "vendor"
#: vendored folder under proto/vendor/ -> the package (under trellis_api) it is generated into
VENDORED = {"linkerd2-proxy-api": "linkerd", "linkerd2-conduit": "conduit"}


def generate(proto_root: Path, out: Path) -> None:
    protos = sorted(
        str(p.relative_to(proto_root))
        for p in proto_root.rglob("*.proto")
        if p.relative_to(proto_root).parts[0] != VENDOR
    )
    _protoc(proto_root, out, protos)
    for folder, module in VENDORED.items():
        root = proto_root / VENDOR / folder
        package = out / "trellis_api" / module
        package.mkdir(parents=True, exist_ok=True)
        vendored = sorted(str(p.relative_to(root)) for p in root.rglob("*.proto"))
        _protoc(root, package, vendored)
        _into_package(package, f"trellis_api.{module}")


def _into_package(package: Path, dotted: str) -> None:
    """Rewrite the generated imports of the vendored set's own modules into ``dotted``:
    ``import net_pb2`` (a top-level file) and ``from common import common_pb2`` (a nested
    one, whose folders become packages)."""
    generated = [p for p in package.rglob("*") if p.name.endswith(GENERATED_SUFFIXES)]
    for folder in {p.parent for p in generated} - {package}:
        while folder != package:
            (folder / "__init__.py").touch()
            folder = folder.parent
    modules = {
        ".".join(p.relative_to(package).with_name(p.name.split(".")[0]).parts)
        for p in generated
        if p.name.endswith("_pb2.py")
    }
    top = re.compile(r"^import (\w+_pb2)\b", re.MULTILINE)
    nested = re.compile(r"^(from|import) ([\w.]+?)(\.(\w+_pb2)| import (\w+_pb2))\b", re.MULTILINE)

    def rewrite_top(match: re.Match[str]) -> str:
        name = match.group(1)
        return f"from {dotted} import {name}" if name in modules else match.group(0)

    def rewrite_nested(match: re.Match[str]) -> str:
        keyword, parent, rest, dotted_name, from_name = match.groups()
        name = dotted_name or from_name
        if f"{parent}.{name}" not in modules:
            return match.group(0)
        return f"{keyword} {dotted}.{parent}{rest}"

    for path in sorted(generated):
        text = top.sub(rewrite_top, path.read_text())
        path.write_text(nested.sub(rewrite_nested, text))


def _protoc(proto_root: Path, out: Path, protos: list[str]) -> None:
    include = importlib.resources.files("grpc_tools") / "_proto"
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *protos,
    ]
    subprocess.run(cmd, check=True)


def generated_files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*") if p.name.endswith(GENERATED_SUFFIXES)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the output is stale")
    parser.add_argument("proto_root", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    if not args.check:
        for old in generated_files(args.out):
            (args.out / old).unlink()
        generate(args.proto_root, args.out)
        print(f"generated {len(generated_files(args.out))} files under {args.out}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(args.proto_root, fresh)
        want, have = generated_files(fresh), generated_files(args.out)
        stale = sorted(str(name) for name in want ^ have)
        stale += sorted(
            str(name)
            for name in want & have
            if not filecmp.cmp(fresh / name, args.out / name, shallow=False)
        )
    if stale:
        print("generated code is out of date; run `make proto`:", *stale, sep="\n  ")
        return 1
    print("generated code is up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

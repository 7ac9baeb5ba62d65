"""The codemod that split ``libs/common`` into libraries by responsibility; safe to run again.

``trellis_common`` keeps the base (model, ids, components, defaults, documents, ...); the rest
left it for three libraries, in layers (each imports only those below it)::

    trellis_kube      the Kubernetes client and informers (was trellis_common.kube), leases,
                      leadership (and its Redis backend, redislocks)
    trellis_runtime   the service runtime: service, settings, admin, gRPC server, signaling,
                      events, Redis, health, metrics, joining, the revocation follower
    trellis_identity  keys and CSRs, TLS, server checks, admin/join/onboarding tokens, authz
    trellis_common    the base

``python tools/split_common.py`` rewrites every reference to a moved module in the files git
tracks (``.py``, ``.toml``, ``.md``, ``.yaml``, the Makefile, Dockerfiles, the chart's
templates): ``from trellis_common.X import``, ``import trellis_common.X``, ``from
trellis_common import X`` (split into one statement per library where it names modules of
several), dotted names in strings (logger names, ``mock.patch`` targets, docs) and paths
(``libs/common/src/trellis_common/X.py``, ``libs/common/tests/test_X.py``). It then adds to (or
removes from) each workspace member's ``pyproject.toml`` the ``trellis-*`` libraries its
sources import, and runs ruff (imports sorted, formatted) on the Python files it changed.
What is already rewritten is left as it is, so a second run changes nothing: run it again on
a branch that still spells the old names, before or after merging this one.

``--only LIB`` (repeatable) limits it to one library's modules. ``--move`` also moves (``git
mv``) what is still under ``libs/common`` and belongs elsewhere: the modules, the ``kube``
package and the tests. The libraries' own files (pyproject.toml, ``__init__.py``,
``py.typed``) and the root configuration were written by hand.

``CHANGELOG.md`` is not rewritten: its entries name the modules as they were then.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GIT = shutil.which("git") or "/usr/bin/git"

#: The modules (and the one package, ``kube``) that left trellis_common, by library.
MOVED: dict[str, tuple[str, ...]] = {
    "identity": (
        "authz",
        "identity",
        "jointoken",
        "onboarding",
        "servercheck",
        "tls",
        "tokens",
        "trustctx",
    ),
    "runtime": (
        "admin",
        "adminhttp",
        "events",
        "follow",
        "grpcrequests",
        "grpcserver",
        "health",
        "identityrevocation",
        "joining",
        "lifecycle",
        "locate",
        "looplag",
        "metrics",
        "metricsport",
        "redisacl",
        "redisatomic",
        "redisaudit",
        "redisconn",
        "refusals",
        "registry",
        "runtime",
        "sentinelconf",
        "sentinelurl",
        "service",
        "settings",
        "signaling",
        "stored",
        "subscriber",
        "tlstap",
    ),
    "kube": ("kube", "leadership", "leases", "redislocks"),
}
#: A package whose modules become the library's own top level: trellis_common.kube.client is
#: trellis_kube.client, and trellis_common.kube is trellis_kube.
FLATTENED = {"kube": "kube"}
#: The tests that left libs/common/tests, by library (the others test the base, or
#: trellis_testing's runners, and stay).
MOVED_TESTS: dict[str, tuple[str, ...]] = {
    "identity": ("test_identities", "test_servercheck", "test_tls", "test_tokens"),
    "runtime": (
        "test_admin",
        "test_events",
        "test_follow",
        "test_fuzz_admin_api",
        "test_grpcrequests",
        "test_grpcserver",
        "test_lifecycle",
        "test_locate",
        "test_looplag",
        "test_metrics",
        "test_redis_sentinel",
        "test_redisacl",
        "test_redisatomic",
        "test_redisaudit",
        "test_redisconn",
        "test_registry",
        "test_service",
        "test_settings",
        "test_signaling",
        "test_stored",
    ),
    "kube": (
        "test_kube_informer",
        "test_kube_injection",
        "test_leadership",
        "test_leadership_kube",
        "test_leadership_redis",
    ),
}
#: The libraries a member's pyproject.toml may be made to declare, bottom first.
LIBRARIES = ("common", "identity", "runtime", "kube")

TEXT_SUFFIXES = {".py", ".pyi", ".toml", ".md", ".yaml", ".yml", ".tpl", ".txt", ".cfg", ".ini"}
TEXT_NAMES = {"Makefile", "Dockerfile"}
SKIPPED = {"CHANGELOG.md", "uv.lock", "tools/split_common.py"}
SKIPPED_PREFIXES = ("libs/api/src/",)


def target(module: str) -> tuple[str, str] | None:
    """(library, new dotted name) of ``trellis_common.<module>``, or None if it stayed."""
    for lib, names in MOVED.items():
        if module in names:
            if module in FLATTENED:
                return lib, f"trellis_{lib}"
            return lib, f"trellis_{lib}.{module}"
    return None


def _replacements() -> list[tuple[re.Pattern[str], str]]:
    subs: list[tuple[re.Pattern[str], str]] = []
    for lib, names in MOVED.items():
        for name in names:
            new = f"trellis_{lib}" if name in FLATTENED else f"trellis_{lib}/{name}"
            flat = name in FLATTENED
            # paths: libs/common/src/trellis_common/X(.py|/...), then trellis_common/X
            subs.append(
                (
                    re.compile(rf"libs/common/src/trellis_common/{name}(?=\.py\b|/|\b)"),
                    f"libs/{lib}/src/{new}",
                )
            )
            subs.append((re.compile(rf"(?<![\w/])trellis_common/{name}(?=\.py\b|/|\b)"), new))
            # docs' short form: libs/common/.../X.py
            subs.append(
                (
                    re.compile(rf"libs/common/\.\.\./{name}(?=\.py\b|/)"),
                    f"libs/{lib}/.../{name}" if not flat else f"libs/{lib}/...",
                )
            )
            # dotted names: trellis_common.X (and trellis_common.kube.Y -> trellis_kube.Y)
            dotted = f"trellis_{lib}" if flat else f"trellis_{lib}.{name}"
            subs.append((re.compile(rf"(?<![\w.])trellis_common\.{name}\b"), dotted))
    for lib, tests in MOVED_TESTS.items():
        for test in tests:
            subs.append(
                (re.compile(rf"libs/common/tests/{test}\.py\b"), f"libs/{lib}/tests/{test}.py")
            )
    return subs


SUBS = _replacements()
# `from trellis_common import X` on one line, outside Python (docs' code blocks)
_FROM_LINE = re.compile(r"^(\s*)from trellis_common import (\w+)(\s*(?:#.*)?)$", re.M)


def _doc_from_line(match: re.Match[str]) -> str:
    indent, name, rest = match.groups()
    found = target(name)
    if found is None:
        return match.group(0)
    lib = found[0]
    if name in FLATTENED:
        return f"{indent}import trellis_{lib} as {name}{rest}"
    return f"{indent}from trellis_{lib} import {name}{rest}"


def rewrite_text(text: str) -> str:
    for pattern, new in SUBS:
        text = pattern.sub(new, text)
    return text


def _comments(source: str) -> list[str]:
    found = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                found.append(tok.string)
    except (tokenize.TokenError, IndentationError):
        pass
    return found


def rewrite_from_imports(source: str) -> str:
    """``from trellis_common import a, b`` where a or b moved: one statement per library."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.module == "trellis_common"):
            continue
        if node.level or not any(target(a.name) for a in node.names):
            continue
        assert node.end_lineno is not None
        start, end = node.lineno - 1, node.end_lineno
        old = "".join(lines[start:end])
        indent = " " * node.col_offset
        groups: dict[str, list[str]] = {}
        flattened: list[str] = []
        for alias in node.names:
            found = target(alias.name)
            spelled = alias.name + (f" as {alias.asname}" if alias.asname else "")
            if found is None:
                groups.setdefault("trellis_common", []).append(spelled)
            elif alias.name in FLATTENED:
                flattened.append(f"import {found[1]} as {alias.asname or alias.name}")
            else:
                groups.setdefault(f"trellis_{found[0]}", []).append(spelled)
        statements = [f"from {pkg} import {', '.join(names)}" for pkg, names in groups.items()]
        statements += flattened
        comments = _comments(old)
        if comments:
            statements[0] += "  " + " ".join(comments)
        new = "".join(f"{indent}{s}\n" for s in statements)
        # a statement that shares its line with others (`; ...`) is left for a human
        if old.strip().startswith("from trellis_common import") and old.endswith("\n"):
            edits.append((start, end, new))
        else:
            print(f"split_common: left as is (not alone on its lines): {old.strip()!r}")
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end] = [new]
    return "".join(lines)


def tracked_files() -> list[Path]:
    out = subprocess.run(
        [GIT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    files = []
    for name in filter(None, out.split("\0")):
        path = Path(name)
        if name in SKIPPED or name.startswith(SKIPPED_PREFIXES):
            continue
        text = path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES
        if (text or "Dockerfile" in path.name) and (ROOT / path).is_file():
            files.append(path)
    return files


def move() -> None:
    """git mv what is still under libs/common and belongs to another library."""
    common = ROOT / "libs/common"
    for lib, names in MOVED.items():
        dest = ROOT / f"libs/{lib}/src/trellis_{lib}"
        for name in names:
            if name in FLATTENED:
                src_dir = common / f"src/trellis_common/{name}"
                for item in sorted(src_dir.glob("*.py")) if src_dir.is_dir() else []:
                    _git_mv(item, dest / item.name)
                continue
            _git_mv(common / f"src/trellis_common/{name}.py", dest / f"{name}.py")
    for lib, tests in MOVED_TESTS.items():
        for test in tests:
            _git_mv(common / f"tests/{test}.py", ROOT / f"libs/{lib}/tests/{test}.py")


def _git_mv(src: Path, dest: Path) -> None:
    if not src.exists():
        return
    if dest.exists():
        sys.exit(f"split_common: both {src} and {dest} exist; merge them by hand")
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([GIT, "mv", str(src), str(dest)], cwd=ROOT, check=True)


def imported_libraries(src: Path) -> set[str]:
    """The trellis_<library> packages (of LIBRARIES) the files under ``src`` import."""
    found: set[str] = set()
    for path in src.rglob("*.py"):
        try:
            tree = ast.parse(path.read_text())
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top.startswith("trellis_") and top[len("trellis_") :] in LIBRARIES:
                    found.add(top[len("trellis_") :])
    return found


def _insert_after_lower(body: str, lib: str) -> str:
    """``"trellis-<lib>",`` after the line of the library just below it, else first."""
    line = f'    "trellis-{lib}",\n'
    for lower in reversed(LIBRARIES[: LIBRARIES.index(lib)]):
        found = re.search(rf'(?m)^\s*"trellis-{lower}",?[^\n]*\n', body)
        if found:
            return body[: found.end()] + line + body[found.end() :]
    return line + body


def _add_source(text: str, lib: str, source: str) -> str:
    """``trellis-<lib> = { workspace = true }`` in [tool.uv.sources], by the same rule."""
    for lower in reversed(LIBRARIES[: LIBRARIES.index(lib)]):
        found = re.search(rf"(?m)^trellis-{lower} = {{ workspace = true }}\n", text)
        if found:
            return text[: found.end()] + source + text[found.end() :]
    return text.replace("[tool.uv.sources]\n", f"[tool.uv.sources]\n{source}", 1)


def sync_member_dependencies() -> list[Path]:
    """Each member declares the libraries its sources import, and no other of LIBRARIES."""
    changed = []
    for pyproject in sorted(ROOT.glob("*/*/pyproject.toml")):
        member = pyproject.parent
        if member.parent.name not in {"libs", "services", "apps"}:
            continue
        own = member.name if member.parent.name == "libs" else None
        if not (member / "src").is_dir():
            continue
        wanted = imported_libraries(member / "src") - {own}
        text = old = pyproject.read_text()
        block = re.search(r"(?ms)^dependencies = \[\n(.*?)^\]", text)
        if block is None:
            continue
        body = block.group(1)
        declared = set(re.findall(r'^\s*"trellis-(\w+)"', body, re.M)) & set(LIBRARIES)
        for lib in sorted(declared - wanted):
            body = re.sub(rf'(?m)^\s*"trellis-{lib}",?[^\n]*\n', "", body)
            text = re.sub(rf"(?m)^trellis-{lib} = {{ workspace = true }}\n", "", text)
        for lib in [lib for lib in LIBRARIES if lib in wanted - declared]:
            body = _insert_after_lower(body, lib)
        text = text[: block.start(1)] + body + text[block.end(1) :]
        for lib in [lib for lib in LIBRARIES if lib in wanted]:
            source = f"trellis-{lib} = {{ workspace = true }}\n"
            if source not in text:
                if "[tool.uv.sources]\n" not in text:
                    text = text.rstrip("\n") + "\n\n[tool.uv.sources]\n"
                text = _add_source(text, lib, source)
        if text != old:
            pyproject.write_text(text)
            changed.append(pyproject)
    return changed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--move", action="store_true", help="git mv what is left under libs/common")
    parser.add_argument("--no-ruff", action="store_true", help="do not run ruff on changed files")
    parser.add_argument(
        "--only", action="append", choices=sorted(MOVED), help="this library's moves only"
    )
    args = parser.parse_args(argv)
    if args.only:  # the split was made one library at a time, from the top: kube, runtime...
        for moves in (MOVED, MOVED_TESTS):
            for lib in set(moves) - set(args.only):
                del moves[lib]
        SUBS[:] = _replacements()
    if args.move:
        move()
    changed: list[Path] = []
    for path in tracked_files():
        full = ROOT / path
        old = full.read_text()
        new = rewrite_from_imports(old) if path.suffix in {".py", ".pyi"} else old
        new = rewrite_text(new)
        if path.suffix == ".md":
            new = _FROM_LINE.sub(_doc_from_line, new)
        if new != old:
            full.write_text(new)
            changed.append(path)
    changed += [p.relative_to(ROOT) for p in sync_member_dependencies()]
    python = [str(p) for p in changed if p.suffix == ".py"]
    if python and not args.no_ruff:
        ruff = [sys.executable, "-m", "ruff"]
        subprocess.run([*ruff, "check", "-q", "--fix", "--select", "I", *python], cwd=ROOT)
        subprocess.run([*ruff, "format", "-q", *python], cwd=ROOT, check=True)
    for path in changed:
        print(f"split_common: rewrote {path}")
    print(f"split_common: {len(changed)} files changed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The files of a spec directory tree: which names count, and how far symlinks are followed.

Shared by :mod:`trellis_common.specdir` (what to read) and its watcher (what to watch): a
``.yaml``/``.yml`` name that is neither hidden nor an editor's temp file counts; hidden
directories (Kubernetes ConfigMap ``..data`` among them, whose files are reached through the
top-level symlinks) are not walked; a symlink (to a file or a directory) is followed only if
it resolves inside the tree, and a file reachable twice is listed once.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

_EXTENSIONS = (".yaml", ".yml")
_TEMP_SUFFIXES = ("~", ".swp", ".swx", ".tmp")


def is_spec_file(name: str) -> bool:
    """A ``.yaml``/``.yml`` name that is neither hidden nor an editor's temp or backup file."""
    if name.startswith(".") or name.endswith(_TEMP_SUFFIXES):
        return False
    if name.startswith("#") and name.endswith("#"):
        return False
    return name.lower().endswith(_EXTENSIONS)


def _inside(real: str, real_root: str) -> bool:
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def walk(root: Path) -> tuple[list[Path], dict[Path, str], set[str]]:
    """The spec files under ``root`` (or ``root`` itself if it is a file), sorted, each once;
    the symlinks not followed because they resolve outside ``root`` (files and
    directories), each with the reason; and the real paths of the directories walked. A
    file named as ``root`` is read wherever it points."""
    if root.is_file():
        return [root], {}, set()
    real_root = os.path.realpath(root)
    found: list[Path] = []
    outside: dict[Path, str] = {}
    seen_dirs: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen_dirs:  # a symlink loop, or a directory reached twice
            dirnames.clear()
            continue
        seen_dirs.add(real)
        kept = []
        for name in dirnames:
            if name.startswith("."):
                continue
            target = os.path.realpath(os.path.join(dirpath, name))
            if _inside(target, real_root):
                kept.append(name)
            else:
                outside[Path(dirpath, name)] = outside_reason(target, real_root)
        dirnames[:] = kept
        for name in filenames:
            if not is_spec_file(name):
                continue
            target = os.path.realpath(os.path.join(dirpath, name))
            if _inside(target, real_root):
                found.append(Path(dirpath, name))
            else:
                outside[Path(dirpath, name)] = outside_reason(target, real_root)
    unique: list[Path] = []
    seen_files: set[str] = set()
    for path in sorted(found):
        real = os.path.realpath(path)
        if real not in seen_files:
            seen_files.add(real)
            unique.append(path)
    return unique, outside, seen_dirs


def watched_dirs(root: Path, files: Iterable[Path], walked: set[str]) -> frozenset[str]:
    """What to watch for the next change: the directories walked and those holding the
    files' real targets (all within ``root``); while ``root`` is missing, its nearest
    existing parent; for a single file, the directories holding it and its target."""
    dirs = set(walked)
    dirs.update(os.path.dirname(os.path.realpath(f)) for f in files)
    if root.is_file() or not root.exists():
        dirs.add(str(root.parent.resolve()))
        missing = root
        while not missing.exists() and missing.parent != missing:
            missing = missing.parent
        dirs.add(str(missing.resolve()))
    return frozenset(d for d in dirs if os.path.isdir(d))


def outside_reason(target: str, real_root: str) -> str:
    return (
        f"not read: a symlink to {target}, outside the spec directory {real_root} "
        "(symlinks are followed only within it)"
    )

"""A family's content hash: what a study's trials were rendered from. A study keeps the hash it was made with, so a
study resumed after its family changed is known to be of another family (its proofs are of other kernels)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from .. import _safeio

if TYPE_CHECKING:
    from ._spec import Family

#: Bounds of what is hashed: files, bytes per file, folder depth (a family folder is small).
MAX_FILES = 256
FILE_LIMIT = 1 << 20
MAX_DEPTH = 4
SUFFIXES = (".toml", ".j2", ".jinja", ".metal", ".cu", ".h", ".inc")


def family_sha256(fam: Family) -> str:
    """SHA-256 of the family's spec and every template-like file of its folder (links and special files are not
    followed; they are named, so that replacing one changes the hash too)."""
    root = Path(fam.path)
    digest = hashlib.sha256()
    for rel in _files(root):
        try:
            data = _safeio.read_inside(root, rel.split("/"), FILE_LIMIT)
        except _safeio.UnsafeFile:
            data = b"\0unreadable"
        digest.update(f"{rel}\0{hashlib.sha256(data).hexdigest()}\n".encode())
    return digest.hexdigest()


def _files(root: Path) -> list[str]:
    """Relative names of the files hashed, sorted; a bounded walk that never follows a link."""
    found: list[str] = []
    stack: list[tuple[str, int]] = [("", 0)]
    while stack and len(found) < MAX_FILES:
        rel, depth = stack.pop()
        try:
            entries = sorted(os.scandir(root / rel) if rel else os.scandir(root), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            name = f"{rel}/{entry.name}" if rel else entry.name
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode) and depth + 1 < MAX_DEPTH and not entry.name.startswith("."):
                stack.append((name, depth + 1))
            elif entry.name.endswith(SUFFIXES) and (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                found.append(name)
    return sorted(found[:MAX_FILES])

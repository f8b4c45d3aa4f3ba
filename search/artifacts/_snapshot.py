"""Family snapshots: the spec and templates a version was rendered from, kept in the store at publish.

A version's kernel is re-rendered on every load, and the comparison is never skipped. Families change after a
version is published (a template is improved, a knob added); so the store keeps, beside its versions, the
family each version was rendered from, and the re-check renders the version's config with that family: the
kernel must be exactly what it renders, the config must satisfy its constraints, the geometry must be its
launch. Nothing about a version is taken on trust because "the template changed since".

``ROOT/.families/<sha256>/`` holds ``family.toml``, every template the spec names, every template the
render of the version's config read (includes, imports, a base template; the shared library's as
``_lib/NAME``) and the specs it extends (``_extends/NAME/family.toml``), as they were: a family folder's own
``_lib`` and ``_extends`` stand for the built-in ones when it has them. The folder's name is
the hash of its files (:func:`snapshot_hash`), recorded in the store's index with the version; a snapshot is
never modified, and one whose files do not hash to its name is refused. To be rendered, a snapshot is read
once (bounded, no links, regular files only), checked, and copied into a private temporary folder of this
process: nothing written to the store afterwards can change what a check renders.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .. import _safeio
from ._manifest import ArtifactError

if TYPE_CHECKING:
    from ..family._space import Config
    from ..family._spec import Family

SNAPSHOTS = ".families"
SPEC = "family.toml"
#: Bounds of one snapshot: files, bytes per file, folder depth (template names have at most 4 parts).
MAX_FILES = 64
FILE_LIMIT = 1 << 20
MAX_DEPTH = 4
#: Families loaded from verified private copies in this process, by snapshot hash (bounded).
_LOADED: dict[str, tuple[Path, Family]] = {}
_MAX_LOADED = 32


def snapshot_hash(files: dict[str, bytes]) -> str:
    """The name of a snapshot: SHA-256 of its sorted (relative path, SHA-256 of the bytes) pairs."""
    listing = sorted([name, hashlib.sha256(data).hexdigest()] for name, data in files.items())
    return hashlib.sha256(json.dumps(listing, separators=(",", ":")).encode("utf-8")).hexdigest()


def family_files(fam: Family, target: str, config: Config, dtype: str) -> dict[str, bytes]:
    """What a version of ``fam`` is rendered from: its spec, every template it names, and each template the
    render of ``config`` for ``target`` reads (each as the render read it)."""
    from ..family._render import render
    from ..family._spec import OWN_BASES, template_env

    try:
        files = {SPEC: _safeio.read_inside(fam.path, [SPEC], FILE_LIMIT)}
        for name in fam.templates.values():
            files[name] = _safeio.read_inside(fam.path, [name], FILE_LIMIT)
        for base in fam.bases:  # the specs it extends, as they were (read back from _extends/NAME/family.toml)
            files[f"{OWN_BASES}/{base.parent.name}/{SPEC}"] = _safeio.read_bytes(base, FILE_LIMIT)
    except _safeio.UnsafeFile as exc:
        raise ArtifactError(f"cannot keep the family with the version: {exc}") from None
    sandbox = template_env(fam.path)
    render(fam, dict(config), dtype, target, sandbox=sandbox)
    loaded = getattr(sandbox.loader, "loaded", {})
    for name, text in loaded.items():
        files[name] = text.encode("utf-8")
    if len(files) > MAX_FILES:
        raise ArtifactError(f"family {fam.name}: a version reads more than {MAX_FILES} template files")
    return files


def write_snapshot(root: Path, files: dict[str, bytes]) -> str:
    """Keep ``files`` in the store (once: a snapshot is named by its hash); returns the hash."""
    sha = snapshot_hash(files)
    base = Path(root) / SNAPSHOTS
    with contextlib.suppress(FileExistsError):
        base.mkdir()
    if not _safeio.is_real_dir(base):
        raise ArtifactError(f"{base}: not a plain folder (a link or a file): refusing to write there")
    dest = base / sha
    if os.path.lexists(dest):
        read_snapshot(root, sha)  # an existing one must be intact (it is named by its content)
        return sha
    tmp = base / f".tmp-{secrets.token_hex(8)}"
    tmp.mkdir()
    try:
        for name, data in sorted(files.items()):
            parts = name.split("/")
            for i in range(1, len(parts)):
                with contextlib.suppress(FileExistsError):
                    tmp.joinpath(*parts[:i]).mkdir()
            _safeio.write_atomic(tmp.joinpath(*parts), data)
        try:
            os.rename(tmp, dest)
        except OSError:  # another publisher kept the same snapshot first
            if not os.path.lexists(dest):
                raise
    except _safeio.UnsafeFile as exc:
        raise ArtifactError(f"cannot keep the family snapshot: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    read_snapshot(root, sha)
    return sha


def read_snapshot(root: Path, sha: str) -> dict[str, bytes]:
    """The files of snapshot ``sha``, refused (one line) unless they are plain files that hash to its name."""
    base = Path(root) / SNAPSHOTS
    folder = base / sha
    if not (_safeio.is_real_dir(base) and _safeio.is_real_dir(folder)):
        raise ArtifactError(f"{folder}: the family snapshot this version was published with is missing "
                            "(or not a plain folder)")
    files = _plain_files(folder)
    if snapshot_hash(files) != sha or SPEC not in files:
        raise ArtifactError(f"{folder}: the family snapshot's files do not hash to its name (tampered)")
    return files


def _plain_files(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` by its ``/`` path, read within bounds; anything but plain files and folders (a
    link, a device, too deep, too many) refused in one line."""
    files: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        rel = os.path.relpath(dirpath, folder)
        depth = 0 if rel == "." else rel.count(os.sep) + 1
        for name in sorted(dirnames + filenames):
            path = os.path.join(dirpath, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode) and depth < MAX_DEPTH - 1:
                continue
            if not stat.S_ISREG(mode) or len(files) >= MAX_FILES:
                raise ArtifactError(f"{folder}: the family snapshot holds something other than its files ({name})")
            try:
                data = _safeio.read_bytes(path, FILE_LIMIT)
            except _safeio.UnsafeFile as exc:
                raise ArtifactError(f"family snapshot unreadable: {exc}") from None
            files["/".join([*([] if rel == "." else rel.split(os.sep)), name])] = data
        dirnames[:] = [d for d in dirnames if stat.S_ISDIR(os.lstat(os.path.join(dirpath, d)).st_mode)]
    return files


def load_snapshot(root: Path, sha: str) -> Family:
    """The family of snapshot ``sha``, loaded from a private copy of its verified files (the store's copy is
    checked on every call; the private copy and its family are made once per process)."""
    from ..family._spec import load_family

    files = read_snapshot(root, sha)
    if sha in _LOADED and _LOADED[sha][0].is_dir():
        return _LOADED[sha][1]
    private = Path(tempfile.mkdtemp(prefix="ks-family-"))
    try:
        for name, data in files.items():
            path = private.joinpath(*name.split("/"))
            path.parent.mkdir(parents=True, exist_ok=True)
            _safeio.write_atomic(path, data)
        fam = load_family(private)
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise
    if len(_LOADED) >= _MAX_LOADED:
        _forget()
    _LOADED[sha] = (private, fam)
    return fam


def _forget() -> None:
    for folder, _ in _LOADED.values():
        shutil.rmtree(folder, ignore_errors=True)
    _LOADED.clear()


atexit.register(_forget)

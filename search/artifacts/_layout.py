"""The store's layout on disk and the records it reads and writes: the root and its file names, a key's
pointer (:class:`Pointer`), a loaded version (:class:`Artifact`), what a publish decided (:class:`PublishOutcome`),
what ``verify`` finds (:class:`VerifyResult`, :class:`Leftover`), and the writes every store operation shares (atomic,
flushed, under the key's lock)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _safeio
from .._rules import source_sha256
from ..family._render import Geometry, KernelSource
from . import _lockfile
from ._candidate import ArtifactKey
from ._manifest import (
    ArtifactError,
    KeyBusy,
    Manifest,
)

if TYPE_CHECKING:
    pass


ENV_VAR = "KERNSEARCH_ARTIFACTS"
DEFAULT_ROOT = "artifacts"
POINTER = "CURRENT"
JOURNAL = "journal.jsonl"
LOCK = ".lock"
#: ``migrate --untrusted-to invalidated``: the keys' current versions stop being dispatched.
INVALIDATED = "invalidated"


def default_root() -> Path:
    """``$KERNSEARCH_ARTIFACTS`` if set, else ``artifacts/`` of the working directory."""
    return Path(os.environ.get(ENV_VAR) or DEFAULT_ROOT)

@dataclass(frozen=True)
class PublishOutcome:
    """What the gate decided: ``version`` is the new version when published, else None."""

    published: bool
    version: str | None
    reason: str
    key: str
    current: str | None = None  # the current version after this publish attempt

@dataclass(frozen=True)
class Pointer:
    """The content of a key's CURRENT file."""

    version: str
    invalidated: str | None = None
    updated_at: str = ""

@dataclass(frozen=True)
class Artifact:
    """One loaded and verified version."""

    key: ArtifactKey
    version: str
    path: Path
    manifest: Manifest
    kernel: KernelSource
    #: The manifest's exact text, as verified (an export ships these bytes, not a second read of the file).
    manifest_text: str = ""
    #: The content hash the store's index recorded at publish (``_runtime.content_sha256``).
    content_sha256: str = ""

    @property
    def geometry(self) -> Geometry:
        return self.manifest.geometry.to_geometry()

class Fix(Enum):
    """What ``artifacts verify --repair`` does about a leftover of an interrupted writer (as text: ``Leftover.fix``)."""

    DELETE = "delete {}"  # a half-written folder (relative path)
    RECOVER = "journal: record {} as published (recovered)"  # a version in place with no journal entry
    ABORT_INDEXED = "index and journal: record {} as aborted"  # the index says published; the version never moved
    ABORT = "journal: record {} as aborted"  # the journal says published; the version never moved
    POINT = POINTER + ": point to {}"  # the pointer lags the published version
    DROP_TORN = "index: drop the torn line"  # the index ends with a torn append

@dataclass(frozen=True)
class Leftover:
    """Something an interrupted writer left: what is wrong (``problem``), and the repair (``action`` on ``subject``,
    a version or a relative path)."""

    problem: str
    action: Fix
    subject: str = ""

    @property
    def fix(self) -> str:
        """The repair as `verify` prints it."""
        return self.action.value.format(self.subject)

@dataclass(frozen=True)
class VerifyResult:
    where: str
    ok: bool
    message: str
    #: A version's check (False: the index, a journal, a pointer, a misplaced entry).
    version: bool = False


def read_kernel(folder: Path, manifest: Manifest) -> KernelSource:
    info = manifest.kernel
    for name in (info.header_file, info.source_file):
        if not os.path.lexists(folder / name):
            raise ArtifactError(f"{folder}: missing kernel file {name}")
    try:
        header = _safeio.read_text(folder / info.header_file, _safeio.SOURCE_LIMIT)
        source = _safeio.read_text(folder / info.source_file, _safeio.SOURCE_LIMIT)
    except _safeio.UnsafeFile as exc:
        raise ArtifactError(f"kernel file unusable (corrupted or tampered): {exc}") from None
    template = tuple((str(k), v) for k, v in info.template)
    actual = source_sha256(header, source, template, info.input_names, info.output_names)
    if actual != manifest.source_sha256:
        raise ArtifactError(f"{folder}: source hash mismatch (manifest {manifest.source_sha256[:12]}, files "
                            f"{actual[:12]}): tampered or corrupted")
    return KernelSource(name=info.name, target=info.target, input_names=tuple(info.input_names),
                        output_names=tuple(info.output_names), header=header, source=source, template=template)


def pointer_text(pointer: Pointer | None) -> str:
    if pointer is None:
        return "no current version"
    return pointer.version + (f" (invalidated: {pointer.invalidated[:80]})" if pointer.invalidated else "")


def journal_entry_ok(entry: Any) -> bool:
    """A journal line as :meth:`ArtifactStore._log` writes it (anything else is skipped, not trusted)."""
    return (isinstance(entry, dict) and entry.get("outcome") in ("published", "rejected", "invalidated", "aborted")
            and isinstance(entry.get("time"), str) and isinstance(entry.get("reason"), str)
            and isinstance(entry.get("version"), (str, type(None))))


def next_number(versions: list[str]) -> int:
    return max((int(v[1:]) for v in versions), default=0) + 1


def write_atomic(path: Path, text: str) -> None:
    """Every file of the store is written by the one safe write (:func:`kernsearch._safeio.write_atomic`)."""
    try:
        _safeio.write_atomic(path, text)
    except _safeio.UnsafeFile as exc:
        raise ArtifactError(f"cannot write to the store: {exc}") from None


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform can open a directory
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def locked(path: Path, timeout: float, key: ArtifactKey) -> Iterator[None]:
    """The key's publish lock (:mod:`kernsearch.artifacts._lockfile`), its failures as one-line artifact errors."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(_lockfile.exclusive(path, timeout))
        except _safeio.UnsafeFile as exc:
            raise ArtifactError(f"cannot lock the key: {exc}") from None
        except _lockfile.LockTimeout:
            raise KeyBusy(f"artifact key {key} is busy: another publisher holds {path} "
                                f"(waited {timeout:g} s)") from None
        yield

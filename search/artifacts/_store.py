"""The store's reading side and the writes every operation shares: keys, versions and pointers, a verified load,
the journal, and the pointer, journal and version writes that publishing, migrating and repairing all make."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _safeio
from .._rules import content_sha256
from ..family._render import KernelSource
from ._candidate import _VERSION, ArtifactKey, Draft
from ._index import INDEX, IndexState, StoreIndex, VersionRecord
from ._layout import (
    JOURNAL,
    LOCK,
    POINTER,
    Artifact,
    Pointer,
    PublishOutcome,
    default_root,
    fsync_dir,
    journal_entry_ok,
    locked,
    read_kernel,
    write_atomic,
)
from ._manifest import (
    ArtifactError,
    Manifest,
    parse_manifest,
    utcnow,
)

if TYPE_CHECKING:
    from ..family._spec import Family


class StoreBase:
    """A store under one root folder: what every operation on it reads and writes (``ArtifactStore`` adds publishing,
    ``StoreMigration`` migrating and rejudging, ``StoreRepair`` verifying and repairing)."""

    def __init__(self, root: str | Path | None = None, lock_timeout: float = 60.0,
                 families: dict[str, Family] | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.lock_timeout = lock_timeout
        #: Families (by name) ``migrate`` may index versions against besides the built-in ones (user folders).
        self.families: dict[str, Family] = dict(families or {})
        self.index = StoreIndex(self.root, lock_timeout)

    def check_writable(self) -> None:
        """Refuse, before any work, a store no publish could write: its root (or, while it does not exist
        yet, the nearest folder above it) must be a writable folder, not a file, FIFO or device."""
        path = self.root
        try:
            while not os.path.lexists(path) and path.parent != path:
                path = path.parent
        except ValueError:  # a NUL byte: no folder has that name
            raise ArtifactError(f"cannot publish to {str(self.root)[:200]!r}: not a usable path") from None
        if not path.is_dir():
            raise ArtifactError(f"cannot publish to {self.root}: {path} is not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ArtifactError(f"cannot publish to {self.root}: {path} is not writable")
        if path == self.root:
            self._check_indexed()
            self.index.check_appendable()

    def _check_indexed(self) -> None:
        """A store with versions but no index predates it: nothing is published into it before ``migrate``."""
        if not self.index.exists() and any(self.versions(k) for k in self.keys()):
            raise ArtifactError(f"{self.root} has versions but no store index ({INDEX}): it was made before "
                                "kernsearch recorded content hashes; run `kernsearch artifacts migrate` first")

    # -- reading ------------------------------------------------------------------------------------
    def key_dir(self, key: ArtifactKey) -> Path:
        return self.root / key.path

    def keys(self) -> list[ArtifactKey]:
        """Every key with at least one version or a journal, sorted."""
        found = []
        if not self.root.is_dir():
            return []
        for journal_or_version in sorted(self.root.glob("*/*/*/*")):
            if journal_or_version.name.startswith("."):
                continue
            rel_parts = journal_or_version.relative_to(self.root).parts
            # Links inside the store are never followed: a linked folder could lead anywhere.
            if not all(_safeio.is_real_dir(self.root.joinpath(*rel_parts[:i + 1])) for i in range(4)):
                continue
            rel = journal_or_version.relative_to(self.root).as_posix()
            try:
                key, _ = ArtifactKey.parse(rel)
            except ArtifactError:
                continue
            found.append(key)
        return sorted(found)

    def versions(self, key: ArtifactKey) -> list[str]:
        """Complete versions of a key, oldest first (hidden temporary folders are not versions)."""
        folder = self.key_dir(key)
        if not _safeio.is_real_dir(folder):
            return []
        numbered = [(int(m.group(1)), p.name) for p in folder.iterdir()
                    if _safeio.is_real_dir(p) and (m := _VERSION.match(p.name))]
        return [name for _, name in sorted(numbered)]

    def misplaced(self, key: ArtifactKey) -> list[str]:
        """Entries named like versions that are not plain folders (a file or a link called ``v3``)."""
        folder = self.key_dir(key)
        if not _safeio.is_real_dir(folder):
            return []
        return sorted(p.name for p in folder.iterdir() if _VERSION.match(p.name) and not _safeio.is_real_dir(p))

    def index_state(self) -> IndexState | None:
        """The store's verified index (None if it has none); raises :class:`ArtifactError` if it is damaged."""
        return self.index.state()

    def pointer(self, key: ArtifactKey) -> Pointer | None:
        """The key's current version: as the store's index records it (``CURRENT`` mirrors it for people and
        older readers, and ``verify`` reports a difference); the ``CURRENT`` file only in a store without one."""
        state = self.index_state()
        if state is None:
            return self.pointer_file(key)
        current = state.current(key.path)
        return Pointer(current.version, current.invalidated, current.time) if current else None

    def pointer_file(self, key: ArtifactKey) -> Pointer | None:
        """What the key's ``CURRENT`` file says."""
        path = self.key_dir(key) / POINTER
        if not os.path.lexists(path):
            return None
        try:
            data = _safeio.read_json(path, limit=_safeio.SPEC_LIMIT)
        except _safeio.UnsafeFile as exc:
            raise ArtifactError(f"malformed current pointer: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("version"), str) \
                or not isinstance(data.get("invalidated"), (str, type(None))):
            raise ArtifactError(f"{path}: malformed current pointer (expected {{\"version\": \"vN\", ...}})")
        pointer = Pointer(version=data["version"], invalidated=data.get("invalidated"),
                          updated_at=str(data.get("updated_at", ""))[:64])
        if not _VERSION.match(pointer.version):
            raise ArtifactError(f"{path}: malformed current pointer (version {pointer.version!r})")
        return pointer

    def load(self, key: ArtifactKey, version: str | None = None) -> Artifact:
        """A verified version (default: the current one); refuses tampered or malformed artifacts."""
        if version is None:
            pointer = self.pointer(key)
            if pointer is None:
                raise ArtifactError(f"no current artifact for {key} in {self.root}")
            version = pointer.version
        if not _VERSION.match(version):
            raise ArtifactError(f"bad version {version[:40]!r}: expected v1, v2, ...")
        folder = self.key_dir(key) / version
        manifest_file = folder / "manifest.json"
        if not _safeio.is_real_dir(folder):
            what = "not a folder (refused)" if os.path.lexists(folder) else "no such artifact version"
            raise ArtifactError(f"{folder}: {what}")
        if not os.path.lexists(manifest_file):
            raise ArtifactError(f"{folder}: no manifest.json")
        try:
            text = _safeio.read_text(manifest_file, _safeio.SOURCE_LIMIT)
        except _safeio.UnsafeFile as exc:
            raise ArtifactError(str(exc)) from None
        manifest = parse_manifest(text, str(folder))
        if manifest.key != key.path or manifest.version != version:
            raise ArtifactError(f"{folder}: manifest describes {manifest.key}/{manifest.version}, not this "
                                "folder (moved or tampered)")
        kernel = read_kernel(folder, manifest)
        record = self._record(key, version)
        content = content_sha256(text, kernel.header, kernel.source)
        if content != record.content:
            raise ArtifactError(f"{folder}: manifest or kernel files changed since publish (content hash "
                                f"{content[:12]}, the store index recorded {record.content[:12]}): tampered or "
                                "corrupted")
        from ._recheck import recheck
        from ._snapshot import load_snapshot

        # What the gate could have written, against the family it was rendered from (kept in the store).
        recheck(manifest, kernel, load_snapshot(self.root, record.family))
        return Artifact(key, version, folder, manifest, kernel, text, content)

    def _record(self, key: ArtifactKey, version: str) -> VersionRecord:
        """What the store's index recorded for a version; refused if it recorded nothing."""
        state = self.index_state()
        if state is None:
            raise ArtifactError(f"{key}/{version}: this store has no index ({self.root / INDEX}): it was made "
                                "before kernsearch recorded content hashes; run `kernsearch artifacts migrate` "
                                "to index it (after checking what it holds)")
        record = state.versions.get((key.path, version))
        if record is None:
            raise ArtifactError(f"{key}/{version}: not in the store index: no publish recorded it (copied in or "
                                "planted); `kernsearch artifacts migrate` indexes it if you trust it")
        return record

    def current_artifacts(self, family: str | None = None, *,
                          with_invalidated: bool = False) -> Iterator[Any]:
        """The current, valid (not invalidated) version of every key; unreadable ones raise.

        With ``with_invalidated``: ``(artifact, invalidated reason or None)`` for every current version.
        """
        for key in self.keys():
            if family is not None and key.family != family:
                continue
            pointer = self.pointer(key)
            if pointer is None or (pointer.invalidated and not with_invalidated):
                continue
            art = self.load(key, pointer.version)
            yield (art, pointer.invalidated) if with_invalidated else art

    def journal(self, key: ArtifactKey) -> list[dict[str, Any]]:
        """Publish attempts, oldest first (a line torn by a killed publisher is skipped)."""
        path = self.key_dir(key) / JOURNAL
        entries: list[dict[str, Any]] = []
        if not os.path.lexists(path):
            return entries
        try:
            data = _safeio.read_bytes(path, _safeio.JOURNAL_LIMIT)
        except _safeio.UnsafeFile as exc:
            raise ArtifactError(f"journal unreadable: {exc}") from None
        for raw in data.splitlines():
            with contextlib.suppress(ValueError, _safeio.UnsafeFile):
                entry = _safeio.loads_json(raw.decode("utf-8"), path)
                if journal_entry_ok(entry):
                    entries.append(entry)
        return entries

    def _recorded(self, key: ArtifactKey) -> list[str]:
        """Versions of ``key`` the index ever recorded (their numbers are never reused)."""
        state = self.index_state()
        if state is None:
            return []
        return [v for (k, v) in [*state.versions, *state.aborted] if k == key.path]

    def _write_pointer(self, key: ArtifactKey, pointer: Pointer) -> None:
        write_atomic(self.key_dir(key) / POINTER, json.dumps({"version": pointer.version,
                                                               "invalidated": pointer.invalidated,
                                                               "updated_at": utcnow().isoformat()}) + "\n")

    def _make_key_folder(self, key: ArtifactKey) -> Path:
        """The key's folder, created one level at a time, each level checked before anything is created in
        it: a link inside the store (it could lead outside) is refused before a single folder appears
        behind it."""
        self.root.mkdir(parents=True, exist_ok=True)  # the store itself: the user's choice
        path = self.root
        for part in key.path.split("/"):
            path = path / part
            with contextlib.suppress(FileExistsError):
                path.mkdir()
            if not _safeio.is_real_dir(path):
                raise ArtifactError(f"{path}: not a plain folder (a link or a file): refusing to write there")
        return path

    def invalidate(self, key: ArtifactKey, reason: str) -> None:
        """Mark the current version invalid (kept, not shipped; any correct candidate may replace it)."""
        folder = self.key_dir(key)
        with locked(folder / LOCK, self.lock_timeout, key):
            pointer = self.pointer(key)
            if pointer is None:
                raise ArtifactError(f"no current artifact for {key} to invalidate")
            if self.index_state() is None:
                raise ArtifactError(f"{self.root} has no store index: run `kernsearch artifacts migrate` first")
            self.index.append([{"op": "current", "key": key.path, "version": pointer.version,
                                "invalidated": reason[:2000]}])
            self._write_pointer(key, Pointer(pointer.version, reason[:2000]))
            self._log(key, "invalidated", pointer.version, reason, None)

    def _current_for_gate(self, key: ArtifactKey) -> tuple[Manifest | None, str | None]:
        try:
            pointer = self.pointer(key)
        except ArtifactError as exc:
            return None, f"current pointer unreadable: {exc}"
        if pointer is None:
            return None, None
        try:
            current = self.load(key, pointer.version).manifest
        except ArtifactError as exc:
            return None, f"current {pointer.version} unreadable: {exc}"
        return current, (f"current {pointer.version} invalidated: {pointer.invalidated}"
                         if pointer.invalidated else None)

    def _write_version(self, folder: Path, version: str, text: str, manifest: Manifest,
                       kernel: KernelSource) -> Path:
        """The complete version in a hidden temporary folder (invisible to readers), flushed to disk."""
        tmp = folder / f".tmp-{version}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        write_atomic(tmp / manifest.kernel.header_file, kernel.header)
        write_atomic(tmp / manifest.kernel.source_file, kernel.source)
        write_atomic(tmp / "manifest.json", text)
        fsync_dir(tmp)
        return tmp

    def _mirror_pointer(self, key: ArtifactKey) -> None:
        """Write ``CURRENT`` as the index says (no current version: the file is removed)."""
        pointer = self.pointer(key)
        if pointer is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.key_dir(key) / POINTER)
        else:
            self._write_pointer(key, pointer)

    def _reject(self, key: ArtifactKey, draft: Draft, reason: str,
                current: str | None = None) -> PublishOutcome:
        self._log(key, "rejected", None, reason, draft)
        pointer = None
        with contextlib.suppress(ArtifactError):
            pointer = self.pointer(key)
        return PublishOutcome(False, None, reason, key.path, pointer.version if pointer else current)

    def _log(self, key: ArtifactKey, outcome: str, version: str | None, reason: str, draft: Draft | None) -> None:
        entry: dict[str, Any] = {"time": utcnow().isoformat(), "outcome": outcome, "version": version,
                                 "reason": reason}
        if draft is not None:
            m = draft.measurements
            entry |= {"evidence": draft.evidence, "median_ms": m.median_ms if m else None, "study": draft.study,
                      "source_sha256": draft.source_sha256, "config": draft.config}
        try:
            _safeio.append_line(self.key_dir(key) / JOURNAL, json.dumps(entry) + "\n")
        except _safeio.UnsafeFile as exc:
            raise ArtifactError(f"cannot write the journal: {exc}") from None

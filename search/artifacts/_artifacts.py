"""The artifact store: immutable, versioned winning kernels with their evidence, behind a regression gate.

A search's winner outlives the search here. Usage (the search and the nightly flows call this)::

    from kernsearch.artifacts._artifacts import ArtifactStore, Candidate
    from kernsearch.artifacts._manifest import Correctness, Measurements

    candidate = Candidate.for_config(space, config, target="metal", evidence=Evidence.MEASURED,
                                     measurements=Measurements.from_timing(timing, baseline_timing),
                                     correctness=Correctness.from_checks("device", [("64x64x64", check)]),
                                     study="gemm-M2Max-float16-4096x4096x4096")
    outcome = ArtifactStore().publish(candidate)   # PublishOutcome(published, version, reason, key)

``Candidate(...)`` can also be built field by field (family, chip, dtype, shape, config, kernel, geometry,
correctness, evidence, measurements, study). ``chip.detected`` (``mx.device_info()``) is stored as the
chip identity; *measured* evidence needs one (a timing is measured only on a GPU detected here).

Layout (root: ``./artifacts``, or ``$KERNSEARCH_ARTIFACTS``, or ``ArtifactStore(root)``)::

    artifacts/gemm/M2-Max/float16/4096x4096x4096/   one key: family / chip / dtype / shape
        v1/ manifest.json header.metal source.metal   one version, never modified once written
        v2/ ...
        CURRENT          {"version": "v2", ...}: the current pointer, replaced atomically
        journal.jsonl    every publish attempt, published or rejected, with its reason
        .lock            held (flock) while a publisher decides and writes

Safety: a version is written into a hidden temporary folder, flushed to disk, then renamed into place
(atomic), so readers never see half a version; the pointer moves by an atomic rename of a new file.
Publishers to one key serialise on an advisory ``flock`` (released by the OS if a publisher dies), wait
at most ``lock_timeout`` seconds, then refuse cleanly. Loading checks the manifest schema and the source
hash; anything tampered or malformed is refused with a one-line :class:`ArtifactError`.

What may become current is decided by the regression gate (:mod:`kernsearch.artifacts._gate`); what a loaded version
must still match (its family renders the same source) by :mod:`kernsearch.artifacts._recheck`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _safeio
from .._errors import KernsearchError
from .._rules import DEFAULT_MARGIN, content_sha256, source_sha256
from .._vocabulary import Evidence
from ..family._render import Geometry, KernelSource
from . import _head, _lockfile
from ._candidate import _VERSION, ArtifactKey, Candidate, Draft
from ._candidate import draft_manifest as _draft_manifest
from ._gate import gate, loses_to_baseline
from ._index import INDEX, IndexState, StoreIndex, VersionRecord
from ._manifest import (
    SCHEMA_VERSION,
    ArtifactError,
    GateRecord,
    KeyBusy,
    Manifest,
    parse_manifest,
    utcnow,
)

if TYPE_CHECKING:
    from ..family._spec import Family

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


class ArtifactStore:
    """Versions of winning kernels under one root folder (see the module docstring)."""

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
        kernel = _read_kernel(folder, manifest)
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
                if _journal_entry_ok(entry):
                    entries.append(entry)
        return entries

    def verify(self) -> list[VerifyResult]:
        """Check the store's index and every version and pointer; one result per version (and per problem)."""
        results = []
        state: IndexState | None = None
        try:
            state = self.index_state()
            if state is not None:
                results.append(VerifyResult(INDEX, True, f"{state.entries} entries, chain intact"
                                            + (", sealed with the store key" if state.keyed else "")))
        except ArtifactError as exc:
            results.append(VerifyResult(INDEX, False, str(exc)))
        on_disk = set()
        for key in self.keys():
            for name in self.misplaced(key):
                results.append(VerifyResult(f"{key}/{name}", False,
                                            f"{self.key_dir(key) / name}: not a plain folder (a file or a link)"))
            try:
                self.journal(key)
            except ArtifactError as exc:
                results.append(VerifyResult(f"{key}/{JOURNAL}", False, str(exc)))
            for version in self.versions(key):
                on_disk.add((key.path, version))
                try:
                    self.load(key, version)
                    results.append(VerifyResult(f"{key}/{version}", True, "ok", True))
                except ArtifactError as exc:
                    results.append(VerifyResult(f"{key}/{version}", False, str(exc), True))
            results.extend(self._verify_pointer(key, state))
        if state is not None:
            explained = {(k.path, v) for k in self.keys() for v in self._aborted_publishes(k, state)}
            for (k, v) in sorted(set(state.versions) - on_disk - explained):
                results.append(VerifyResult(f"{k}/{v}", False, f"{self.root / k / v}: recorded by the store index "
                                            "but missing (deleted or moved)"))
        return results

    def _verify_pointer(self, key: ArtifactKey, state: IndexState | None) -> list[VerifyResult]:
        """The key's current version exists, and ``CURRENT`` says what the index says (or a crash explains it)."""
        where = f"{key}/{POINTER}"
        try:
            pointer, written = self.pointer(key), self.pointer_file(key)
        except ArtifactError as exc:
            return [VerifyResult(where, False, str(exc))]
        if pointer is not None and pointer.version not in self.versions(key) \
                and pointer.version not in self._aborted_publishes(key, state):
            return [VerifyResult(where, False, f"{self.key_dir(key) / POINTER}: points to missing {pointer.version}")]
        if state is not None and _pointer_text(written) != _pointer_text(pointer) \
                and not self._pointer_lags(key, state):
            return [VerifyResult(where, False, f"{self.key_dir(key) / POINTER} says {_pointer_text(written)}, the "
                                 f"store index says {_pointer_text(pointer)} (edited, or a writer was killed before CURRENT "
                                 "followed; the index decides; `verify --repair` rewrites CURRENT from it)")]
        return []

    def _aborted_publishes(self, key: ArtifactKey, state: IndexState | None) -> list[str]:
        """Versions the index records as the key's newest and current that never moved in place (a publisher
        killed between recording and moving it): ``repair`` records them aborted."""
        if state is None:
            return []
        current = state.current(key.path)
        if current is None or os.path.lexists(self.key_dir(key) / current.version):
            return []
        newest = max((v for (k, v) in state.versions if k == key.path), key=lambda v: int(v[1:]), default=None)
        return [current.version] if current.version == newest and current.invalidated is None else []

    def _pointer_lags(self, key: ArtifactKey, state: IndexState) -> bool:
        """``CURRENT`` still names the version before the index's current one (killed before the pointer moved)."""
        current = state.current(key.path)
        try:
            written = self.pointer_file(key)
        except ArtifactError:
            return False
        if current is None or current.invalidated is not None:
            return False
        return written is None or (int(written.version[1:]) < int(current.version[1:]))

    def stale_temporaries(self) -> list[Path]:
        """Half-written versions and snapshots left by killed publishers (invisible to readers; safe to delete)."""
        if not self.root.is_dir():
            return []
        from ._snapshot import SNAPSHOTS

        found = [*self.root.glob("*/*/*/*/.tmp-*"), *self.root.glob(f"{SNAPSHOTS}/.tmp-*")]
        return sorted(p for p in found if _safeio.is_real_dir(p))

    # -- writing ------------------------------------------------------------------------------------
    def publish(self, candidate: Candidate, *, min_gain: float = 0.0,
                margin: float = DEFAULT_MARGIN) -> PublishOutcome:
        """Offer a candidate to the regression gate; a new version becomes current only if it passes.

        A measured candidate must beat the baseline op: the lower bound of its measured speedup above
        1 + ``margin``; one that loses is recorded in the journal (not dispatched) and no version is made.
        ``min_gain`` is a relative speed-up over the current version required on top of the measured noise.
        Raises :class:`ArtifactError` for a malformed candidate or a key busy beyond ``lock_timeout``.
        """
        draft = _draft_manifest(candidate)
        try:
            return self._publish(candidate, draft, min_gain, margin)
        except OSError as exc:  # read-only store, full disk...: nothing half-written is visible
            raise ArtifactError(f"cannot publish to {self.key_dir(candidate.key)}: "
                                f"{exc.strerror or exc}") from None
        except _safeio.UnsafeFile as exc:
            raise ArtifactError(f"cannot publish to {self.key_dir(candidate.key)}: {exc}") from None

    def _publish(self, candidate: Candidate, draft: Draft, min_gain: float, margin: float) -> PublishOutcome:
        key = candidate.key
        self._check_indexed()
        self.index.check_appendable()
        folder = self._make_key_folder(key)
        with _locked(folder / LOCK, self.lock_timeout, key):
            if not candidate.correctness.passed:
                return self._reject(key, draft, "failed verification: a variant that is not correct is "
                                    "never published")
            loses = loses_to_baseline(draft.evidence, draft.measurements, candidate.family.baseline_name, margin,
                                      modes=candidate.family.consumer_modes)
            if loses:
                return self._reject(key, draft, f"recorded, not dispatched: {loses}")
            current, invalid = self._current_for_gate(key)
            ok, reason = gate(draft, current, invalid, min_gain)
            if not ok:
                return self._reject(key, draft, reason, current.version if current else None)
            version = f"v{_next_number(self.versions(key) + self.misplaced(key) + self._recorded(key))}"
            manifest = draft.manifest(version, GateRecord(reason=reason, replaced=current.version if current else None))
            family = self._keep_family(candidate, manifest)
            text = manifest.to_json()
            content = content_sha256(text, candidate.kernel.header, candidate.kernel.source)
            # Crash-consistent order: the version is complete in a hidden folder, then the journal says it
            # is published, then the index records its content hash and makes it current, then it moves into
            # place, then CURRENT follows. A crash between two steps leaves a state `artifacts verify` reports
            # and `--repair` finishes (or rolls back).
            tmp = self._write_version(folder, version, text, manifest, candidate.kernel)
            try:
                self._log(key, "published", version, reason, draft)
                self.index.append([{"op": "version", "key": key.path, "version": version, "content": content,
                                    "family": family},
                                   {"op": "current", "key": key.path, "version": version}])
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            os.rename(tmp, folder / version)  # atomic; fails rather than merge if the name exists
            _fsync_dir(folder)
            self._write_pointer(key, Pointer(version))
            return PublishOutcome(True, version, reason, key.path, version)

    def _recorded(self, key: ArtifactKey) -> list[str]:
        """Versions of ``key`` the index ever recorded (their numbers are never reused)."""
        state = self.index_state()
        if state is None:
            return []
        return [v for (k, v) in [*state.versions, *state.aborted] if k == key.path]

    def _keep_family(self, candidate: Candidate, manifest: Manifest) -> str:
        """Keep the family the candidate was rendered from in the store and check the new version against
        it exactly as every load will; returns the snapshot's hash (recorded in the index)."""
        from ._recheck import recheck
        from ._snapshot import family_files, load_snapshot, write_snapshot

        files = family_files(candidate.family, candidate.kernel.target, candidate.config, candidate.dtype)
        sha = write_snapshot(self.root, files)
        recheck(manifest, candidate.kernel, load_snapshot(self.root, sha))
        return sha

    def _write_pointer(self, key: ArtifactKey, pointer: Pointer) -> None:
        _write_atomic(self.key_dir(key) / POINTER, json.dumps({"version": pointer.version,
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
        with _locked(folder / LOCK, self.lock_timeout, key):
            pointer = self.pointer(key)
            if pointer is None:
                raise ArtifactError(f"no current artifact for {key} to invalidate")
            if self.index_state() is None:
                raise ArtifactError(f"{self.root} has no store index: run `kernsearch artifacts migrate` first")
            self.index.append([{"op": "current", "key": key.path, "version": pointer.version,
                                "invalidated": reason[:2000]}])
            self._write_pointer(key, Pointer(pointer.version, reason[:2000]))
            self._log(key, "invalidated", pointer.version, reason, None)

    def migrate(self, families: list[Family] | None = None, untrusted_to: str | None = None) -> list[str]:
        """Bring the store under the current rules; returns one line per thing done (or refused).

        Manifests of older schemas are rewritten in the current one, and every version the index does not
        hold is indexed: checked in full against the family it was rendered from (the built-in family, or one
        of ``families``, whose template is the one its manifest names), that family kept in the store, and its
        content hash recorded; a key's current version is recorded as ``CURRENT`` names it. A version no family
        here renders is not indexed (and stays refused). With ``KERNSEARCH_STORE_KEY`` set, an index written
        without the key is sealed with it.

        It never seals what it cannot vouch for (:meth:`untrusted`): versions a keyed chain does not cover in a
        store that was keyed, and measured claims no keyed chain covers, are refused (nothing is changed)
        unless ``untrusted_to`` re-judges them: ``modeled`` (their measured claims become predictions) or
        ``invalidated`` (their keys' current versions stop being dispatched). A migrated store never gains a
        measured claim; a truncated or rolled-back keyed index is refused whatever the option.
        """
        if untrusted_to not in (None, Evidence.MODELED.value, INVALIDATED):
            raise ArtifactError(f"--untrusted-to {str(untrusted_to)[:40]!r}: expected modeled or invalidated")
        refused = self.untrusted()
        if refused and untrusted_to is None:
            names = ", ".join(refused[:6]) + (f" and {len(refused) - 6} more" if len(refused) > 6 else "")
            raise ArtifactError(f"{self.root}: not migrated: {len(refused)} version(s) the store's keyed chain does "
                                f"not vouch for ({names}); nothing changed: re-judge them with --untrusted-to "
                                "modeled or --untrusted-to invalidated, or restore the store")
        done = []
        plan = _Rejudge(set(refused), untrusted_to)
        try:
            resealed = self.index.reseal()
            if resealed:
                done.append(f"{INDEX}: {resealed} line(s) sealed with the store key")
            for key in self.keys():
                with _locked(self.key_dir(key) / LOCK, self.lock_timeout, key):
                    done.extend(self._migrate_key(key, families or [], plan))
        except OSError as exc:  # a read-only store, a full disk
            raise ArtifactError(f"cannot migrate {self.root}: {exc.strerror or exc}") from None
        return done

    def untrusted(self) -> list[str]:
        """``key/version`` of every version ``migrate`` could not vouch for: with the key, in a store that was
        keyed (a keyed line, a head record, or this machine saw it keyed), every version no keyed line records
        (a version or current line written without the key, or no line at all); otherwise the versions claiming
        measured evidence that no line records (or, with the key, only lines written without it)."""
        from ._index import store_key

        state = self.index.survey()
        secret = store_key()
        keyed = secret is not None and ((state is not None and state.keyed) or _head.has_record(self.root))
        found = []
        for key in self.keys():
            for version in self.versions(key):
                kv = (key.path, version)
                if state is not None and kv in state.versions and (secret is None or kv not in state.unsealed):
                    continue
                if keyed or self._claims_measured(key, version):
                    found.append(f"{key}/{version}")
        return found

    def _claims_measured(self, key: ArtifactKey, version: str) -> bool:
        try:
            text = _safeio.read_text(self.key_dir(key) / version / "manifest.json", _safeio.SOURCE_LIMIT)
            return bool(parse_manifest(text, str(self.key_dir(key) / version)).evidence == Evidence.MEASURED)
        except (_safeio.UnsafeFile, ArtifactError):
            return False  # not indexed by migrate either: it stays refused

    def _migrate_key(self, key: ArtifactKey, families: list[Family], plan: _Rejudge) -> list[str]:
        state = self.index_state()
        events, done = self._migrate_versions(key, families, plan, state)
        try:
            written = self.pointer_file(key)
        except ArtifactError as exc:
            written = None
            done.append(f"{key}: current version not recorded: {exc}")
        recorded = {e["version"] for e in events} | {v for (k, v) in (state.versions if state else {}) if k == key.path}
        current = state.current(key.path) if state is not None else None
        if current is None and written is not None and written.version in recorded:
            events.append({"op": "current", "key": key.path, "version": written.version,
                           "invalidated": written.invalidated})
            done.append(f"{key}: current {_pointer_text(written)} recorded")
            current_version: str | None = written.version
            invalid = written.invalidated
        else:
            current_version, invalid = (current.version, current.invalidated) if current else (None, None)
        if current_version is not None and invalid is None and plan.invalidates(key, current_version):
            why = "migrated: not vouched for by the store key (re-judged invalidated)"
            events.append({"op": "current", "key": key.path, "version": current_version, "invalidated": why})
            done.append(f"{key}/{current_version}: {why}")
        self._commit_migration(key, events)
        return done

    def _migrate_versions(self, key: ArtifactKey, families: list[Family], plan: _Rejudge,
                          state: IndexState | None) -> tuple[list[dict[str, Any]], list[str]]:
        """Each version of ``key`` the index lacks, indexed after its full check; an indexed one only re-judged
        modeled where the store key cannot vouch for it. The index events, and a line a version for the user."""
        events: list[dict[str, Any]] = []
        done = []
        for version in self.versions(key):
            demote = plan.demotes(key, version)
            if state is not None and (key.path, version) in state.versions:
                if demote:
                    events.append(self._demote_indexed(key, version, state.versions[(key.path, version)].family))
                    done.append(f"{key}/{version}: not vouched for by the store key: re-judged modeled")
                continue
            try:
                event, note = self._index_version(key, version, families, demote)
            except KernsearchError as exc:
                done.append(f"{key}/{version}: not indexed: {exc}")
                continue
            events.append(event)
            done.append(f"{key}/{version}: indexed{note}")
        return events, done

    def _commit_migration(self, key: ArtifactKey, events: list[dict[str, Any]]) -> None:
        """The migration's events appended to the index; ``CURRENT`` rewritten from it when a current changed."""
        if events:
            self.index.append(events)
            if any(e["op"] == "current" for e in events):
                self._mirror_pointer(key)

    def _demote_indexed(self, key: ArtifactKey, version: str, family_sha: str) -> dict[str, Any]:
        """An indexed version's measured claim rewritten as a prediction, and its new content hash's event."""
        folder = self.key_dir(key) / version
        try:
            text = _safeio.read_text(folder / "manifest.json", _safeio.SOURCE_LIMIT)
        except _safeio.UnsafeFile as exc:
            raise ArtifactError(str(exc)) from None
        manifest = parse_manifest(text, str(folder))
        kernel = _read_kernel(folder, manifest)
        text = _as_modeled(manifest)
        _write_atomic(folder / "manifest.json", text)
        return {"op": "version", "key": key.path, "version": version,
                "content": content_sha256(text, kernel.header, kernel.source), "family": family_sha}

    def _index_version(self, key: ArtifactKey, version: str, families: list[Family],
                       demote: bool = False) -> tuple[dict[str, Any], str]:
        """The index event of a version not yet indexed (schema migrated first), after its full check."""
        from ._recheck import recheck
        from ._snapshot import family_files, load_snapshot, write_snapshot

        folder = self.key_dir(key) / version
        try:
            text = _safeio.read_text(folder / "manifest.json", _safeio.SOURCE_LIMIT)
        except _safeio.UnsafeFile as exc:
            raise ArtifactError(str(exc)) from None
        manifest = parse_manifest(text, str(folder))
        if manifest.key != key.path or manifest.version != version:
            raise ArtifactError(f"manifest describes {manifest.key}/{manifest.version}, not this folder")
        kernel = _read_kernel(folder, manifest)
        fam = self._family_of(manifest, families)
        files = family_files(fam, manifest.kernel.target, {**fam.default, **manifest.config}, manifest.problem.dtype)
        sha = write_snapshot(self.root, files)
        recheck(manifest, kernel, load_snapshot(self.root, sha))
        note = ""
        if demote:
            text = _as_modeled(manifest)
            _write_atomic(folder / "manifest.json", text)
            note = " (not vouched for by the store key: re-judged modeled)"
        elif json.loads(text).get("schema_version") != SCHEMA_VERSION:
            text = manifest.to_json()
            _write_atomic(folder / "manifest.json", text)
            note = f" (manifest rewritten in schema {SCHEMA_VERSION})"
        event = {"op": "version", "key": key.path, "version": version,
                 "content": content_sha256(text, kernel.header, kernel.source), "family": sha}
        return event, note

    def _family_of(self, manifest: Manifest, families: list[Family]) -> Family:
        """The family a version was rendered from: the first of ``families``, the store's own and the
        built-in one named like it whose template for the version's target is the one the manifest names."""
        from ..family._spec import builtin_family_names, load_family

        named = [f for f in [*families, *self.families.values()] if f.name == manifest.family]
        if manifest.family in builtin_family_names():
            named.append(load_family(manifest.family))
        for fam in named:
            if manifest.kernel.target not in fam.templates:
                continue
            try:
                data = _safeio.read_bytes(fam.template_path(manifest.kernel.target))
            except _safeio.UnsafeFile:
                continue
            if hashlib.sha256(data).hexdigest() == manifest.template.sha256:
                return fam
        raise ArtifactError(f"rendered from a {manifest.template.file} (sha256 {manifest.template.sha256[:12]}) that "
                            f"no family here has: give the family folder it was rendered from with --family")

    def rejudge(self, margin: float = DEFAULT_MARGIN) -> list[tuple[ArtifactKey, str]]:
        """Apply the "beats the baseline op" rule to every current measured version; losers are invalidated
        (kept, not dispatched). Returns ``(key, reason)`` for each version invalidated now."""
        from .._vocabulary import CONSUMER_MODES
        from ..family._spec import load_family

        done = []
        for key in self.keys():
            pointer = self.pointer(key)
            if pointer is None or pointer.invalidated:
                continue
            m = self.load(key, pointer.version).manifest
            modes: tuple[str, ...]
            try:
                fam = load_family(key.family)
                op, modes = fam.baseline_name, tuple(fam.consumer_modes)
            except KernsearchError:
                op, modes = "the MLX op", CONSUMER_MODES
            why = loses_to_baseline(m.evidence, m.measurements, op, margin, version=pointer.version, modes=modes)
            if why:
                self.invalidate(key, f"re-judged: {why}")
                done.append((key, why))
        return done

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
        _write_atomic(tmp / manifest.kernel.header_file, kernel.header)
        _write_atomic(tmp / manifest.kernel.source_file, kernel.source)
        _write_atomic(tmp / "manifest.json", text)
        _fsync_dir(tmp)
        return tmp

    def crash_leftovers(self, key: ArtifactKey) -> list[Leftover]:
        """What an interrupted publisher left for ``key``: see :meth:`repair`."""
        found: list[Leftover] = []
        try:
            entries = self.journal(key)
            state = self.index_state()
            pointer = self.pointer_file(key)
        except ArtifactError:
            return found  # reported by verify as unreadable; not something repair may guess about
        versions = self.versions(key)
        published = {e["version"] for e in entries if e["outcome"] == "published"}
        aborted = {e["version"] for e in entries if e["outcome"] == "aborted"}
        for v in versions:
            if v not in published:
                found.append(Leftover(f"{v} has no journal entry (its publisher was killed before writing it)",
                                      Fix.RECOVER, v))
        for v in self._aborted_publishes(key, state):
            found.append(Leftover(f"the store index records {v} as published but no such version exists (killed "
                                  "before the move)", Fix.ABORT_INDEXED, v))
        recorded = {v for (k, v) in state.versions if k == key.path} if state is not None else set()
        for v in sorted(published - aborted - set(versions) - recorded, key=lambda v: int(v[1:])):
            found.append(Leftover(f"journal says {v} was published but no such version exists (killed before the "
                                  "move)", Fix.ABORT, v))
        found.extend(self._pointer_leftovers(key, state, entries, versions, pointer))
        found.extend(Leftover(f"{tmp.name} is a half-written version", Fix.DELETE, tmp.name)
                     for tmp in self.stale_temporaries() if tmp.parent == self.key_dir(key))
        return found

    def _pointer_leftovers(self, key: ArtifactKey, state: IndexState | None, entries: list[dict[str, Any]],
                           versions: list[str], pointer: Pointer | None) -> list[Leftover]:
        """``CURRENT`` behind the newest published version: judged by the store index where there is one (it
        records what was published), else by the journal."""
        if state is None:
            return self._unindexed_pointer_leftovers(key, entries, versions, pointer)
        if not self._pointer_lags(key, state):
            return []
        current = state.current(key.path)
        assert current is not None
        return [Leftover(f"{current.version} was published but {POINTER} still points to "
                         f"{pointer.version if pointer else 'nothing'} (killed before the pointer moved)",
                         Fix.POINT, current.version)]

    @staticmethod
    def _unindexed_pointer_leftovers(key: ArtifactKey, entries: list[dict[str, Any]], versions: list[str],
                                     pointer: Pointer | None) -> list[Leftover]:
        """A store without an index: the newest published version is current unless CURRENT moved past it."""
        latest = max((e["version"] for e in entries if e["outcome"] == "published" and e["version"] in versions),
                     key=lambda v: int(v[1:]), default=None)
        if latest is not None and (pointer is None or (int(latest[1:]) > int(pointer.version[1:])
                                                       and not pointer.invalidated)):
            return [Leftover(f"{latest} was published but {POINTER} still points to "
                             f"{pointer.version if pointer else 'nothing'} (killed before the pointer moved)",
                             Fix.POINT, latest)]
        return []

    def store_leftovers(self) -> list[Leftover]:
        """What interrupted writers left outside any key: a torn index line, half-written family snapshots."""
        found = []
        with contextlib.suppress(ArtifactError):
            state = self.index_state()
            if state is not None and state.torn:
                found.append(Leftover(f"{INDEX} ends with a torn line (an append was cut short)", Fix.DROP_TORN))
        from ._snapshot import SNAPSHOTS

        for tmp in self.stale_temporaries():
            if tmp.parent == self.root / SNAPSHOTS:
                found.append(Leftover(f"{SNAPSHOTS}/{tmp.name} is a half-written family snapshot", Fix.DELETE,
                                      f"{SNAPSHOTS}/{tmp.name}"))
        return found

    def repair_store(self) -> list[str]:
        """Fix what :meth:`store_leftovers` reports; returns what was done."""
        done = []
        for left in self.store_leftovers():
            if left.action is Fix.DROP_TORN:
                self.index.drop_torn_tail()
            else:
                shutil.rmtree(self.root / left.subject, ignore_errors=True)
            done.append(left.fix)
        return done

    def repair(self, key: ArtifactKey) -> list[str]:
        """Finish or roll back what interrupted publishers left for ``key``; returns what was done."""
        folder = self.key_dir(key)
        done: list[str] = []
        with _locked(folder / LOCK, self.lock_timeout, key):
            for left in self.crash_leftovers(key):
                self._repair_one(key, left)
                done.append(left.fix)
            if self.index_state() is not None:  # the index decides; CURRENT only mirrors it
                try:
                    written = _pointer_text(self.pointer_file(key))
                except ArtifactError:
                    written = "unreadable"
                if written != _pointer_text(self.pointer(key)):
                    self._mirror_pointer(key)
                    done.append(f"{POINTER}: rewritten from the store index")
        return done

    def _repair_one(self, key: ArtifactKey, left: Leftover) -> None:
        v = left.subject
        if left.action is Fix.DELETE:
            shutil.rmtree(self.key_dir(key) / v, ignore_errors=True)
        elif left.action is Fix.RECOVER:
            self._log(key, "published", v, "recovered by artifacts verify --repair", None)
        elif left.action in (Fix.ABORT_INDEXED, Fix.ABORT):
            if left.action is Fix.ABORT_INDEXED:
                self.index.append([{"op": "abort", "key": key.path, "version": v}])
            self._log(key, "aborted", v, "publisher interrupted before the version moved in place", None)
            if left.action is Fix.ABORT_INDEXED:
                self._mirror_pointer(key)
        elif left.action is Fix.POINT:
            self.load(key, v)  # only a verified version becomes current
            if self.index_state() is None:
                self._write_pointer(key, Pointer(v))
            else:
                self._mirror_pointer(key)

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


# -- helpers -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Rejudge:
    """What ``migrate --untrusted-to`` does with the versions it cannot vouch for (``key/version``)."""

    untrusted: set[str]
    to: str | None

    def demotes(self, key: ArtifactKey, version: str) -> bool:
        return self.to == Evidence.MODELED.value and f"{key}/{version}" in self.untrusted

    def invalidates(self, key: ArtifactKey, version: str) -> bool:
        return self.to == INVALIDATED and f"{key}/{version}" in self.untrusted


def _as_modeled(manifest: Manifest) -> str:
    """The manifest with a measured claim turned into a prediction (other kinds unchanged)."""
    if manifest.evidence != Evidence.MEASURED:
        return manifest.to_json()
    return manifest.model_copy(update={"evidence": Evidence.MODELED}).to_json()


def _read_kernel(folder: Path, manifest: Manifest) -> KernelSource:
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


def _pointer_text(pointer: Pointer | None) -> str:
    if pointer is None:
        return "no current version"
    return pointer.version + (f" (invalidated: {pointer.invalidated[:80]})" if pointer.invalidated else "")


def _journal_entry_ok(entry: Any) -> bool:
    """A journal line as :meth:`ArtifactStore._log` writes it (anything else is skipped, not trusted)."""
    return (isinstance(entry, dict) and entry.get("outcome") in ("published", "rejected", "invalidated", "aborted")
            and isinstance(entry.get("time"), str) and isinstance(entry.get("reason"), str)
            and isinstance(entry.get("version"), (str, type(None))))


def _next_number(versions: list[str]) -> int:
    return max((int(v[1:]) for v in versions), default=0) + 1


def _write_atomic(path: Path, text: str) -> None:
    """Every file of the store is written by the one safe write (:func:`kernsearch._safeio.write_atomic`)."""
    try:
        _safeio.write_atomic(path, text)
    except _safeio.UnsafeFile as exc:
        raise ArtifactError(f"cannot write to the store: {exc}") from None


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform can open a directory
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _locked(path: Path, timeout: float, key: ArtifactKey) -> Iterator[None]:
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

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
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import _lockfile
from .. import _safeio
from ._candidate import _VERSION, ArtifactKey, Candidate
from ._candidate import draft_manifest as _draft_manifest
from .._errors import KernsearchError
from ._gate import gate, loses_to_baseline
from ._manifest import (
    SCHEMA_VERSION,
    ArtifactError,
    GateRecord,
    KeyBusy,
    Manifest,
    parse_manifest,
    utcnow,
)
from ..family._render import Geometry, KernelSource, source_sha256
from ..exporting.runtime._runtime import DEFAULT_MARGIN

if TYPE_CHECKING:
    from ..family._spec import Family

ENV_VAR = "KERNSEARCH_ARTIFACTS"
DEFAULT_ROOT = "artifacts"
POINTER = "CURRENT"
JOURNAL = "journal.jsonl"
LOCK = ".lock"


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

    @property
    def geometry(self) -> Geometry:
        return self.manifest.geometry.to_geometry()


@dataclass(frozen=True)
class VerifyResult:
    where: str
    ok: bool
    message: str


class ArtifactStore:
    """Versions of winning kernels under one root folder (see the module docstring)."""

    def __init__(self, root: str | Path | None = None, lock_timeout: float = 60.0,
                 families: dict[str, Family] | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.lock_timeout = lock_timeout
        #: Families (by name) manifests are re-validated against besides the built-in ones (user folders).
        self.families: dict[str, Family] = dict(families or {})

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

    def pointer(self, key: ArtifactKey) -> Pointer | None:
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
        from ._recheck import recheck

        recheck(manifest, kernel, self.families.get(manifest.family))  # what the gate could have written
        return Artifact(key, version, folder, manifest, kernel)

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
        """Check every version and pointer of the store; one result per version (and per problem)."""
        results = []
        for key in self.keys():
            for name in self.misplaced(key):
                results.append(VerifyResult(f"{key}/{name}", False,
                                            f"{self.key_dir(key) / name}: not a plain folder (a file or a link)"))
            try:
                self.journal(key)
            except ArtifactError as exc:
                results.append(VerifyResult(f"{key}/{JOURNAL}", False, str(exc)))
            for version in self.versions(key):
                try:
                    self.load(key, version)
                    results.append(VerifyResult(f"{key}/{version}", True, "ok"))
                except ArtifactError as exc:
                    results.append(VerifyResult(f"{key}/{version}", False, str(exc)))
            try:
                pointer = self.pointer(key)
                if pointer is not None and pointer.version not in self.versions(key):
                    results.append(VerifyResult(f"{key}/{POINTER}", False,
                                                f"{self.key_dir(key) / POINTER}: points to missing {pointer.version}"))
            except ArtifactError as exc:
                results.append(VerifyResult(f"{key}/{POINTER}", False, str(exc)))
        return results

    def stale_temporaries(self) -> list[Path]:
        """Half-written versions left by killed publishers (invisible to readers; safe to delete)."""
        return sorted(p for p in self.root.glob("*/*/*/*/.tmp-*") if p.is_dir()) if self.root.is_dir() else []

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

    def _publish(self, candidate: Candidate, draft: dict[str, Any], min_gain: float,
                 margin: float) -> PublishOutcome:
        key = candidate.key
        folder = self._make_key_folder(key)
        with _locked(folder / LOCK, self.lock_timeout, key):
            if not candidate.correctness.passed:
                return self._reject(key, draft, "failed verification: a variant that is not correct is "
                                    "never published")
            loses = loses_to_baseline(draft, candidate.family.baseline_name, margin)
            if loses:
                return self._reject(key, draft, f"recorded, not dispatched: {loses}")
            current, invalid = self._current_for_gate(key)
            ok, reason = gate(draft, current, invalid, min_gain)
            if not ok:
                return self._reject(key, draft, reason, current.version if current else None)
            version = f"v{_next_number(self.versions(key) + self.misplaced(key))}"
            manifest = Manifest(**draft, version=version, published_at=utcnow(),
                                gate=GateRecord(reason=reason, replaced=current.version if current else None))
            # Crash-consistent order: the version is complete in a hidden folder, then the journal says it
            # is published, then it moves into place, then the pointer moves. A crash between two steps
            # leaves a state `artifacts verify` reports and `--repair` finishes (or rolls back).
            tmp = self._write_version(folder, version, manifest, candidate.kernel)
            try:
                self._log(key, "published", version, reason, draft)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            os.rename(tmp, folder / version)  # atomic; fails rather than merge if the name exists
            _fsync_dir(folder)
            _write_atomic(folder / POINTER, json.dumps({"version": version, "invalidated": None,
                                                        "updated_at": utcnow().isoformat()}) + "\n")
            return PublishOutcome(True, version, reason, key.path, version)

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
            _write_atomic(folder / POINTER, json.dumps({"version": pointer.version, "invalidated": reason,
                                                        "updated_at": utcnow().isoformat()}) + "\n")
            self._log(key, "invalidated", pointer.version, reason, None)

    def migrate(self) -> list[str]:
        """Rewrite manifests of older schemas in the current one (readers migrate them in memory anyway);
        returns ``key/version`` of each rewritten manifest."""
        done = []
        for key in self.keys():
            with _locked(self.key_dir(key) / LOCK, self.lock_timeout, key):
                for version in self.versions(key):
                    path = self.key_dir(key) / version / "manifest.json"
                    try:
                        raw = _safeio.read_json(path, limit=_safeio.SOURCE_LIMIT)
                    except _safeio.UnsafeFile as exc:
                        raise ArtifactError(str(exc)) from None
                    if not isinstance(raw, dict) or raw.get("schema_version") == SCHEMA_VERSION:
                        continue
                    manifest = self.load(key, version).manifest  # validated, migrated in memory
                    _write_atomic(path, manifest.to_json())
                    done.append(f"{key}/{version}")
        return done

    def rejudge(self, margin: float = DEFAULT_MARGIN) -> list[tuple[ArtifactKey, str]]:
        """Apply the "beats the baseline op" rule to every current measured version; losers are invalidated
        (kept, not dispatched). Returns ``(key, reason)`` for each version invalidated now."""
        from ..family._spec import load_family

        done = []
        for key in self.keys():
            pointer = self.pointer(key)
            if pointer is None or pointer.invalidated:
                continue
            m = self.load(key, pointer.version).manifest
            try:
                op = load_family(key.family).baseline_name
            except KernsearchError:
                op = "the MLX op"
            why = loses_to_baseline(m.model_dump(), op, margin, version=pointer.version)
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

    def _write_version(self, folder: Path, version: str, manifest: Manifest, kernel: KernelSource) -> Path:
        """The complete version in a hidden temporary folder (invisible to readers), flushed to disk."""
        tmp = folder / f".tmp-{version}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        _write_file(tmp / manifest.kernel.header_file, kernel.header)
        _write_file(tmp / manifest.kernel.source_file, kernel.source)
        _write_file(tmp / "manifest.json", manifest.to_json())
        _fsync_dir(tmp)
        return tmp

    def crash_leftovers(self, key: ArtifactKey) -> list[tuple[str, str]]:
        """``(problem, fix)`` for what an interrupted publisher left: see :meth:`repair`."""
        found: list[tuple[str, str]] = []
        try:
            entries = self.journal(key)
            pointer = self.pointer(key)
        except ArtifactError:
            return found  # reported by verify as unreadable; not something repair may guess about
        versions = self.versions(key)
        published = {e["version"] for e in entries if e["outcome"] == "published"}
        aborted = {e["version"] for e in entries if e["outcome"] == "aborted"}
        for v in versions:
            if v not in published:
                found.append((f"{v} has no journal entry (its publisher was killed before writing it)",
                              f"journal: record {v} as published (recovered)"))
        for v in sorted(published - aborted - set(versions), key=lambda v: int(v[1:])):
            found.append((f"journal says {v} was published but no such version exists (killed before the move)",
                          f"journal: record {v} as aborted"))
        latest = max((e["version"] for e in entries if e["outcome"] == "published" and e["version"] in versions),
                     key=lambda v: int(v[1:]), default=None)
        if latest is not None and (pointer is None or (int(latest[1:]) > int(pointer.version[1:])
                                                       and not pointer.invalidated)):
            found.append((f"{latest} was published but {POINTER} still points to "
                          f"{pointer.version if pointer else 'nothing'} (killed before the pointer moved)",
                          f"{POINTER}: point to {latest}"))
        for tmp in self.stale_temporaries():
            if tmp.parent == self.key_dir(key):
                found.append((f"{tmp.name} is a half-written version", f"delete {tmp.name}"))
        return found

    def repair(self, key: ArtifactKey) -> list[str]:
        """Finish or roll back what interrupted publishers left for ``key``; returns what was done."""
        folder = self.key_dir(key)
        done: list[str] = []
        with _locked(folder / LOCK, self.lock_timeout, key):
            for _problem, fix in self.crash_leftovers(key):
                if fix.startswith("delete "):
                    shutil.rmtree(folder / fix.removeprefix("delete "), ignore_errors=True)
                elif fix.startswith("journal: record") and fix.endswith("(recovered)"):
                    v = fix.split()[2]
                    self._log(key, "published", v, "recovered by artifacts verify --repair", None)
                elif fix.startswith("journal: record"):
                    v = fix.split()[2]
                    self._log(key, "aborted", v, "publisher interrupted before the version moved in place", None)
                elif fix.startswith(f"{POINTER}: point to "):
                    v = fix.rsplit(" ", 1)[1]
                    self.load(key, v)  # only a verified version becomes current
                    _write_atomic(folder / POINTER, json.dumps({"version": v, "invalidated": None,
                                                                "updated_at": utcnow().isoformat()}) + "\n")
                done.append(fix)
        return done

    def _reject(self, key: ArtifactKey, draft: dict[str, Any], reason: str,
                current: str | None = None) -> PublishOutcome:
        self._log(key, "rejected", None, reason, draft)
        pointer = None
        with contextlib.suppress(ArtifactError):
            pointer = self.pointer(key)
        return PublishOutcome(False, None, reason, key.path, pointer.version if pointer else current)

    def _log(self, key: ArtifactKey, outcome: str, version: str | None, reason: str,
             draft: dict[str, Any] | None) -> None:
        entry: dict[str, Any] = {"time": utcnow().isoformat(), "outcome": outcome, "version": version,
                                 "reason": reason}
        if draft is not None:
            m = draft.get("measurements")
            entry |= {"evidence": draft["evidence"], "median_ms": m.median_ms if m else None,
                      "study": draft.get("study"), "source_sha256": draft["source_sha256"],
                      "config": draft["config"]}
        try:
            _safeio.append_line(self.key_dir(key) / JOURNAL, json.dumps(entry) + "\n")
        except _safeio.UnsafeFile as exc:
            raise ArtifactError(f"cannot write the journal: {exc}") from None


# -- helpers -------------------------------------------------------------------------------------------

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


def _journal_entry_ok(entry: Any) -> bool:
    """A journal line as :meth:`ArtifactStore._log` writes it (anything else is skipped, not trusted)."""
    return (isinstance(entry, dict) and entry.get("outcome") in ("published", "rejected", "invalidated", "aborted")
            and isinstance(entry.get("time"), str) and isinstance(entry.get("reason"), str)
            and isinstance(entry.get("version"), (str, type(None))))


def _next_number(versions: list[str]) -> int:
    return max((int(v[1:]) for v in versions), default=0) + 1


def _write_file(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    _write_file(tmp, text)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


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

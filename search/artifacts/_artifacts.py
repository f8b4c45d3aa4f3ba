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

import os
import shutil
from typing import TYPE_CHECKING

from .. import _safeio
from .._rules import DEFAULT_MARGIN, content_sha256
from ._candidate import ArtifactKey, Candidate, Draft
from ._candidate import draft_manifest as _draft_manifest
from ._gate import gate, loses_to_baseline
from ._layout import (
    DEFAULT_ROOT,
    ENV_VAR,
    INVALIDATED,
    JOURNAL,
    LOCK,
    POINTER,
    Artifact,
    Fix,
    Leftover,
    Pointer,
    PublishOutcome,
    VerifyResult,
    default_root,
    fsync_dir,
    locked,
    next_number,
)
from ._manifest import (
    ArtifactError,
    GateRecord,
    Manifest,
)
from ._migration import StoreMigration
from ._repair import StoreRepair
from ._store import StoreBase

__all__ = ["DEFAULT_ROOT", "ENV_VAR", "INVALIDATED", "JOURNAL", "LOCK", "POINTER", "Artifact", "ArtifactKey",
           "ArtifactStore", "Candidate", "Fix", "Leftover", "Pointer", "PublishOutcome", "StoreBase", "VerifyResult",
           "default_root"]

if TYPE_CHECKING:
    pass


class ArtifactStore(StoreMigration, StoreRepair):
    """Versions of winning kernels under one root folder (see the module docstring): reading, verifying and
    migrating are its bases', publishing (behind the regression gate) its own."""

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
        with locked(folder / LOCK, self.lock_timeout, key):
            if not candidate.correctness.passed:
                return self._reject(key, draft, "failed verification: a variant that is not correct is "
                                    "never published")
            loses = loses_to_baseline(draft.evidence, draft.measurements, candidate.family.baseline_name, margin,
                                      modes=candidate.family.consumer_modes)
            if loses:
                return self._reject(key, draft, f"recorded, not dispatched: {loses}")
            current, invalid = self._current_for_gate(key)
            ok, reason = gate(draft, current, invalid, min_gain, candidate.family.consumer_modes)
            if not ok:
                return self._reject(key, draft, reason, current.version if current else None)
            version = f"v{next_number(self.versions(key) + self.misplaced(key) + self._recorded(key))}"
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
            fsync_dir(folder)
            self._write_pointer(key, Pointer(version))
            return PublishOutcome(True, version, reason, key.path, version)

    def _keep_family(self, candidate: Candidate, manifest: Manifest) -> str:
        """Keep the family the candidate was rendered from in the store and check the new version against
        it exactly as every load will; returns the snapshot's hash (recorded in the index)."""
        from ._recheck import recheck
        from ._snapshot import family_files, load_snapshot, write_snapshot

        files = family_files(candidate.family, candidate.kernel.target, candidate.config, candidate.dtype)
        sha = write_snapshot(self.root, files)
        recheck(manifest, candidate.kernel, load_snapshot(self.root, sha))
        return sha

"""``artifacts migrate`` and ``rejudge``: a store made before the index is indexed (versions it cannot vouch for
demoted or invalidated), manifests of older schemas rewritten, and current versions judged again by today's rules."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _safeio
from .._errors import KernsearchError
from .._rules import DEFAULT_MARGIN, content_sha256
from .._vocabulary import Evidence
from . import _head
from ._candidate import ArtifactKey
from ._gate import loses_to_baseline
from ._index import INDEX, IndexState
from ._layout import (
    INVALIDATED,
    LOCK,
    locked,
    pointer_text,
    read_kernel,
    write_atomic,
)
from ._manifest import (
    SCHEMA_VERSION,
    ArtifactError,
    Manifest,
    parse_manifest,
)
from ._store import StoreBase

if TYPE_CHECKING:
    from pathlib import Path

    from ..family._spec import Family



def _manifest_in(folder: Path) -> tuple[str, Manifest]:
    """A version folder's manifest text, read bounded, and its parse (an unsafe file is the store's error)."""
    try:
        text = _safeio.read_text(folder / "manifest.json", _safeio.SOURCE_LIMIT)
    except _safeio.UnsafeFile as exc:
        raise ArtifactError(str(exc)) from None
    return text, parse_manifest(text, str(folder))

class StoreMigration(StoreBase):
    """Migrating and rejudging a store (module docstring)."""

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
                with locked(self.key_dir(key) / LOCK, self.lock_timeout, key):
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
            done.append(f"{key}: current {pointer_text(written)} recorded")
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
        text, manifest = _manifest_in(folder)
        kernel = read_kernel(folder, manifest)
        text = _as_modeled(manifest)
        write_atomic(folder / "manifest.json", text)
        return {"op": "version", "key": key.path, "version": version,
                "content": content_sha256(text, kernel.header, kernel.source), "family": family_sha}

    def _index_version(self, key: ArtifactKey, version: str, families: list[Family],
                       demote: bool = False) -> tuple[dict[str, Any], str]:
        """The index event of a version not yet indexed (schema migrated first), after its full check."""
        from ._recheck import recheck
        from ._snapshot import family_files, load_snapshot, write_snapshot

        folder = self.key_dir(key) / version
        text, manifest = _manifest_in(folder)
        if manifest.key != key.path or manifest.version != version:
            raise ArtifactError(f"manifest describes {manifest.key}/{manifest.version}, not this folder")
        kernel = read_kernel(folder, manifest)
        fam = self._family_of(manifest, families)
        files = family_files(fam, manifest.kernel.target, {**fam.default, **manifest.config}, manifest.problem.dtype)
        sha = write_snapshot(self.root, files)
        recheck(manifest, kernel, load_snapshot(self.root, sha))
        note = ""
        if demote:
            text = _as_modeled(manifest)
            write_atomic(folder / "manifest.json", text)
            note = " (not vouched for by the store key: re-judged modeled)"
        elif json.loads(text).get("schema_version") != SCHEMA_VERSION:
            text = manifest.to_json()
            write_atomic(folder / "manifest.json", text)
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

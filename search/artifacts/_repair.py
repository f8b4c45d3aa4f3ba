"""``artifacts verify`` and ``--repair``: what a store's files say against its index, and what a killed writer
left behind (a torn journal line, a pointer that lags, a version never moved in place), put right."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _safeio
from ._candidate import ArtifactKey
from ._index import INDEX, IndexState
from ._layout import (
    JOURNAL,
    LOCK,
    POINTER,
    Fix,
    Leftover,
    Pointer,
    VerifyResult,
    locked,
    pointer_text,
)
from ._manifest import (
    ArtifactError,
)
from ._store import StoreBase

if TYPE_CHECKING:
    pass


class StoreRepair(StoreBase):
    """Verifying a store and repairing what a killed writer left (module docstring)."""

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
        if state is not None and pointer_text(written) != pointer_text(pointer) \
                and not self._pointer_lags(key, state):
            return [VerifyResult(where, False, f"{self.key_dir(key) / POINTER} says {pointer_text(written)}, the "
                                 f"store index says {pointer_text(pointer)} (edited, or a writer was killed before "
                                 "CURRENT followed; the index decides; `verify --repair` rewrites CURRENT from it)")]
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
        with locked(folder / LOCK, self.lock_timeout, key):
            for left in self.crash_leftovers(key):
                self._repair_one(key, left)
                done.append(left.fix)
            if self.index_state() is not None:  # the index decides; CURRENT only mirrors it
                try:
                    written = pointer_text(self.pointer_file(key))
                except ArtifactError:
                    written = "unreadable"
                if written != pointer_text(self.pointer(key)):
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

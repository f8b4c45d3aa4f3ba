"""Rollback and truncation of a keyed store's index: the signed head record and this machine's last-seen head.

A hash chain shows that no line was edited, but not that none was dropped at the end: deleting the last line
of ``index.jsonl`` (an invalidation, a newer version) leaves a valid, shorter chain. So a keyed store keeps,
beside its index, ``index.head``: the chain's length and last hash, sealed with ``KERNSEARCH_STORE_KEY``.
A writer without the key cannot make a head record for a shorter chain; it can only put back an *older*
record (with the index as it was then). Against that, every machine that reads or writes a keyed store keeps
the longest head it saw for it under ``$KERNSEARCH_HOME/heads/`` (one small file per store folder), and a
chain shorter than, or diverging from, that record is refused too, naming both heads.

Limits (documented in docs/artifacts.md): a machine that never saw the store cannot tell an older copy from
the newest one; a store that is not keyed has neither record (a writer can rewrite its whole chain anyway).
A store first seen here with another first line is another store (re-created at the same path).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import _safeio
from ._manifest import ArtifactError

HEAD = "index.head"
_FIELDS = {"entries", "head", "key_id", "mac"}


@dataclass(frozen=True)
class Head:
    """A chain's length and its last line's hash."""

    entries: int
    head: str

    def describe(self) -> str:
        return f"{self.entries} entries, head {self.head[:12]}"


def _mac(secret: bytes, entries: int, head: str) -> str:
    return hmac.new(secret, f"kernsearch index head\n{entries}\n{head}".encode("ascii"), hashlib.sha256).hexdigest()


def write_head(root: Path, head: Head, secret: bytes, key_id: str) -> None:
    """Replace the store's signed head record (called under the index lock, after every append)."""
    body = {"entries": head.entries, "head": head.head, "key_id": key_id, "mac": _mac(secret, head.entries, head.head)}
    try:
        _safeio.write_atomic(root / HEAD, json.dumps(body, sort_keys=True) + "\n")
    except _safeio.UnsafeFile as exc:
        raise ArtifactError(f"cannot write the store's head record: {exc}") from None


def read_head(root: Path, secret: bytes, key_id: str) -> Head | None:
    """The store's head record, its seal checked (None if there is none)."""
    path = root / HEAD
    if not os.path.lexists(path):
        return None
    try:
        data = _safeio.read_json(path, _safeio.SPEC_LIMIT)
    except _safeio.UnsafeFile as exc:
        raise ArtifactError(f"store head record unreadable: {exc}") from None
    if not isinstance(data, dict) or set(data) != _FIELDS or isinstance(data["entries"], bool) \
            or not isinstance(data["entries"], int) \
            or not all(isinstance(data[k], str) for k in ("head", "key_id", "mac")):
        raise ArtifactError(f"{path}: not a store head record (corrupted or tampered)")
    if data["key_id"] != key_id:
        raise ArtifactError(f"{path}: sealed with another KERNSEARCH_STORE_KEY than the one set here")
    if not hmac.compare_digest(_mac(secret, data["entries"], data["head"]), data["mac"]):
        raise ArtifactError(f"{path}: its seal does not match (the head record was edited)")
    return Head(data["entries"], data["head"])


def _covers(hashes: Sequence[str], seen: Head) -> bool:
    """Whether a chain (its lines' hashes) is ``seen`` or a continuation of it."""
    return seen.entries == 0 or (seen.entries <= len(hashes) and hashes[seen.entries - 1] == seen.head)


def _describe(hashes: Sequence[str]) -> str:
    return Head(len(hashes), hashes[-1] if hashes else "0" * 64).describe()


def check_signed(root: Path, hashes: Sequence[str], secret: bytes, key_id: str) -> None:
    """Refuse a keyed chain shorter than, or diverging from, its signed head record (or without one)."""
    signed = read_head(root, secret, key_id)
    if signed is None:
        raise ArtifactError(f"{root / HEAD}: missing: a keyed store's signed head record (deleted to hide a "
                            "truncated index, or a store keyed before kernsearch signed its head: then run "
                            "`kernsearch artifacts migrate` once)")
    if not _covers(hashes, signed):
        raise ArtifactError(f"{root}/index.jsonl ({_describe(hashes)}) is shorter than or diverges from its signed "
                            f"head record ({signed.describe()}): truncated or rolled back; restore the index")


# -- this machine's record ------------------------------------------------------------------------------------

def _home() -> Path:
    return Path(os.environ.get("KERNSEARCH_HOME") or Path.home() / ".kernsearch")


def _record_path(root: Path) -> Path:
    where = os.path.realpath(root)
    return _home() / "heads" / (hashlib.sha256(where.encode("utf-8", "surrogateescape")).hexdigest()[:32] + ".json")


@dataclass(frozen=True)
class Seen:
    """The longest chain this machine saw for a store folder, and its first line (which store it was)."""

    first: str
    head: Head


def last_seen(root: Path) -> Seen | None:
    """This machine's record for the store folder (None if none, or unreadable: it only ever refuses more)."""
    try:
        data = _safeio.read_json(_record_path(root), _safeio.SPEC_LIMIT)
        return Seen(str(data["first"]), Head(int(data["entries"]), str(data["head"])))
    except (_safeio.UnsafeFile, KeyError, TypeError, ValueError):
        return None


def check_seen(root: Path, hashes: Sequence[str]) -> None:
    """Refuse a chain shorter than, or diverging from, the longest one this machine saw for the same store."""
    seen = last_seen(root)
    if seen is None or not hashes or hashes[0] != seen.first:
        return
    if not _covers(hashes, seen.head):
        raise ArtifactError(f"{root}/index.jsonl ({_describe(hashes)}) is shorter than or diverges from the chain "
                            f"this machine last saw ({seen.head.describe()}, recorded in {_record_path(root)}): "
                            "truncated or rolled back; restore the index")


def remember(root: Path, hashes: Sequence[str]) -> None:
    """Record the chain as the longest seen here (best effort: an unwritable home only loses the record)."""
    if not hashes:
        return
    seen = last_seen(root)
    if seen is not None and seen.first == hashes[0] and seen.head.entries >= len(hashes):
        return
    path = _record_path(root)
    body = {"store": os.path.realpath(root), "first": hashes[0], "entries": len(hashes), "head": hashes[-1]}
    with contextlib.suppress(OSError, _safeio.UnsafeFile):
        path.parent.mkdir(parents=True, exist_ok=True)
        _safeio.write_atomic(path, json.dumps(body, sort_keys=True) + "\n")


def has_record(root: Path) -> bool:
    """Whether this store was ever keyed (it has a head record, or this machine saw it keyed)."""
    return os.path.lexists(root / HEAD) or last_seen(root) is not None

"""The store's index: an append-only, hash-chained record of every version published and of every move of a
key's current version.

``index.jsonl`` at the store's root holds one JSON line per event:

- ``version``: a version was published (or indexed by ``artifacts migrate``) with this **content hash** (the
  manifest's exact text and both kernel files: every field a decision rests on) and this **family snapshot**
  (the spec and templates it was rendered from, kept in the store: :mod:`kernsearch.artifacts._snapshot`);
- ``current``: the key's current version is now this one (``invalidated``: why it may no longer be dispatched);
- ``abort``: a publisher was killed after recording a version and before moving it in place.

Each line carries ``prev`` (the previous line's ``hash``) and its own ``hash``: SHA-256 of ``prev`` and the
line's canonical JSON, so an edited, removed or reordered line breaks the chain from there on. With
``KERNSEARCH_STORE_KEY`` set, the hashes are HMAC-SHA256 under that secret: a writer without the key cannot
add a line a holder of the key accepts (a farm's exporter holds it; workers that only write the store's files
do not). A keyed index is refused without the key, and an unkeyed line is refused with it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _safeio
from . import _head, _lockfile
from ._manifest import ArtifactError, utcnow

INDEX = "index.jsonl"
INDEX_LOCK = ".index.lock"
KEY_VAR = "KERNSEARCH_STORE_KEY"
GENESIS = "0" * 64
OPS = ("version", "current", "abort")
_HEX = re.compile(r"[0-9a-f]{64}")
_VERSION = re.compile(r"v[1-9][0-9]{0,8}")
_KEY = re.compile(r"[A-Za-z0-9._-]{1,100}(/[A-Za-z0-9._-]{1,100}){3}")
_FIELDS = {"seq", "op", "key", "version", "content", "family", "invalidated", "time", "prev", "mac", "key_id",
           "hash"}


def store_key() -> bytes | None:
    """The secret of ``KERNSEARCH_STORE_KEY`` (None when unset; set but empty is an error, never "no key")."""
    value = os.environ.get(KEY_VAR)
    if value is None:
        return None
    if not value.strip():
        raise ArtifactError(f"{KEY_VAR} is set but empty: give the store's secret or unset it")
    return value.encode("utf-8")


def key_id(secret: bytes) -> str:
    """A short public name of a secret (which key sealed a line), from which the secret cannot be found."""
    return hmac.new(secret, b"kernsearch store key id", hashlib.sha256).hexdigest()[:16]


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _seal(body: dict[str, Any], secret: bytes | None) -> str:
    data = body["prev"].encode("ascii") + b"\n" + _canonical(body)
    if secret is None:
        return hashlib.sha256(data).hexdigest()
    return hmac.new(secret, data, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class VersionRecord:
    """What the index recorded for one version: its content hash and its family snapshot."""

    content: str
    family: str
    seq: int


@dataclass(frozen=True)
class CurrentRecord:
    """A key's current version as the index records it."""

    version: str
    invalidated: str | None
    time: str
    seq: int


@dataclass
class IndexState:
    """The index replayed: recorded versions, each key's current version, the chain's head."""

    versions: dict[tuple[str, str], VersionRecord] = field(default_factory=dict)
    history: dict[str, list[CurrentRecord]] = field(default_factory=dict)
    aborted: set[tuple[str, str]] = field(default_factory=set)
    entries: int = 0
    head: str = GENESIS
    keyed: bool = False
    #: The file ends with a line a killed appender left unfinished (ignored; ``verify --repair`` drops it).
    torn: bool = False
    #: Every line's hash, in order (the head records of :mod:`kernsearch.artifacts._head` are checked against it).
    hashes: list[str] = field(default_factory=list)
    #: ``(key, version)`` named by a line sealed without the store key (only ``migrate`` reads such an index).
    unsealed: set[tuple[str, str]] = field(default_factory=set)

    def current(self, key: str) -> CurrentRecord | None:
        history = self.history.get(key)
        return history[-1] if history else None

    def apply(self, entry: dict[str, Any], where: str) -> None:
        key, version, op = entry["key"], entry["version"], entry["op"]
        if op == "version":
            if not (isinstance(entry["content"], str) and _HEX.fullmatch(entry["content"])
                    and isinstance(entry["family"], str) and _HEX.fullmatch(entry["family"])):
                raise ArtifactError(f"{where}: a version entry without a content hash and a family snapshot")
            self.versions[(key, version)] = VersionRecord(entry["content"], entry["family"], entry["seq"])
            self.aborted.discard((key, version))
        elif op == "current":
            if (key, version) not in self.versions:
                raise ArtifactError(f"{where}: makes {key}/{version} current, which the index never recorded")
            self.history.setdefault(key, []).append(
                CurrentRecord(version, entry["invalidated"], entry["time"], entry["seq"]))
        else:  # abort: the version never moved in place; the key's current goes back to what it was
            self.versions.pop((key, version), None)
            self.aborted.add((key, version))
            self.history[key] = [c for c in self.history.get(key, []) if c.version != version]


def _required_types_ok(entry: dict[str, Any]) -> bool:
    """The fields every entry has are strings, and ``seq`` a true int (a bool is not a sequence number)."""
    strings = ("op", "key", "time", "prev", "mac", "hash")
    return all(isinstance(entry[k], str) for k in strings) and not isinstance(entry["seq"], bool) \
        and isinstance(entry["seq"], int)


def _names_known(entry: dict[str, Any]) -> bool:
    """The entry names a known event, a well-formed key and a well-formed version (``key`` is already a string)."""
    return entry["op"] in OPS and bool(_KEY.fullmatch(entry["key"])) and isinstance(entry["version"], str) \
        and bool(_VERSION.fullmatch(entry["version"]))


def _check_line(entry: Any, where: str) -> dict[str, Any]:
    """One parsed line, every field of the expected type (anything else: the index is corrupted)."""
    if not isinstance(entry, dict) or set(entry) != _FIELDS:
        raise ArtifactError(f"{where}: not an index entry (fields {sorted(entry)[:12] if isinstance(entry, dict) else '?'})")
    if not _required_types_ok(entry):
        raise ArtifactError(f"{where}: an index entry field has the wrong type")
    if not _names_known(entry):
        raise ArtifactError(f"{where}: an index entry names no known event, key or version")
    for name in ("content", "family", "invalidated", "key_id"):
        if entry[name] is not None and not isinstance(entry[name], str):
            raise ArtifactError(f"{where}: index entry field {name} has the wrong type")
    if entry["mac"] not in ("sha256", "hmac-sha256") or len(entry["time"]) > 64 \
            or (entry["invalidated"] is not None and len(entry["invalidated"]) > 2000):
        raise ArtifactError(f"{where}: a malformed index entry")
    return entry


class StoreIndex:
    """``ROOT/index.jsonl``: read (every line checked, the chain verified), append (under a store-wide lock)."""

    def __init__(self, root: Path, lock_timeout: float = 60.0) -> None:
        self.root = Path(root)
        self.path = self.root / INDEX
        self.lock_timeout = lock_timeout
        self._cache: tuple[Any, IndexState] | None = None
        self._holding = False

    def exists(self) -> bool:
        return os.path.lexists(self.path)

    def state(self) -> IndexState | None:
        """The verified index (None where the store has none yet); raises :class:`ArtifactError` (one line)
        if any line is malformed, out of its chain, sealed with another key, or keyed without the key here."""
        secret = store_key()
        if not self.exists():
            return self._checked(None, secret)
        try:
            st = os.lstat(self.path)
            head = os.lstat(self.root / _head.HEAD) if os.path.lexists(self.root / _head.HEAD) else None
        except OSError as exc:
            raise ArtifactError(f"{self.path}: cannot read the store index ({exc.strerror})") from None
        signature = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, secret,
                     head and (head.st_ino, head.st_size, head.st_mtime_ns, head.st_ctime_ns))
        if self._cache is not None and self._cache[0] == signature:
            if secret is not None:  # another process may have seen a longer chain since
                _head.check_seen(self.root, self._cache[1].hashes)
            return self._cache[1]
        state = self._checked(self._read(secret), secret)
        assert state is not None
        self._cache = (signature, state)
        return state

    def _read(self, secret: bytes | None, allow_unkeyed: bool = False) -> IndexState:
        try:
            data = _safeio.read_bytes(self.path, _safeio.JOURNAL_LIMIT)
        except _safeio.UnsafeFile as exc:
            raise ArtifactError(f"store index unreadable: {exc}") from None
        state = IndexState()
        lines = data.split(b"\n")
        if lines[-1]:  # no newline at the end: an append cut short (nothing after it was ever written)
            state.torn = True
        for number, raw in enumerate(lines[:-1], start=1):
            where = f"{self.path}: line {number}"
            try:
                entry = _check_line(_safeio.loads_json(raw.decode("utf-8"), where), where)
            except (UnicodeDecodeError, _safeio.UnsafeFile):
                raise ArtifactError(f"{where}: not an index entry (corrupted or tampered)") from None
            self._verify_seal(entry, state, secret, where, allow_unkeyed)
            state.apply(entry, where)
            state.entries += 1
            state.head = entry["hash"]
            state.hashes.append(entry["hash"])
            if entry["mac"] != "hmac-sha256":
                state.unsealed.add((entry["key"], entry["version"]))
        return state

    def _check_heads(self, state: IndexState | None, secret: bytes | None, *, signed: bool = True,
                     remember: bool = True) -> None:
        """With the key: refuse a chain shorter than, or diverging from, the store's signed head record or the
        longest one this machine saw (rollback, truncation); then remember the chain as seen here."""
        if secret is None:
            return
        recorded = _head.has_record(self.root)
        if state is None or not state.keyed:
            if not recorded:
                return  # a store never keyed (``migrate`` seals it) or none yet
            if state is None:
                if not os.path.lexists(self.root / _head.HEAD) and not any(self.root.glob("*/*/*/*/v[0-9]*")):
                    return  # no version left either: a store made again at a path this machine saw keyed
                raise ArtifactError(f"{self.path}: missing from a keyed store (it has a head record, or this "
                                    "machine saw its chain): deleted; restore the index")
        hashes = state.hashes
        if signed or os.path.lexists(self.root / _head.HEAD):
            _head.check_signed(self.root, hashes, secret, key_id(secret))
        _head.check_seen(self.root, hashes)
        if remember and state.keyed and not state.unsealed:
            _head.remember(self.root, hashes)

    def _checked(self, state: IndexState | None, secret: bytes | None) -> IndexState | None:
        """``state`` after the head checks; a mismatch seen while a writer was between its append and its head
        record is looked at again under the index lock before it is refused."""
        try:
            self._check_heads(state, secret)
            return state
        except ArtifactError as exc:
            if self._holding:
                raise
            first = exc
        try:
            with self.locked():
                state = self._read(secret) if self.exists() else None
                self._check_heads(state, secret)
                return state
        except ArtifactError as exc:
            raise (first if "cannot lock" in str(exc) else exc) from None

    def survey(self) -> IndexState | None:
        """The index as written, lines sealed without the key accepted (``migrate`` judges what they name);
        a keyed chain shorter than its head record or than the one this machine saw is refused."""
        secret = store_key()
        state = self._read(secret, allow_unkeyed=True) if self.exists() else None
        self._check_heads(state, secret, signed=False, remember=False)
        return state

    def _verify_seal(self, entry: dict[str, Any], state: IndexState, secret: bytes | None, where: str,
                     allow_unkeyed: bool) -> None:
        if entry["seq"] != state.entries or entry["prev"] != state.head:
            raise ArtifactError(f"{where}: out of the index's chain (a line was removed, reordered or inserted)")
        body = {k: v for k, v in entry.items() if k != "hash"}
        if entry["mac"] == "hmac-sha256":
            if secret is None:
                raise ArtifactError(f"{self.path}: this store's index is keyed: set {KEY_VAR} to its secret to "
                                    "read or write it")
            if entry["key_id"] != key_id(secret):
                raise ArtifactError(f"{where}: sealed with another {KEY_VAR} than the one set here")
            state.keyed = True
        elif secret is not None and not allow_unkeyed:
            raise ArtifactError(f"{where}: not sealed with {KEY_VAR} (written without the key: refused while the "
                                "key is set; `kernsearch artifacts migrate` seals only what it can vouch for)")
        if not hmac.compare_digest(_seal(body, secret if entry["mac"] == "hmac-sha256" else None), entry["hash"]):
            raise ArtifactError(f"{where}: its hash does not match its content (the index was edited)")

    # -- writing --------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Any:
        """The index's own lock (held briefly by every append; a publisher holds its key's lock first)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ArtifactError(f"cannot lock the store index in {self.root}: {exc.strerror or exc}") from None
        try:
            with _lockfile.exclusive(self.root / INDEX_LOCK, self.lock_timeout):
                self._holding = True
                try:
                    yield
                finally:
                    self._holding = False
        except _safeio.UnsafeFile as exc:
            raise ArtifactError(f"cannot lock the store index: {exc}") from None
        except _lockfile.LockTimeout:
            raise ArtifactError(f"the store index is busy: another process holds {self.root / INDEX_LOCK} "
                                f"(waited {self.lock_timeout:g} s)") from None

    def check_appendable(self) -> None:
        """Refuse (one line) before any work what :meth:`append` would refuse: a keyed index without the key,
        an unkeyed one with it, a torn or corrupted index."""
        state = self.state()
        if state is not None and state.torn:
            raise ArtifactError(f"{self.path} ends with a torn line (an append was cut short): run "
                                "`kernsearch artifacts verify --repair`")

    def append(self, events: list[dict[str, Any]]) -> None:
        """Append events (``op``, ``key``, ``version`` and the op's fields), sealed and chained, in one write."""
        secret = store_key()
        with self.locked():
            self._cache = None
            state = self.state() or IndexState()
            if state.torn:
                raise ArtifactError(f"{self.path} ends with a torn line (an append was cut short): run "
                                    "`kernsearch artifacts verify --repair`")
            lines, head, seq = [], state.head, state.entries
            for event in events:
                body = {"seq": seq, "op": event["op"], "key": event["key"], "version": event["version"],
                        "content": event.get("content"), "family": event.get("family"),
                        "invalidated": event.get("invalidated"), "time": utcnow().isoformat(), "prev": head,
                        "mac": "hmac-sha256" if secret else "sha256", "key_id": key_id(secret) if secret else None}
                body["hash"] = head = _seal(body, secret)
                state.apply(_check_line(body, "new index entry"), "new index entry")  # never write a bad line
                lines.append(json.dumps(body, sort_keys=True) + "\n")
                seq += 1
            try:
                _safeio.append_line(self.path, "".join(lines))
            except _safeio.UnsafeFile as exc:
                raise ArtifactError(f"cannot write the store index: {exc}") from None
            self._cache = None
            if secret is not None:
                self._sign(state.hashes + [json.loads(line)["hash"] for line in lines], secret)

    def _sign(self, hashes: list[str], secret: bytes) -> None:
        """Write the signed head record of a keyed chain, and remember it as seen here."""
        _head.write_head(self.root, _head.Head(len(hashes), hashes[-1] if hashes else GENESIS), secret,
                         key_id(secret))
        _head.remember(self.root, hashes)

    def drop_torn_tail(self) -> bool:
        """Remove an unfinished last line (``verify --repair``); True if there was one."""
        with self.locked():
            self._cache = None
            try:
                data = _safeio.read_bytes(self.path, _safeio.JOURNAL_LIMIT)
            except _safeio.UnsafeFile as exc:
                raise ArtifactError(f"store index unreadable: {exc}") from None
            if not data or data.endswith(b"\n"):
                return False
            _write(self.path, data[:data.rfind(b"\n") + 1])
            return True

    def reseal(self) -> int:
        """Seal every line of an index written without the key with ``KERNSEARCH_STORE_KEY`` (after checking
        its chain as it was written); returns how many lines were resealed. ``artifacts migrate`` calls this."""
        secret = store_key()
        if secret is None:
            return 0
        with self.locked():
            self._cache = None
            if not self.exists():
                return 0
            old = self._read(secret, allow_unkeyed=True)
            if old.torn:
                raise ArtifactError(f"{self.path} ends with a torn line: run `kernsearch artifacts verify --repair`")
            data = _safeio.read_bytes(self.path, _safeio.JOURNAL_LIMIT)
            entries = [json.loads(raw) for raw in data.splitlines() if raw]
            if all(e["mac"] == "hmac-sha256" for e in entries):
                if not os.path.lexists(self.root / _head.HEAD):
                    self._sign(old.hashes, secret)  # a store keyed before kernsearch signed its head
                return 0
            head, out, hashes = GENESIS, [], []
            for entry in entries:
                body = {**{k: v for k, v in entry.items() if k != "hash"}, "prev": head, "mac": "hmac-sha256",
                        "key_id": key_id(secret)}
                body["hash"] = head = _seal(body, secret)
                hashes.append(head)
                out.append(json.dumps(body, sort_keys=True) + "\n")
            _write(self.path, "".join(out).encode("ascii"))
            self._sign(hashes, secret)
            return len(out)


def _write(path: Path, data: bytes) -> None:
    try:
        _safeio.write_atomic(path, data)
    except _safeio.UnsafeFile as exc:
        raise ArtifactError(f"cannot write the store index: {exc}") from None

"""Where studies live: the data folder, the Optuna storage (SQLite in WAL mode by default) and the
predictable name of a problem's study."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

from . import _safeio
from ._errors import KernsearchError


def data_home() -> Path:
    return Path(os.environ.get("KERNSEARCH_HOME") or Path.home() / ".kernsearch")


def default_storage() -> str:
    home = data_home()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'studies.db'}"


def make_storage(url: str | None) -> Any:
    """Optuna storage for a URL (SQLite waits on locks instead of failing; ``:memory:`` = in memory)."""
    import optuna

    url = url or default_storage()
    if url == ":memory:":
        return optuna.storages.InMemoryStorage()
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    if url.startswith("sqlite"):
        _sqlite_wal()
    for attempt in range(3):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except Exception as exc:  # noqa: BLE001 - bad URL, missing driver, unreachable server
            # Processes creating one new SQLite file at once can collide on its tables: try again.
            if attempt < 2 and type(exc).__module__.split(".")[0] == "sqlalchemy" and url.startswith("sqlite"):
                time.sleep(0.5 + random.random())
                continue
            raise KernsearchError(f"cannot open study storage {url!r}: {str(exc).splitlines()[0]}") from None
    raise AssertionError("unreachable")


def check_storage(url: str | None) -> Any:
    """:func:`make_storage`, after checking a SQLite file is an intact database (one line if not).

    A corrupted page would otherwise surface mid-search as Optuna's ``StorageInternalError``.
    """
    import sqlite3

    url = url or default_storage()
    if url.startswith("sqlite:"):
        path = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None
        if path is None or not url.removeprefix("sqlite:///").strip() or url.removeprefix("sqlite:///") == ":memory:":
            raise KernsearchError(f"study storage {url!r}: expected sqlite:///PATH to a database file")
        if os.path.lexists(path) and not _safeio.is_regular(path):
            raise KernsearchError(f"study storage {url!r}: {path} is not a regular file (a link, folder, FIFO "
                                  "or device: refused)")
        if path.exists():
            try:
                conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60)
                try:
                    rows = conn.execute("PRAGMA quick_check").fetchall()
                finally:
                    conn.close()
            except sqlite3.Error as exc:
                raise KernsearchError(f"cannot open study storage {url!r}: {exc}") from None
            if rows != [("ok",)]:
                detail = "; ".join(str(r[0]) for r in rows[:2])
                raise KernsearchError(f"study storage {url!r} is corrupted (sqlite quick_check: {detail[:200]})")
    storage = make_storage(url)
    try:
        import optuna

        optuna.get_all_study_summaries(storage)
    except Exception as exc:  # noqa: BLE001 - a storage Optuna cannot read is bad input
        raise KernsearchError(f"cannot read study storage {url!r}: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}") from None
    return storage


_WAL = False


def _sqlite_wal() -> None:
    """SQLite in WAL mode with synchronous=NORMAL: a commit no longer waits for fsync (Optuna commits ~20
    times a trial), readers do not block the writer (several processes on one study), and a killed
    process still leaves a consistent database."""
    global _WAL
    if _WAL:
        return
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def pragmas(conn: Any, _record: Any) -> None:
        if isinstance(conn, sqlite3.Connection):
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

    event.listen(Engine, "connect", pragmas)
    _WAL = True


def study_name_for(key: dict[str, str]) -> str:
    """Predictable: ``gemm/M2 Max/float16/4096x4096x4096/model``."""
    return "/".join(key[k] for k in ("family", "chip", "dtype", "shape", "backend"))

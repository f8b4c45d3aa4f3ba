"""Where studies live: the data folder, the Optuna storage (SQLite in WAL mode by default, PostgreSQL for a
farm of machines sharing one study), the heartbeat that fails a dead process's trial, and the predictable
name of a problem's study."""

from __future__ import annotations

import os
import re
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from .. import _safeio
from .._errors import KernsearchError

#: Seconds between the heartbeats of a trial being evaluated; a trial whose heartbeat is older than
#: GRACE_BEATS of them belongs to a dead process and is failed (then retried) by the next process that looks.
#: ``KERNSEARCH_HEARTBEAT_S`` overrides the interval (tests use 1).
HEARTBEAT_S = 10
GRACE_BEATS = 3

T = TypeVar("T")


def data_home() -> Path:
    return Path(os.environ.get("KERNSEARCH_HOME") or Path.home() / ".kernsearch")


def default_storage() -> str:
    home = data_home()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'studies.db'}"


def heartbeat_interval() -> int:
    text = os.environ.get("KERNSEARCH_HEARTBEAT_S", "")
    return int(text) if text.isdigit() and int(text) > 0 else HEARTBEAT_S


def redact(url: str) -> str:
    """The URL without its password, for messages and results."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


#: The libpq connection parameters a ``postgresql://`` URL may carry. Others (``passfile``, ``sslkey``,
#: ``sslcert``, ``sslrootcert``, ``sslcrl``, ``service``, ``servicefile``...) make libpq read a file the URL
#: names: a job file could point them anywhere. They are refused; the ``PG*`` environment variables
#: (``PGPASSFILE``, ``PGSSLROOTCERT``...) set them on the machine that runs.
PG_PARAMETERS = frozenset({"sslmode", "connect_timeout", "application_name", "target_session_attrs", "keepalives",
                           "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout",
                           "gssencmode", "channel_binding", "client_encoding", "require_auth", "sslnegotiation",
                           "load_balance_hosts", "host", "hostaddr", "port", "dbname", "user"})


def check_url(url: str) -> None:
    """Refuse (one line) a storage URL no storage should be opened with: control characters (a newline made a
    SQLite file named with a newline), and PostgreSQL parameters that make libpq read a file."""
    from urllib.parse import parse_qsl

    bad = next((ch for ch in url if ord(ch) < 0x20 or ord(ch) == 0x7F), None)
    if bad is not None:
        raise KernsearchError(f"study storage {redact(url)[:200]!r}: holds the control character {bad!r} (refused)")
    if url.split(":", 1)[0].lower().startswith("postgres"):  # postgresql://, postgres://, postgresql+psycopg://
        try:
            query = parse_qsl(urlsplit(url).query, keep_blank_values=True, strict_parsing=False)
        except ValueError as exc:
            raise KernsearchError(f"study storage {redact(url)[:200]!r}: {exc}") from None
        for name, _ in query:
            if name not in PG_PARAMETERS:
                raise KernsearchError(f"study storage {redact(url)[:200]!r}: the PostgreSQL parameter {name[:40]!r} "
                                      "is not allowed in a URL (file-reading parameters such as passfile, sslkey, "
                                      "sslrootcert are set with PG* environment variables)")


_PASSWORD_IN_URL = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@]*:)[^\s/@]+@")


#: Where the study storage's libraries keep the exceptions a bad storage raises (a corrupted or locked SQLite file,
#: an unreachable or refusing database): Optuna's storage error, SQLAlchemy's and the DB-API drivers' DatabaseError
#: (OperationalError and IntegrityError derive from it).
_STORAGE_EXCEPTIONS = (("optuna.exceptions", "StorageInternalError"), ("sqlalchemy.exc", "DatabaseError"),
                       ("sqlite3", "DatabaseError"), ("psycopg", "DatabaseError"))


def storage_errors() -> tuple[type[BaseException], ...]:
    """The storage exception classes of the libraries loaded in this process: bad input, not a kernsearch bug (a
    library not loaded cannot have raised, and is not imported to find out)."""
    import sys

    found = []
    for module, name in _STORAGE_EXCEPTIONS:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


def mask_passwords(text: str) -> str:
    """Any text (an error line, a banner) with the password of every URL in it replaced by ``***``."""
    return _PASSWORD_IN_URL.sub(r"\1***@", text)


def sqlalchemy_url(url: str) -> str:
    """``postgresql://`` means psycopg 3 (SQLAlchemy's default driver would be psycopg2, not installed)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url.removeprefix(prefix)
    return url


class StaleTrials:
    """Optuna's callback for a trial failed because its heartbeat stopped: remembers its config, so the
    process that failed it (exactly one does) asks for the config again."""

    def __init__(self) -> None:
        self.configs: list[dict[str, Any]] = []

    def __call__(self, study: Any, trial: Any) -> None:
        if trial.params:
            self.configs.append(dict(trial.params))


def make_storage(url: str | None) -> Any:
    """Optuna storage for a URL, with heartbeats (SQLite waits on locks instead of failing; ``:memory:`` =
    in memory; ``postgresql://user:pw@host/db`` = a study shared by several machines)."""
    import optuna

    url = url or default_storage()
    check_url(url)
    if url == ":memory:":
        return optuna.storages.InMemoryStorage()
    kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    if url.startswith("sqlite"):
        _sqlite_wal()
    elif url.startswith(("postgresql", "postgres:")):
        # A farm's connections cross networks and outlive server restarts: check each before use.
        kwargs = {"pool_pre_ping": True, "connect_args": {"connect_timeout": 20}}
    beat = heartbeat_interval()
    key, file = (url, beat, os.getpid()), _sqlite_file(url)
    kept = OPENED.get(key, file)
    if kept is not None:
        return kept

    def build() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(sqlalchemy_url(url), engine_kwargs=kwargs, heartbeat_interval=beat,
                                              grace_period=GRACE_BEATS * beat,
                                              heartbeat_stale_trial_callback=StaleTrials())

    try:
        storage = retry_collisions(build) if url.startswith(("sqlite", "postgres")) else build()
    except Exception as exc:  # noqa: BLE001 - bad URL, missing driver, unreachable server
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, ImportError):
            detail = missing_module(exc)
        shown = detail.replace(url, redact(url))[:300]
        raise KernsearchError(f"cannot open study storage {redact(url)!r}: {shown}") from None
    OPENED.keep(key, file, storage)
    return storage


def _sqlite_file(url: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URL (None for any other URL, or one with options)."""
    path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else ""
    return Path(path) if path.strip() and path != ":memory:" and "?" not in path else None


def _identity(file: Path | None) -> tuple[int, int] | None:
    """Which file ``file`` is now (device and inode; None where there is none)."""
    try:
        st = os.stat(file) if file is not None else None
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if st is not None else None


class OpenedStorages:
    """The SQLite storages opened during one command (:meth:`scope`: the CLI's), by URL and heartbeat, each while its
    file is still the same file: a command opens its study's storage several times (`tune`: checked, created, loaded,
    ranked... 8 times), each ~0.05 s of CPU (SQLAlchemy's engine, Optuna's schema check through Alembic). A file
    removed or replaced since is opened anew (an open connection keeps its file's inode, so a new file never has that
    identity); the last :data:`KEEP` are kept, and none after the command (their connections close as before)."""

    KEEP = 4

    def __init__(self) -> None:
        self._kept: OrderedDict[tuple[Any, ...], tuple[tuple[int, int], Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._scopes = 0

    @contextmanager
    def scope(self) -> Iterator[None]:
        """Storages are kept while this runs (nested: until the outermost ends), then let go."""
        with self._lock:
            self._scopes += 1
        try:
            yield
        finally:
            with self._lock:
                self._scopes -= 1
                if not self._scopes:
                    self._kept.clear()

    def get(self, key: tuple[Any, ...], file: Path | None) -> Any:
        """The storage kept for ``key`` if its file is the one it opened; else None."""
        now = _identity(file)
        with self._lock:
            kept = self._kept.get(key) if self._scopes else None
            if kept is None or now is None or kept[0] != now:
                return None
            self._kept.move_to_end(key)
            return kept[1]

    def keep(self, key: tuple[Any, ...], file: Path | None, storage: Any) -> None:
        now = _identity(file)
        with self._lock:
            if now is None or not self._scopes:
                return
            self._kept[key] = (now, storage)
            self._kept.move_to_end(key)
            while len(self._kept) > self.KEEP:
                self._kept.popitem(last=False)


#: This process's opened SQLite storages (:class:`OpenedStorages`).
OPENED = OpenedStorages()


def missing_module(exc: ImportError) -> str:
    """What a failed import while opening a storage says: the PostgreSQL driver only when psycopg is what is
    missing (a GPU host without tenacity was told to install psycopg, eleventh session), else the module's name."""
    chain: list[BaseException] = [exc]  # optuna re-raises the driver's ImportError as its own, without the name
    while len(chain) < 8:
        cause = chain[-1].__cause__ or chain[-1].__context__
        if cause is None:
            break
        chain.append(cause)
    name = next((str(n).split(".")[0] for n in (getattr(e, "name", None) for e in chain) if n), "")
    if name == "psycopg":
        return "the PostgreSQL driver is missing (pip install 'psycopg[binary]')"
    shown = name if name.isidentifier() else "a module"
    return f"{shown} is missing (kernsearch's dependencies are not all installed: pip install kernsearch)"


def retry_collisions(call: Callable[[], T]) -> T:
    """``call()``, tried twice more (0.5-1.5 s apart) while it raises a SQLAlchemy error: processes creating one
    new SQLite file (or one new PostgreSQL schema) at once can collide on its tables. Other errors pass at once."""
    import tenacity

    retrying = tenacity.Retrying(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_random(0.5, 1.5),
                                 retry=tenacity.retry_if_exception(_from_sqlalchemy), reraise=True)
    return retrying(call)


def _from_sqlalchemy(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] == "sqlalchemy"


class Heartbeat:
    """The pulse of the trial this process is evaluating (Optuna's heartbeat thread, from just after ask to
    tell), and the check that fails other processes' trials whose pulse stopped.

    ``fail_stale()`` returns the configs of trials it failed, to be asked for again: a worker killed
    mid-trial costs the study that trial, not its config.
    """

    def __init__(self, study: Any) -> None:
        self.study = study
        self._threads: dict[int, Any] = {}  # trial id -> its pulse (several while a pipelined search runs ahead)

    def fail_stale(self) -> list[dict[str, Any]]:
        import optuna

        storage = self.study._storage
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
        stale = getattr(storage, "get_heartbeat_stale_trial_callback", None)
        callback = stale() if stale is not None else None
        if not isinstance(callback, StaleTrials):
            return []
        configs, callback.configs = callback.configs, []
        return configs

    def start(self, trial: Any) -> None:
        from optuna.storages._heartbeat import get_heartbeat_thread

        self.finish(trial)
        thread = self._threads[trial._trial_id] = get_heartbeat_thread(trial._trial_id, self.study._storage)
        thread.start()

    def finish(self, trial: Any) -> None:
        """``trial`` was told: its pulse stops."""
        thread = self._threads.pop(trial._trial_id, None)
        if thread is not None:
            thread.join()

    def stop(self) -> None:
        for thread in self._threads.values():
            thread.join()
        self._threads.clear()


def check_storage(url: str | None) -> Any:
    """:func:`make_storage`, after checking a SQLite file is an intact database (one line if not).

    A corrupted page would otherwise surface mid-search as Optuna's ``StorageInternalError``.
    """
    import sqlite3

    url = url or default_storage()
    check_url(url)
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
        why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise KernsearchError(f"cannot read study storage {redact(url)!r}: {why}") from None
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


@dataclass(frozen=True)
class StudyKey:
    """What identifies a problem's study (stored as its attributes, and naming it): family, chip, dtype, shape (as
    text, ``4096x4096x4096``) and back-end."""

    family: str
    chip: str
    dtype: str
    shape: str
    backend: str

    def as_dict(self) -> dict[str, str]:
        """As the study stores it, one user attribute per field."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def of(cls, key: StudyKey | Mapping[str, str]) -> StudyKey:
        """An objective's key (an :class:`Objective` of your own may give a mapping with these five fields)."""
        if isinstance(key, StudyKey):
            return key
        try:
            return cls(*(str(key[f.name]) for f in fields(cls)))
        except KeyError as exc:
            raise KernsearchError(f"a study key needs family, chip, dtype, shape and backend (no {exc})") from None

    @property
    def name(self) -> str:
        """The study's default name, predictable: ``gemm/M2 Max/float16/4096x4096x4096/model``."""
        return "/".join(self.as_dict().values())


def study_name_for(key: StudyKey | Mapping[str, str]) -> str:
    """Predictable: ``gemm/M2 Max/float16/4096x4096x4096/model``."""
    return StudyKey.of(key).name

"""The study storage's retry: only SQLAlchemy errors (two processes creating one database at once) are retried."""

from __future__ import annotations

import time

import pytest
import sqlalchemy.exc

from kernsearch.studies._storage import retry_collisions


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    return slept


def _failing(errors: list[BaseException], value: str = "ok"):  # noqa: ANN202
    calls: list[int] = []

    def call() -> str:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return value
    return call, calls


def test_a_collision_is_tried_again_after_a_random_pause(no_sleep: list[float]) -> None:
    call, calls = _failing([sqlalchemy.exc.OperationalError("CREATE TABLE", {}, Exception("table exists"))])
    assert retry_collisions(call) == "ok" and len(calls) == 2
    assert len(no_sleep) == 1 and 0.5 <= no_sleep[0] <= 1.5


def test_three_collisions_raise_the_last_error(no_sleep: list[float]) -> None:
    errors = [sqlalchemy.exc.IntegrityError("INSERT", {}, Exception(str(i))) for i in range(4)]
    call, calls = _failing(errors)
    with pytest.raises(sqlalchemy.exc.IntegrityError, match="2"):
        retry_collisions(call)
    assert len(calls) == 3 and len(no_sleep) == 2


def test_other_errors_are_not_retried(no_sleep: list[float]) -> None:
    call, calls = _failing([ValueError("bad url")])
    with pytest.raises(ValueError, match="bad url"):
        retry_collisions(call)
    assert len(calls) == 1 and no_sleep == []


def test_every_url_in_a_line_has_its_password_masked() -> None:
    """Issue 24: a storage URL printed by any command (an error line names it, a driver's message may too) shows
    `***` for its password (docs/farm.md promises it); tests/test_docs.py checks the commands on a real PostgreSQL."""
    from kernsearch.studies._storage import mask_passwords

    line = ("cannot open study storage 'postgresql://kernsearch:s3cret@db.farm:5432/k' (connection to "
            "postgresql+psycopg://kernsearch:s3cret@db.farm/k refused); sqlite:///a:b@c and http://host/x@y stay")
    masked = mask_passwords(line)
    assert "s3cret" not in masked and masked.count("kernsearch:***@db.farm") == 2
    assert "sqlite:///a:b@c" in masked and "http://host/x@y" in masked


@pytest.mark.parametrize("error", [
    sqlalchemy.exc.OperationalError("SELECT", {}, Exception("database is locked")),
    __import__("sqlite3").DatabaseError("file is not a database"),
    __import__("optuna").exceptions.StorageInternalError("cannot read the trials"),
])
def test_a_storage_failure_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                   error: BaseException) -> None:
    """The study storage's libraries' errors (by class, not by name) are bad input: one line, exit 2."""
    from kernsearch import cli

    def broken(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(cli, "app", broken)
    with pytest.raises(SystemExit) as stop:
        cli.main(["studies"])
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"the study storage cannot be used ({type(error).__name__})" in lines[0]


def test_another_error_named_like_a_storage_one_stays_a_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    """A class merely named like a storage error is not one: a bug keeps its traceback."""
    from kernsearch import cli

    class OperationalError(Exception):
        pass

    def broken(*args: object, **kwargs: object) -> None:
        raise OperationalError("a bug")

    monkeypatch.setattr(cli, "app", broken)
    with pytest.raises(OperationalError):
        cli.main(["studies"])


@pytest.mark.parametrize(("module", "url", "said"), [
    ("tenacity", "sqlite:///{tmp}/s.db", "tenacity is missing"),
    ("psycopg", "postgresql://u:pw@127.0.0.1:9/k", "the PostgreSQL driver is missing"),
])
def test_a_missing_module_is_named_as_it_is(monkeypatch: pytest.MonkeyPatch, tmp_path: object, module: str, url: str,
                                           said: str) -> None:
    """A storage that cannot open because a module is missing says which one: a SQLite study on a host without
    tenacity was told that the PostgreSQL driver was missing (eleventh session, on the GPU host)."""
    import sys

    from kernsearch._errors import KernsearchError
    from kernsearch.studies._storage import make_storage

    monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError(name=module)
    if module == "psycopg":  # SQLAlchemy imports the driver by its dialect's name
        for name in [n for n in sys.modules if n.startswith("psycopg.")]:
            monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(KernsearchError) as err:
        make_storage(url.format(tmp=tmp_path))
    assert said in str(err.value) and (module == "psycopg") == ("PostgreSQL" in str(err.value))
    assert "pw" not in str(err.value)


def test_a_sqlite_storage_is_opened_once_a_command_while_its_file_stays_the_same(tmp_path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """During a command a SQLite storage is opened once (a `tune` asked for it 8 times, ~0.05 s of CPU each): the same
    storage while the file is the same file; a file replaced or removed since, another heartbeat, ``:memory:`` and
    another file are opened anew, and a new storage reads the file that is there now. Outside a command, and after
    it, each call opens its own."""
    import optuna

    from kernsearch.studies._storage import OPENED, OpenedStorages, make_storage

    url = f"sqlite:///{tmp_path / 's.db'}"
    outside = [make_storage(url), make_storage(url)]
    assert outside[0] is not outside[1]  # no command: nothing kept
    with OPENED.scope():
        first = make_storage(url)
        assert make_storage(url) is first
        optuna.create_study(study_name="kept", storage=first)
        assert make_storage(f"sqlite:///{tmp_path / 'other.db'}") is not first
        assert make_storage(":memory:") is not make_storage(":memory:")
        monkeypatch.setenv("KERNSEARCH_HEARTBEAT_S", "7")  # another heartbeat: another storage
        beat = make_storage(url)
        assert beat is not first
        monkeypatch.delenv("KERNSEARCH_HEARTBEAT_S")
        assert make_storage(url) is first
        fresh = make_storage(f"sqlite:///{tmp_path / 'fresh.db'}")
        optuna.create_study(study_name="new", storage=fresh)
        for opened in (*outside, first, beat, fresh):  # closed: SQLite writes its WAL back (a file moves without it)
            opened.engine.dispose()
        (tmp_path / "s.db").rename(tmp_path / "moved.db")
        (tmp_path / "fresh.db").replace(tmp_path / "s.db")  # another file where the study's was
        again = make_storage(url)
        assert again is not first and [s.study_name for s in optuna.get_all_study_summaries(again)] == ["new"]
        assert make_storage(url) is again
        again.engine.dispose()
        (tmp_path / "s.db").unlink()
        assert make_storage(url) is not again
        last = make_storage(url)
        for n in range(OpenedStorages.KEEP):  # only the last few are kept
            make_storage(f"sqlite:///{tmp_path / f'{n}.db'}")
        assert make_storage(url) is not last
    assert make_storage(url) is not make_storage(url)  # after the command: nothing kept

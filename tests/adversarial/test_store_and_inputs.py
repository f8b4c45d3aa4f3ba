"""Hostile stores, job files and numeric options: one line and exit 2 (or a bounded failure), never a hang."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
from pathlib import Path

import pytest

from kernsearch import ArtifactStore
from kernsearch.artifacts._manifest import ArtifactError
from kernsearch.studies._study import Objective, Record

from .conftest import CANARY, KEY, RANDOM, assert_one_line_error, candidate, key, ks, ks_here

READERS = [["artifacts", "list"], ["artifacts", "show", KEY], ["artifacts", "verify"], ["export", "gemm", "--out", "{out}"]]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    ArtifactStore(root).publish(candidate(median=1.0))
    return root


def _run_readers(root: Path, tmp_path: Path, allowed=(0, 1, 2), *, here: bool = False) -> None:  # noqa: ANN001
    """Every reader of the store on ``root``, through the same entry point in this process (``here``), else in a
    thread of this process given a minute: a reader that blocks (on a FIFO) fails the test instead of hanging it,
    where a process a reader took ~0.6 s of CPU each (issue 42)."""
    if here:
        _readers(root, tmp_path, allowed)
        return
    failed: list[BaseException] = []

    def readers() -> None:
        try:
            _readers(root, tmp_path, allowed)
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread below
            failed.append(exc)

    thread = threading.Thread(target=readers, daemon=True)  # a blocked reader cannot keep the worker from exiting
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "a reader of the store blocked"
    if failed:
        raise failed[0]


def _readers(root: Path, tmp_path: Path, allowed) -> None:  # noqa: ANN001
    for args in READERS:
        args = [a.format(out=tmp_path / "dist") for a in args]
        proc = ks_here(*args, "--store", str(root)) if args[0] != "export" else \
            ks_here(*args, env={"KERNSEARCH_ARTIFACTS": str(root)})
        assert proc.returncode in allowed, (args, proc.stderr)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        if proc.returncode == 2:
            assert len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["v1/manifest.json", "CURRENT", "v1/source.metal", "journal.jsonl"])
def test_fifo_in_the_store_never_blocks_a_reader(store: Path, tmp_path: Path, victim: str) -> None:
    path = store / KEY / victim
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(ArtifactError, match="FIFO|special"):
        s = ArtifactStore(store)  # CURRENT only mirrors the store index: read by verify, never by a load
        {"journal.jsonl": s.journal, "CURRENT": s.pointer_file}.get(victim, s.load)(key())
    _run_readers(store, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["v1/manifest.json", "CURRENT"])
def test_fifo_in_the_store_never_blocks_tunes_warm_start(store: Path, victim: str) -> None:
    """`tune` reads the store for warm-start configs before it searches: a FIFO there gives no warm start."""
    path = store / KEY / victim
    path.unlink()
    os.mkfifo(path)
    proc = ks("tune", "gemm", "--backend", "model", "--chip", "M2 Max", "--shape", "64,64,64", "--dtype", "float32",
              "--trials", "2", "--verify", "none", "--storage", ":memory:", *RANDOM,
              env={"KERNSEARCH_ARTIFACTS": str(store)}, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["v1/manifest.json", "CURRENT", "v1/source.metal"])
def test_directory_where_a_file_belongs(store: Path, tmp_path: Path, victim: str) -> None:
    path = store / KEY / victim
    path.unlink()
    path.mkdir()
    with pytest.raises(ArtifactError):
        s = ArtifactStore(store)
        s.pointer_file(key()) if victim == "CURRENT" else s.load(key())
    _run_readers(store, tmp_path, here=True)


@pytest.mark.slow
def test_version_as_a_file_and_non_utf8_pointer_and_journal(store: Path, tmp_path: Path) -> None:
    (store / KEY / "v7").write_text("not a folder")
    results = {r.where: r for r in ArtifactStore(store).verify()}
    assert not results[f"{KEY}/v7"].ok
    (store / KEY / "CURRENT").write_bytes(b"\xff\xfe{\"version\": \"v1\"}")
    with pytest.raises(ArtifactError, match="UTF-8"):
        ArtifactStore(store).pointer_file(key())
    assert not {r.where: r for r in ArtifactStore(store).verify()}[f"{KEY}/CURRENT"].ok
    (store / KEY / "journal.jsonl").write_bytes(b"\xff\xff\n[1,2]\n\"str\"\n{\"outcome\": 5}\n")
    assert ArtifactStore(store).journal(key()) == []
    _run_readers(store, tmp_path, here=True)


@pytest.mark.slow
def test_deep_json_manifest_is_one_line(store: Path, tmp_path: Path) -> None:
    (store / KEY / "v1" / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ArtifactError, match="nested deeper"):
        ArtifactStore(store).load(key())
    _run_readers(store, tmp_path, here=True)


def test_huge_manifest_is_refused_not_read(store: Path, tmp_path: Path) -> None:
    with open(store / KEY / "v1" / "manifest.json", "wb") as fh:
        fh.truncate(64 << 20)
    with pytest.raises(ArtifactError, match="larger than"):
        ArtifactStore(store).load(key())


def test_symlinked_files_are_refused_and_never_written_through(store: Path, tmp_path: Path) -> None:
    victim = CANARY / "journal.jsonl"  # a publish must never append to it through the link
    journal = store / KEY / "journal.jsonl"
    journal.unlink()
    journal.symlink_to(victim)
    with pytest.raises(ArtifactError):
        ArtifactStore(store).publish(candidate(median=0.5, config={"BM": 64}))
    assert victim.read_text() == ""
    manifest = store / KEY / "v1" / "manifest.json"
    real = tmp_path / "elsewhere.json"
    real.write_text(manifest.read_text())
    manifest.unlink()
    manifest.symlink_to(real)
    assert ArtifactStore(store).pointer(key()).version == "v1"  # the failed publish moved nothing
    with pytest.raises(ArtifactError, match="symbolic link"):
        ArtifactStore(store).load(key(), "v1")


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo"])
def test_the_lock_file_is_never_written_through(store: Path, tmp_path: Path, kind: str) -> None:
    # The lock is ours, not the filelock package's: filelock 3.32.7 and 4.0.0 truncate a hard-linked lock file.
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    lock = store / KEY / ".lock"
    lock.unlink(missing_ok=True)
    if kind == "symlink":
        lock.symlink_to(victim)
    elif kind == "hardlink":
        os.link(victim, lock)
    else:
        os.mkfifo(lock)
    if kind == "hardlink":  # a regular file: it locks, and nothing is written to it
        assert ArtifactStore(store, lock_timeout=1).publish(candidate(median=0.5, config={"BM": 64})).published
    else:
        with pytest.raises(ArtifactError, match="cannot lock the key: .*(symbolic link|FIFO)"):
            ArtifactStore(store, lock_timeout=1).publish(candidate(median=0.5, config={"BM": 64}))
        assert ArtifactStore(store).versions(key()) == ["v1"]
    assert victim.read_text() == "precious\n"


def test_symlinked_key_folder_is_not_a_key(store: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (store / "gemm" / "M2-Max" / "float32" / "64x64x64").rename(outside)
    (store / "gemm" / "M2-Max" / "float32" / "64x64x64").symlink_to(outside)
    assert ArtifactStore(store).keys() == []
    with pytest.raises(ArtifactError, match="not a plain folder"):
        ArtifactStore(store).publish(candidate(median=0.5))
    assert sorted(p.name for p in outside.iterdir()) == ["CURRENT", "journal.jsonl", "v1", ".lock"] or \
        "v2" not in [p.name for p in outside.iterdir()]


@pytest.mark.parametrize("linked", ["gemm", "gemm/M2-Max", "gemm/M2-Max/float32"])
def test_a_link_anywhere_on_the_key_path_gets_nothing_written_through_it(tmp_path: Path, linked: str) -> None:
    """A publish checks each folder of the key path before it creates the next one in it: not one empty
    folder appears behind a link, whichever level of the path it is."""
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "store"
    link = root / linked
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    with pytest.raises(ArtifactError, match="not a plain folder"):
        ArtifactStore(root).publish(candidate(median=0.5))
    assert list(outside.iterdir()) == []
    assert ArtifactStore(root).keys() == []


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_tune_publish_to_an_unusable_store_is_one_line_before_the_search(tmp_path: Path, kind: str) -> None:
    """The store is known before the search: a store no publish could write is refused first (not after
    minutes of search, below the banner and the progress lines)."""
    root = tmp_path / "store"
    root.write_text("not a folder\n") if kind == "file" else os.mkfifo(root)
    proc = ks("tune", "gemm", "--backend", "model", "--chip", "M2 Max", "--shape", "64,64,64", "--trials", "2",
              "--storage", ":memory:", "--publish", env={"KERNSEARCH_ARTIFACTS": str(root)}, timeout=120)
    assert_one_line_error(proc, "cannot publish", str(root))


@pytest.mark.slow
def test_tune_on_a_study_made_for_another_problem_is_one_line_before_the_search(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'studies.db'}"
    first = ks("tune", "gemm", "--backend", "model", "--chip", "M2 Max", "--shape", "64,64,64", "--trials", "1",
               "--verify", "none", "--storage", db, "--study", "x", *RANDOM, timeout=120)
    assert first.returncode == 0, first.stderr
    proc = ks("tune", "gemm", "--backend", "model", "--chip", "M2 Max", "--shape", "32,32,32", "--trials", "1",
              "--verify", "none", "--storage", db, "--study", "x", timeout=120)
    assert_one_line_error(proc, "made for another space or problem")


# -- numeric options: one place for the CLI and job files ----------------------------------------------------

NUMERIC_OPTIONS = [
    (["verify", "gemm", "--timeout", "nan"], "--timeout"),
    (["verify", "gemm", "--timeout", "inf"], "--timeout"),
    (["verify", "gemm", "--timeout", "1e309"], "--timeout"),
    (["verify", "gemm", "--timeout", "0"], "--timeout"),
    (["verify", "gemm", "--timeout", "-1"], "--timeout"),
    (["verify", "gemm", "--seed", "-1"], "--seed"),
    (["verify", "gemm", "--seed", str(2**32)], "--seed"),
    (["tune", "gemm", "--seed", "-1"], "--seed"),
    (["tune", "gemm", "--seed", str(2**32)], "--seed"),
    (["tune", "gemm", "--timeout", "nan"], "--timeout"),
    (["tune", "gemm", "--trials", "0"], "--trials"),
    (["tune", "gemm", "--finalists", str(2**70)], "--finalists"),
    (["show", "x", "--top", "-5"], "--top"),
    (["tune", "gemm", "--seed", "2**32"], "--seed"),
]


@pytest.mark.parametrize(("args", "flag"), NUMERIC_OPTIONS)
@pytest.mark.slow
def test_numeric_options_are_checked_before_anything_starts(args: list[str], flag: str) -> None:
    run = ks if (args, flag) == NUMERIC_OPTIONS[7] else ks_here  # a tune refused in a process of its own
    assert_one_line_error(run(*args, "--chip", "M2 Max") if args[0] != "show" else run(*args), flag)


JOB = """
[[jobs]]
family = "gemm"
chips = ["M2 Max"]
shapes = ["64,64,64"]
backend = "model"
{extra}
"""


@pytest.mark.parametrize("extra", ["timeout = inf", "timeout = nan", "timeout = -1", "seed = -1",
                                   f"seed = {2**32}", "trials = 0", "step_timeout = inf", "min_gain = nan"])
def test_job_file_numbers_are_checked_like_the_cli(tmp_path: Path, extra: str) -> None:
    from kernsearch.flows._jobs import JobFileError, load_jobs

    path = tmp_path / "jobs.toml"
    path.write_text(JOB.format(extra=extra))
    with pytest.raises(JobFileError):
        load_jobs(path)


def test_deep_toml_job_file_is_one_line(tmp_path: Path) -> None:
    from kernsearch.flows._jobs import JobFileError, load_jobs

    path = tmp_path / "jobs.toml"
    path.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(JobFileError, match="nested"):
        load_jobs(path)
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(JobFileError, match="FIFO"):
        load_jobs(fifo)


def _set_line(text: str, key: str, value: str) -> str:
    """Replace the ``key = ...`` line of the [launch] table (whatever the family's current expression)."""
    head, sep, tail = text.partition("[launch]")
    new, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", tail, count=1, flags=re.M)
    assert sep and n == 1, key
    return head + sep + new


BAD_GRIDS = ['"\'abc\'"', '"{1: 2}"', '"[1e999, 1, 1]"', '"[-1, 1, 1]"', '"[0, 1, 1]"', '"[2**70, 1, 1]"', '"[1, 1]"',
             '"[1.5, 1, 1]"']


@pytest.mark.parametrize("grid", BAD_GRIDS)
@pytest.mark.slow
def test_bad_launch_grid_is_one_line(hostile_family, grid: str) -> None:
    """The first grid in a process of its own, the others through the same entry point in this process."""
    folder = hostile_family(toml=lambda t: _set_line(t, "grid", grid))
    run = ks if grid == BAD_GRIDS[0] else ks_here
    assert_one_line_error(run("render", str(folder), "--chip", "M2 Max"), "launch.grid")


@pytest.mark.slow
@pytest.mark.parametrize("tg", ['"[0, 1, 1]"', '"[-32, 1, 1]"', '"[2**40, 1, 1]"'])
def test_bad_threadgroup_is_one_line(hostile_family, tg: str) -> None:
    folder = hostile_family(toml=lambda t: _set_line(t, "threadgroup", tg))
    run = ks if tg == '"[0, 1, 1]"' else ks_here  # the first in a process of its own
    assert_one_line_error(run("render", str(folder), "--chip", "M2 Max"), "launch.threadgroup")


@pytest.mark.slow
def test_corrupted_sqlite_storage_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "studies.db"
    ok = ks("tune", "gemm", "--backend", "model", "--chip", "M2 Max", "--shape", "64,64,64", "--trials", "2",
            "--verify", "none", "--storage", f"sqlite:///{db}", *RANDOM, timeout=300)
    assert ok.returncode == 0, ok.stderr
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(db.read_bytes())
    page = 4096
    for start in range(page * 2, len(data), page):  # every page but the header's: b-tree pages garbage
        data[start:start + 64] = b"\xa5" * 64
    db.write_bytes(bytes(data))
    for args in (["studies"], ["show", "gemm/M2 Max/float16/64x64x64/model"],
                 ["tune", "gemm", "--backend", "model", "--chip", "M2 Max", "--shape", "64,64,64", "--trials", "2"]):
        assert_one_line_error(ks(*args, "--storage", f"sqlite:///{db}", timeout=120), "storage")


@pytest.mark.parametrize("args", [[], ["tune"], ["tune", "gemm", "--seed", "x"], ["nosuch"], ["tune", "gemm", "--bogus"],
                                  ["verify"], ["artifacts", "show"]])
@pytest.mark.slow
def test_usage_errors_are_one_line(args: list[str]) -> None:
    proc = ks(*args) if args in ([], ["tune", "gemm", "--bogus"]) else ks_here(*args)  # two in processes of their own
    if not args:
        assert proc.returncode == 0 and "Usage" in proc.stdout
        return
    assert_one_line_error(proc)
    assert "╭" not in proc.stderr and "Usage:" not in proc.stderr


class _Killed(BaseException):
    """Stands for SIGKILL at one point of a publish (nothing after it runs)."""


@pytest.mark.slow
@pytest.mark.parametrize("step", ["journal", "index", "rename", "pointer"])
def test_a_publisher_killed_at_any_step_leaves_a_consistent_repairable_store(store: Path, step: str,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import kernsearch.artifacts._artifacts as arts

    st = ArtifactStore(store)
    killed = lambda *a, **k: (_ for _ in ()).throw(_Killed())  # noqa: E731
    if step == "journal":
        monkeypatch.setattr(arts._safeio, "append_line", killed)
    elif step == "index":  # the journal says published; the index never recorded it
        from kernsearch.artifacts._index import StoreIndex

        monkeypatch.setattr(StoreIndex, "append", killed)
    elif step == "rename":  # the index recorded v2 as current; it never moved in place
        monkeypatch.setattr(arts.os, "rename", killed)
    else:
        monkeypatch.setattr(arts.ArtifactStore, "_write_pointer", killed)
    with pytest.raises(_Killed):
        st.publish(candidate(median=0.5, config={"BM": 64}))
    monkeypatch.undo()
    st = ArtifactStore(store)
    leftovers = st.crash_leftovers(key())
    if step == "journal":  # nothing visible happened: the hidden folder was removed
        assert leftovers == [] and st.versions(key()) == ["v1"]
    else:
        assert leftovers, step
        proc = ks("artifacts", "verify", "--store", str(store))
        assert "leftover" in proc.stdout
        proc = ks("artifacts", "verify", "--repair", "--store", str(store))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        st = ArtifactStore(store)
        assert st.crash_leftovers(key()) == [] and st.stale_temporaries() == []
        published = [e["version"] for e in st.journal(key()) if e["outcome"] == "published"]
        assert set(st.versions(key())) <= set(published)
        if step == "pointer":  # the gate had accepted v2: repair finishes the move
            assert st.pointer(key()).version == "v2"
        else:
            assert st.pointer(key()).version == "v1" and st.versions(key()) == ["v1"]
    # the store still accepts a publish afterwards
    assert st.publish(candidate(median=0.25, config={"BM": 16})).published


@pytest.mark.slow
# Four whole `tune` processes (~50 s of CPU): the e2e lane. make test holds the same lines: two processes share one
# SQLite study without measuring a config twice (tests/test_replay.py), a process joining a new study late skips
# what another measured (below), and rerunning `tune` with a larger budget resumes its study (tests/test_study_cli.py).
@pytest.mark.e2e
def test_two_tune_processes_on_one_new_study_never_measure_a_config_twice(tmp_path: Path) -> None:
    """Two `tune` processes start together on a new study, then resume it together with twice the budget (the
    budget counts the study's evaluated configs: a second round at the same budget would propose nothing).

    Held steady on a loaded machine: the processes have a home of their own (the worker's shared one may hold
    published gemm versions of other tests, whose warm-start configs would change what they propose), write to
    files (no pipe left undrained while the other is waited for) and get minutes each; a failure shows both."""
    import subprocess
    import sys

    import optuna

    db = f"sqlite:///{tmp_path / 'studies.db'}"
    env = {**os.environ, "KERNSEARCH_HOME": str(tmp_path / "home")}
    env.pop("KERNSEARCH_ARTIFACTS", None)
    args = [sys.executable, "-m", "kernsearch", "tune", "gemm", "--backend", "model", "--chip", "M2 Max",
            "--shape", "64,64,64", "--dtype", "float32", "--verify", "none", "--storage", db,
            "--study", "race", "--sampler", "random"]
    for round_, budget in enumerate((24, 48)):
        logs = [tmp_path / f"round{round_}-seed{seed}.log" for seed in (1, 2)]
        procs = []
        for seed, log in zip((1, 2), logs):
            with open(log, "w") as out:  # the child holds its own copy of the descriptor
                procs.append(subprocess.Popen(args + ["--trials", str(budget), "--seed", str(seed + 10 * round_)],
                                              stdout=out, stderr=subprocess.STDOUT, env=env))
        codes = [p.wait(timeout=600) for p in procs]
        assert all(code in (0, 1) for code in codes), [(c, log.read_text()[-3000:]) for c, log in zip(codes, logs)]
    study = optuna.load_study(study_name="race", storage=db)
    measured = [json.dumps(t.user_attrs["config"], sort_keys=True) for t in study.get_trials(deepcopy=False)
                if t.user_attrs.get("status") == "ok"]
    # (both may propose the last config of the budget at once: a shared budget can be passed by one)
    assert len(measured) >= 48 and len(measured) == len(set(measured)), sorted(measured)


class _Toy(Objective):
    """A 12-config objective whose evaluations are logged as (who, config); hooks let a test interleave two."""

    backend, evidence = "model", "modeled"

    def __init__(self, who: str, log: list[tuple[str, str]], on_warm_start=None, on_evaluate=None) -> None:  # noqa: ANN001
        self.who, self.log, self.on_warm_start, self.on_evaluate = who, log, on_warm_start, on_evaluate

    knobs = property(lambda self: {"X": list(range(12))})
    study_key = property(lambda self: {"family": "toy", "chip": "c", "dtype": "d", "shape": "1", "backend": "model"})

    def violation(self, config):  # noqa: ANN001, ANN201
        return None

    def valid_configs(self):  # noqa: ANN201
        return [{"X": i} for i in range(12)]

    def default(self):  # noqa: ANN201
        return {"X": 0}

    def warm_start(self):  # noqa: ANN201
        if self.on_warm_start is not None:
            self.on_warm_start()
        return []

    def evaluate(self, config):  # noqa: ANN001, ANN201
        self.log.append((self.who, json.dumps(config)))
        if self.on_evaluate is not None:
            self.on_evaluate()
        return Record(1.0 + config["X"], "modeled", [1.0])


@pytest.mark.slow
def test_a_process_joining_a_new_study_late_does_not_remeasure_its_first_configs(tmp_path: Path) -> None:
    """B opens the study, A measures the default config meanwhile, then B asks its first trial: B must see
    that another process is on the study (its first trial number is not the next one it saw) and skip."""
    import threading
    import time

    import optuna

    from kernsearch import run_study

    evaluated: list[tuple[str, str]] = []
    a_done = threading.Event()
    db = f"sqlite:///{tmp_path / 'toy.db'}"
    run_study(_Toy("A", evaluated), trials=1, storage=db, study_name="toy", sampler="random", seed=1, finalists=1)
    # A has measured X=0; now B, which opened the study when it was empty, starts asking
    optuna.delete_study(study_name="toy", storage=db)
    b = threading.Thread(target=lambda: run_study(_Toy("B", evaluated, on_warm_start=lambda: a_done.wait(30)),
                                                   trials=3, storage=db, study_name="toy", sampler="random", seed=2,
                                                   finalists=1))
    b.start()
    time.sleep(1.0)  # B has its (empty) snapshot and waits in warm_start (B is slow to start)
    run_study(_Toy("A", evaluated), trials=1, storage=db, study_name="toy", sampler="random", seed=1, finalists=1)
    a_done.set()
    b.join(60)
    configs = [c for who, c in evaluated[1:]]  # the first run above was a warm-up on a deleted study
    assert len(configs) == len(set(configs)), evaluated


@pytest.mark.slow
def test_a_trial_told_while_a_joining_process_reads_the_study_is_not_measured_again(tmp_path: Path,
                                                                                     monkeypatch) -> None:  # noqa: ANN001
    """A is evaluating the default config when B opens the study; A tells it just after B's first read of
    the study. B's view at start must be one read (what it knows, how many trials there are, which run):
    read as two, the trial was running in the first and told in the second, B thought itself alone, and
    asked the default config again (CI of 2026-11-29: two `tune` processes on PostgreSQL measured a config
    twice)."""
    import threading

    import optuna

    from kernsearch import run_study
    from kernsearch.studies import _storage

    evaluated: list[tuple[str, str]] = []
    a_evaluating, b_read = threading.Event(), threading.Event()
    db = f"sqlite:///{tmp_path / 'toy.db'}"
    armed: dict[str, bool] = {}
    fail_stale, get_trials = _storage.Heartbeat.fail_stale, optuna.Study.get_trials

    def arm(beat):  # noqa: ANN001, ANN202 - B's first read of the study comes next
        if threading.current_thread().name == "B" and not b_read.is_set():
            armed["B"] = True
        return fail_stale(beat)

    def read(study, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        trials = get_trials(study, *args, **kwargs)
        if armed.pop(threading.current_thread().name, False):
            b_read.set()  # A tells its trial now, between this read and any later one
            for _ in range(600):
                if all(t.state != optuna.trial.TrialState.RUNNING for t in get_trials(study, deepcopy=False)):
                    break
                threading.Event().wait(0.05)
        return trials

    monkeypatch.setattr(_storage.Heartbeat, "fail_stale", arm)
    monkeypatch.setattr(optuna.Study, "get_trials", read)
    a = threading.Thread(target=lambda: run_study(
        _Toy("A", evaluated, on_evaluate=lambda: (a_evaluating.set(), b_read.wait(30))), trials=1, storage=db,
        study_name="toy", sampler="random", seed=1, finalists=1))
    b = threading.Thread(name="B", target=lambda: (a_evaluating.wait(30), run_study(
        _Toy("B", evaluated), trials=3, storage=db, study_name="toy", sampler="random", seed=2, finalists=1)))
    a.start()
    b.start()
    a.join(60)
    b.join(60)
    configs = [c for who, c in evaluated if who == "B"]
    assert ("A", json.dumps({"X": 0})) in evaluated and json.dumps({"X": 0}) not in configs, evaluated
    assert len(configs) >= 2, evaluated  # B went on with its own budget

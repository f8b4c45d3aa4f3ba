"""A farm's shared study on a real PostgreSQL server (tests/pgserver.py): several worker processes, one study,
no config measured twice, a worker killed mid-trial costs the study that trial and nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from ci import IN_CI
from pgserver import PostgresServer, pg_bin, wait_for

from kernsearch.studies._storage import GRACE_BEATS

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

pytestmark = pytest.mark.skipif(pg_bin() is None and not IN_CI, reason="PostgreSQL is not installed (.ci/run installs it)")


@pytest.fixture(scope="module")
def pg():
    with PostgresServer() as server:
        yield server
    assert not server.running()


def _worker(pg: PostgresServer, study: str, trials: int, eval_s: float, log: Path, hang_on: int | None = None,
            heartbeat: int = 1) -> subprocess.Popen[str]:
    env = dict(os.environ, FARM_LOG=str(log), KERNSEARCH_HEARTBEAT_S=str(heartbeat),
               PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    args = [sys.executable, str(TESTS / "farm_worker.py"), pg.url, study, str(trials), str(eval_s)]
    return subprocess.Popen(args + ([str(hang_on)] if hang_on else []), env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _trials(pg: PostgresServer, study: str):
    import optuna

    from kernsearch.studies._storage import make_storage

    return optuna.load_study(study_name=study, storage=make_storage(pg.url)).get_trials(deepcopy=False)


def _evaluated(log: Path) -> list[tuple[str, str]]:
    return [tuple(line.split()) for line in log.read_text().splitlines()]  # type: ignore[misc]


@pytest.mark.slow  # worker processes on a real server: CI runs it, the fast lane does not
@pytest.mark.e2e
def test_three_processes_share_one_study_without_measuring_a_config_twice(pg, tmp_path):
    log = tmp_path / "evals.log"
    workers = [_worker(pg, "shared", 24, 0.05, log) for _ in range(3)]
    for w in workers:
        out, err = w.communicate(timeout=240)
        assert w.returncode == 0, err[-2000:]
    evaluated = _evaluated(log)
    configs = Counter(config for _, config in evaluated)
    assert len({pid for pid, _ in evaluated}) == 3  # every process did part of the work
    assert [c for c, n in configs.items() if n > 1] == []  # no config measured twice across processes
    ok = [t for t in _trials(pg, "shared") if t.user_attrs.get("status") == "ok"]
    assert len(ok) == len(configs) >= 24  # the budget is the study's, shared by the processes


@pytest.mark.slow  # worker processes on a real server: CI runs it, the fast lane does not
@pytest.mark.e2e
def test_a_worker_killed_mid_trial_has_its_trial_failed_and_retried_and_the_study_goes_on(pg, tmp_path):
    from optuna.trial import TrialState

    log = tmp_path / "evals.log"
    victim = _worker(pg, "killed", 40, 0.05, log, hang_on=3)
    assert wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= 3, 60), victim.stderr
    hung = _evaluated(log)[2][1]
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    running = [t for t in _trials(pg, "killed") if t.state == TrialState.RUNNING]
    assert len(running) == 1  # the dead process's trial: nobody will tell it
    # Past the grace (3 beats of 1 s) its pulse is stale whenever the survivor looks: without the wait, a survivor
    # that starts fast can finish its 20 trials while the dead trial still counts as alive (a race, not a bug).
    time.sleep(GRACE_BEATS * 1 + 1)

    survivor = _worker(pg, "killed", 20, 0.05, log)
    out, err = survivor.communicate(timeout=240)
    assert survivor.returncode == 0, err[-2000:]
    trials = _trials(pg, "killed")
    dead = next(t for t in trials if t.number == running[0].number)
    assert dead.state == TrialState.FAIL  # failed by the survivor's heartbeat check (grace: 3 s)
    evaluated = _evaluated(log)
    assert [c for pid, c in evaluated if pid == str(survivor.pid)].count(hung) == 1  # its config retried
    ok = [t for t in trials if t.user_attrs.get("status") == "ok"]
    assert len(ok) >= 20 and not [t for t in trials if t.state == TrialState.RUNNING]


@pytest.mark.slow  # two `kernsearch tune` processes on a real server
@pytest.mark.e2e
def test_two_tune_commands_add_to_one_postgresql_study(pg, tmp_path):
    """What an operator runs on two machines: `kernsearch tune ... --storage postgresql://...` at once."""
    import json

    args = [sys.executable, "-m", "kernsearch", "tune", "gemm", "--shape", "64,64,64", "--trials", "12",
            "--patience", "0", "--verify", "none", "--storage", pg.url, "--json"]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, KERNSEARCH_HOME=str(tmp_path / f"home{i}"))) for i in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out))
    name = "gemm/M2 Max/float16/64x64x64/model"
    assert [r["study_name"] for r in results] == [name, name]
    evaluated = [t for t in _trials(pg, name) if t.user_attrs.get("status") in ("ok", "failed")]
    configs = Counter(json.dumps(t.user_attrs["config"], sort_keys=True) for t in evaluated)
    assert len(evaluated) >= 12 and max(configs.values()) == 1  # one study, its budget shared, no config twice
    assert not (tmp_path / "home0" / "studies.db").exists()  # nothing went to the local default storage


@pytest.mark.slow
def test_an_unreachable_postgresql_url_is_one_line_without_the_password(tmp_path):
    url = "postgresql://farm:hunter2@127.0.0.1:9/studies"  # port 9 (discard): nothing listens
    proc = subprocess.run([sys.executable, "-m", "kernsearch", "tune", "gemm", "--backend", "model", "--trials", "2",
                           "--storage", url], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, KERNSEARCH_HOME=str(tmp_path)))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot open study storage" in lines[0] and "hunter2" not in proc.stderr, proc.stderr


def test_a_farm_worker_refuses_a_run_for_another_chip_in_one_line(monkeypatch):
    from kernsearch.flows.nightly import gpu_limit_name, refusal

    monkeypatch.delenv("KERNSEARCH_CHIP", raising=False)
    assert refusal("M3 Max") is None  # no declared identity: a machine runs what it is asked (modeled)
    monkeypatch.setenv("KERNSEARCH_CHIP", "M2 Max")
    monkeypatch.setenv("KERNSEARCH_MACHINE", "mac-mini-07")
    assert refusal("M2 Max") is None and refusal("m2-max") is None
    why = refusal("M3 Max")
    assert why is not None and "\n" not in why and "mac-mini-07" in why and "M3 Max" in why
    assert gpu_limit_name() == "kernsearch-gpu-mac-mini-07"  # one GPU slot per machine, not per host name

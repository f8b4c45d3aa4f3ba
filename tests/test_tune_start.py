"""`tune --start CONFIG`: configs a user already suspects are good are evaluated first (trial 0, 1, ... in the order
given, before the family default), each checked against the problem's space before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from conftest import kernsearch_in_process


def _tune(home: Path, *args: str, in_process: bool = False) -> subprocess.CompletedProcess[str]:
    env = {"KERNSEARCH_HOME": str(home), "KERNSEARCH_ARTIFACTS": str(home / "artifacts")}
    argv = ["tune", "qmatvec", "--backend", "model", "--verify", "none", *args]
    if in_process:
        return kernsearch_in_process(*argv, env=env)
    return subprocess.run([sys.executable, "-m", "kernsearch", *argv], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600)


@pytest.mark.slow
def test_the_start_configs_are_the_first_trials_in_order(tmp_path: Path) -> None:
    done = _tune(tmp_path, "--trials", "3", "--json", "--start", "TW=4,KS=1", "--start", "UNROLL=4,RT=2")
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    study = optuna.load_study(study_name=out["study_name"], storage=out["storage"])
    first = [t.params for t in sorted(study.get_trials(), key=lambda t: t.number)][:3]
    base = {"PATH": "fma", "QBITS": 4, "TW": 2, "KS": 2, "RT": 1, "UNROLL": 2, "MB": 1}  # the family default
    assert first == [{**base, "TW": 4, "KS": 1}, {**base, "UNROLL": 4, "RT": 2}, base]


@pytest.mark.slow
def test_a_start_config_outside_the_space_is_one_line_before_anything_runs(tmp_path: Path) -> None:
    """The first case in a real `kernsearch tune` process (its exit status, no traceback); the others through the
    same entry point in this process (tests/conftest.py kernsearch_in_process)."""
    for i, (bad, says) in enumerate((("TW=5", "invalid value TW=5"), ("BM=4", "unknown knob 'BM'"),
                                     ("PATH=mma", "violates rows_compiled"))):
        done = _tune(tmp_path, "--trials", "3", "--start", bad, in_process=i > 0)
        assert done.returncode == 2 and done.stdout == ""
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: --start: ") and says in lines[0], done.stderr
    assert not (tmp_path / "studies.db").exists() or _no_trials(tmp_path)


def _no_trials(home: Path) -> bool:
    storage = f"sqlite:///{home / 'studies.db'}"
    return all(not s.n_trials for s in optuna.get_all_study_summaries(storage))

"""`kernsearch tune / studies / show` end to end (model back-end verified on the interpreter, replay),
and their one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import kernsearch_in_process

REPO = Path(__file__).resolve().parents[1]
LANDSCAPES = Path(os.environ.get("KERNSEARCH_LANDSCAPES", REPO.parent / "shared" / "landscapes"))
PNPOLY = LANDSCAPES / "pnpoly_RTX_3090.json.gz"


def ks(*args: str, home: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """The CLI with its data directory (the default study storage) at ``home``."""
    return subprocess.run([sys.executable, "-m", "kernsearch", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "KERNSEARCH_HOME": str(home)})


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    res = ks("tune", "gemm", "--shape", "64,64,64", "--dtype", "float32", "--trials", "8", "--patience", "0",
             "--finalists", "2", "--json", home=home)
    return home, res


@pytest.mark.slow
def test_tune_without_a_gpu_is_modeled_and_its_winner_passes_the_interpreter(tuned):
    home, res = tuned
    assert res.returncode == 0, res.stderr[-3000:]
    assert "no GPU here" in res.stderr and "modeled" in res.stderr  # said in one line before starting
    data = json.loads(res.stdout)
    assert data["evidence"] == "modeled" and data["backend"] == "model" and data["key"]["chip"] == "M2 Max"
    assert data["evaluated"] == 8 and data["study_name"] == "gemm/M2 Max/float32/64x64x64/model"
    winner = data["winner"]
    assert winner is not None and winner["evidence"] == "modeled"
    check = data["final"]["checks"][str(winner["number"])]
    assert check["ok"] and check["max_abs_err"] < 1e-3
    assert (home / "studies.db").is_file()  # default storage: SQLite under $KERNSEARCH_HOME


@pytest.mark.slow
def test_studies_and_show_print_the_stored_study(tuned):
    home, _ = tuned
    listed = ks("studies", home=home)
    assert listed.returncode == 0 and "gemm/M2 Max/float32/64x64x64/model" in listed.stdout
    assert "modeled" in listed.stdout
    shown = ks("show", "gemm/M2 Max/float32/64x64x64/model", home=home)
    assert shown.returncode == 0, shown.stderr
    assert "configs evaluated: 8 (8 ok, 0 failed)" in shown.stdout  # counted as `tune` counts them
    assert "modeled" in shown.stdout and "interpreter" in shown.stdout
    row = next(line for line in listed.stdout.splitlines() if "float32/64x64x64/model" in line)
    assert row.split()[2] == "8"  # studies: the same count (configs evaluated), not Optuna's trial count
    as_json = json.loads(ks("show", "gemm/M2 Max/float32/64x64x64/model", "--json", home=home).stdout)
    assert as_json["status"]["ok"] == 8 and len(as_json["top"]) == 8


@pytest.mark.slow
def test_rerunning_the_command_resumes_the_study(tuned):
    home, _ = tuned
    res = ks("tune", "gemm", "--shape", "64,64,64", "--dtype", "float32", "--trials", "10", "--patience", "0",
             "--finalists", "1", "--verify", "none", "--json", home=home)
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(res.stdout)
    assert data["evaluated"] == 10 and data["study_name"] == "gemm/M2 Max/float32/64x64x64/model"


def test_the_cli_choices_are_the_library_s() -> None:
    from kernsearch.cli import SamplerChoice
    from kernsearch.studies._study import SAMPLERS

    assert [c.value for c in SamplerChoice] == list(SAMPLERS)


@pytest.mark.parametrize("args,message", [
    (["--sampler", "anneal"], "'anneal' is not one of 'default', 'tpe', 'random', 'grid', 'auto', 'forest', 'hybrid', 'thompson'"),
    (["--time-budget", "soon"], "bad duration"),
    (["--backend", "metal"], "no Metal device"),
    (["--backend", "cpu"], "correctness only"),
    (["--backend", "replay"], "--landscape"),
    (["--shape", "0,4,4"], "impossible shape"),
    (["--verify", "sometimes"], "--verify"),
])
@pytest.mark.slow
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    # the first case in a process of its own (its exit status, no traceback), the others through the same entry
    # point in this process (issue 42: ~0.8 s of CPU a process)
    tune = ("tune", "gemm", "--trials", "2", *args)
    res = ks(*tune, home=tmp_path) if args == ["--sampler", "anneal"] else \
        kernsearch_in_process(*tune, env={"KERNSEARCH_HOME": str(tmp_path)})
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [line for line in res.stderr.splitlines() if line.strip() and not line.startswith(("No GPU", "no GPU", "tuning"))]
    assert message in res.stderr and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr


@pytest.mark.slow
def test_show_of_an_unknown_study_is_a_user_error(tmp_path):
    res = ks("show", "no/such/study", home=tmp_path)
    assert res.returncode == 2 and "no study" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.slow
@pytest.mark.skipif(not PNPOLY.is_file(), reason=f"recorded landscapes not found in {LANDSCAPES}")
def test_ctrl_c_stops_cleanly_and_keeps_finished_trials(tmp_path):
    env = {**os.environ, "KERNSEARCH_HOME": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "kernsearch", "tune", "pnpoly", "--landscape", str(PNPOLY),
                             "--trials", "4000", "--patience", "0"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    db = tmp_path / "studies.db"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not db.is_file() or db.stat().st_size < 100_000):
        time.sleep(0.5)  # until trials are being written
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Ctrl-C" in out and "Traceback" not in err
    shown = json.loads(ks("show", "pnpoly/RTX 3090/unknown-dtype/20000000/replay", "--json",
                          home=tmp_path).stdout)
    assert shown["status"].get("ok", 0) > 0 and "running" not in shown["status"]


@pytest.mark.slow
def test_publish_then_warm_start_a_related_study(tmp_path, gemm):
    """The winner goes to the artifact store; a study of a related shape starts from it (trial 1)."""
    import optuna

    from kernsearch import ArtifactStore, get_chip, make_problem, run_study
    from kernsearch.studies._objective import KernelObjective

    store = ArtifactStore(tmp_path / "artifacts")
    chip = get_chip("M2 Max")
    url = f"sqlite:///{tmp_path / 's.db'}"
    first = KernelObjective(make_problem(gemm, "64,64,64", "float32", chip), chip, "model")
    first.default = lambda: None  # type: ignore[method-assign] - so the winner differs from trial 0 below
    result = run_study(first, trials=6, finalists=1, seed=4, storage=url)
    assert result.best.config != dict(gemm.default)
    outcome = first.publish(result, store)
    assert outcome.published and outcome.version == "v1"
    artifact = store.load(next(iter(store.keys())))
    assert artifact.manifest.evidence == "modeled" and artifact.manifest.correctness.verifier == "interpreter"
    assert artifact.manifest.config == result.best.config

    related = KernelObjective(make_problem(gemm, "64,64,32", "float32", chip), chip, "model", verify="none")
    assert related.warm_start(store) == [result.best.config]
    related.warm_start = lambda: [result.best.config]  # type: ignore[method-assign] - the store above
    second = run_study(related, trials=3, finalists=1, seed=0, storage=url)
    study = optuna.load_study(study_name=second.study_name, storage=url)
    ordered = sorted(study.trials, key=lambda t: t.number)
    assert ordered[0].user_attrs["config"] == dict(gemm.default)  # trial 0: the family's default
    assert ordered[1].user_attrs["config"] == result.best.config  # then the published winner

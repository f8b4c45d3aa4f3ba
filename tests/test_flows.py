"""Issue 6: nightly search flows. Job files, the killable step subprocess, the Prefect flow on the model+cpu
back-ends (prefect_test_harness, one per session), and a real `prefect server` serving the deployment.

The flows search GEMM with the performance model (modeled) and prove winners on the CPU Metal interpreter,
so they run here without a GPU. Shapes and budgets are tiny; the whole file takes a few minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import kernsearch_in_process

from kernsearch.flows._jobs import JobFileError, load_jobs

REPO = Path(__file__).resolve().parents[1]
KERNSEARCH = [sys.executable, "-m", "kernsearch"]
PREFECT = str(Path(sys.executable).with_name("prefect"))
TELEMETRY_OFF = {"DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


# -- helpers --------------------------------------------------------------------------------------------

def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def hanging_family(root: Path) -> Path:
    """A copy of GEMM named gemmhang whose Metal kernel spins forever (a volatile loop: not optimised away)."""
    dst = root / "gemmhang"
    if not dst.exists():
        shutil.copytree(REPO / "templates" / "gemm", dst)
        toml = dst / "family.toml"
        toml.write_text(toml.read_text().replace('name = "gemm"', 'name = "gemmhang"', 1))
        tpl = dst / "gemm.metal.j2"
        text = tpl.read_text()
        assert "{% block source %}\n" in text
        tpl.write_text(text.replace("{% block source %}\n",
                                    "{% block source %}\n    volatile int ks_spin = 1; while (ks_spin) {}\n", 1))
    return dst


def only_job(name: str, text: str | None = None) -> str:
    """GOOD_JOBS (or ``text``) with one of its jobs: the header, [defaults] and that job's table."""
    head, *jobs = (text or GOOD_JOBS).split("[[jobs]]")
    (job,) = [j for j in jobs if f'name = "{name}"' in j]
    return head + "[[jobs]]" + job


GOOD_JOBS = """
artifacts = "store"
storage = "sqlite:///studies.db"
export = "dist"

[defaults]
backend = "model"
trials = 3
finalists = 1
sampler = "random"
verify_shapes = ["20,24,16"]

[[jobs]]
name = "square"
family = "gemm"
shapes = ["64,64,64"]
dtypes = ["float16"]
chips = ["M2 Max"]

[[jobs]]
name = "decode"
family = "gemm"
shapes = [[16, 64, 32]]
dtypes = ["float16"]
chips = ["M2 Max", "M3 Max"]
"""

HANG_JOB = """
[[jobs]]
name = "hang"
family = "./gemmhang"
shapes = ["32,32,32"]
dtypes = ["float32"]
chips = ["M2 Max"]
timeout = 4
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_members(pgid: int, wait: float = 10.0) -> list[str]:
    """Live (not zombie) processes of a process group, after giving SIGKILLed ones ``wait`` s to die."""
    deadline = time.monotonic() + wait
    while True:
        members = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
                members.append(stat.parent.name)
        if not members or time.monotonic() > deadline:
            return members
        time.sleep(0.2)


def alive(pgid: int) -> bool:
    return bool(group_members(pgid))


# -- job files ------------------------------------------------------------------------------------------

def test_job_file_units_per_chip_and_defaults(tmp_path: Path) -> None:
    jobs = load_jobs(write(tmp_path / "jobs.toml", GOOD_JOBS))
    m2 = jobs.units("M2 Max")
    assert [(u.job, u.shape, u.dtype, u.chip) for u in m2] == [
        ("square", (64, 64, 64), "float16", "M2 Max"), ("decode", (16, 64, 32), "float16", "M2 Max")]
    assert [u.job for u in jobs.units("M3 Max")] == ["decode"]  # a job runs only on the chips it lists
    assert jobs.units("M4 Max") == []
    assert jobs.chips() == ["M2 Max", "M3 Max"]
    assert m2[0].options.trials == 3 and m2[0].options.finalists == 1  # [defaults] apply
    assert m2[0].verify_shapes == ((20, 24, 16),)
    # relative paths are taken from the job file's folder, not the working directory
    assert jobs.artifacts == tmp_path / "store" and jobs.export == tmp_path / "dist"
    assert jobs.storage == f"sqlite:///{tmp_path / 'studies.db'}"


def test_job_file_yaml_and_job_overrides(tmp_path: Path) -> None:
    path = write(tmp_path / "jobs.yaml", """
defaults: {trials: 7, time_budget: 90s}
jobs:
  - family: gemm
    chips: [H100]
    trials: 3
""")
    (unit,) = load_jobs(path).units("H100")
    assert unit.options.trials == 3 and unit.options.time_budget == "90s"  # the job's own value wins
    assert unit.shape == (4096, 4096, 4096)  # no shapes: the family's default
    assert unit.verify_shapes == ()  # default extra check: derived from the winner by the verify step
    assert unit.step_timeout() == pytest.approx(90 * 1.5 + 600)


def test_shipped_example_job_file_loads() -> None:
    from importlib import resources

    example = resources.files("kernsearch.flows").joinpath("jobs/example.toml")
    jobs = load_jobs(Path(str(example)))
    assert jobs.chips() == ["M2 Max", "M3 Max", "M4 Max", "H100"]
    assert len(jobs.units("M3 Max")) == 5 and [u.job for u in jobs.units("H100")] == ["gemm-decode"]
    assert all(u.options.time_budget == "20m" for u in jobs.units())


@pytest.mark.parametrize("text, message", [
    ("[[jobs]]\nfamily = 'nope'\nchips = ['M2 Max']\n", "jobs.0: unknown family"),
    ("[[jobs]]\nfamily = 'gemm'\nchips = ['M9 Mega']\n", "jobs.0: unknown chip"),
    ("[[jobs]]\nfamily = 'gemm'\nchips = ['M2 Max']\nshapes = ['64,64']\n", "jobs.0:"),
    ("[[jobs]]\nfamily = 'gemm'\nchips = ['M2 Max']\ntrials = 0\n", "jobs.0.trials"),
    ("[[jobs]]\nfamily = 'gemm'\nchips = ['M2 Max']\ntime_budget = 'soon'\n", "bad duration"),
    ("[[jobs]]\nfamily = 'gemm'\nchips = ['M2 Max']\nbudget = 3\n", "jobs.0.budget: Extra inputs"),
    ("[[jobs]]\nfamily = 'gemm'\nchips = []\n", "jobs.0.chips"),
    ("jobs = []\n", "jobs: List should have at least 1 item"),
    ("[[jobs]\nfamily = 'gemm'\n", "not valid TOML"),
])
def test_bad_job_files_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path / "jobs.toml", text)
    with pytest.raises(JobFileError) as info:
        load_jobs(path)
    assert message.lower() in str(info.value).lower()
    assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.slow
def test_cli_bad_job_file_exit_2_one_line_and_no_prefect_import(tmp_path: Path) -> None:
    bad = write(tmp_path / "jobs.toml", "[[jobs]]\nfamily = 'gemm'\nchips = ['M9 Mega']\n")
    env = {**os.environ, **TELEMETRY_OFF}
    # the refusals before Prefect is imported: the first in a process (its exit status, no traceback), the others
    # through the same entry point in this process
    first = subprocess.run(KERNSEARCH + ["flows", "run", str(bad)], capture_output=True, text=True, env=env,
                           timeout=120)
    for proc in (first, kernsearch_in_process("flows", "serve", str(bad), env=TELEMETRY_OFF),
                 kernsearch_in_process("flows", "run", str(tmp_path / "missing.yaml"), env=TELEMETRY_OFF)):
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
        assert "Traceback" not in proc.stderr
    good = write(tmp_path / "good.toml", GOOD_JOBS)
    # no job for this chip: said at once, before any Prefect server starts (it used to start one for 34 s)
    proc = kernsearch_in_process("flows", "run", str(good), "--chip", "M2 Ultra", env={**TELEMETRY_OFF,
                                                                                      "PREFECT_API_URL": ""})
    assert proc.returncode == 2 and "no job is for M2 Ultra" in proc.stderr and proc.stderr.count("\n") == 1
    assert "Starting temporary server" not in proc.stdout + proc.stderr
    proc = subprocess.run(KERNSEARCH + ["flows", "serve", str(good), "--chip", "M2 Max", "--cron", "61 2 * * *"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "bad schedule" in proc.stderr and proc.stderr.count("\n") == 1
    for args in (["flows", "serve", str(good), "--chip", "M2 Max"], ["flows", "run", str(good), "--chip", "M2 Max"],
                 ["flows", "deploy", str(good)]):  # a Prefect server that does not answer: one line, exit 2
        proc = subprocess.run(KERNSEARCH + args, capture_output=True, text=True, timeout=120,
                              env={**env, "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"})
        assert proc.returncode == 2 and proc.stderr.startswith("error: cannot reach the Prefect server at"), \
            proc.stderr
        assert proc.stderr.count("\n") == 1
    no_server = {k: v for k, v in env.items() if k != "PREFECT_API_URL"} | {"PREFECT_HOME": str(tmp_path / "ph")}
    proc = subprocess.run(KERNSEARCH + ["flows", "deploy", str(good)], capture_output=True, text=True, timeout=120,
                          env=no_server)
    assert proc.returncode == 2 and "deployments live on a Prefect server" in proc.stderr, proc.stderr
    # issue 24: serving a schedule on the temporary server schedules nothing: refused, with the way to a server
    proc = subprocess.run(KERNSEARCH + ["flows", "serve", str(good), "--chip", "M2 Max"], capture_output=True,
                          text=True, timeout=120, env=no_server)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "a schedule runs on a Prefect server that stays up" in proc.stderr and "PREFECT_API_URL" in proc.stderr
    assert "Starting temporary server" not in proc.stdout + proc.stderr
    # the CLI (and the job-file module) load without Prefect: it is imported only by the flow commands
    code = ("import sys, kernsearch.cli, kernsearch.flows._jobs, kernsearch.flows._cli; "
            "print(sorted(m for m in sys.modules if m == 'prefect' or m.startswith('prefect.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


# -- the killable step subprocess ------------------------------------------------------------------------

@pytest.mark.slow
def test_step_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    """A kernel that spins on the interpreter is killed by the step's timeout, worker processes included."""
    from kernsearch.flows._steps import StepTimeout, run_step

    fam = hanging_family(tmp_path)
    payload = {"family": str(fam), "dtype": "float32", "chip": "M2 Max", "seed": 0, "shapes": [[16, 16, 16]],
               "config": {}, "verifier_backend": "cpu", "timeout": 600}
    from kernsearch import load_family

    payload["config"] = dict(load_family(str(fam)).default)
    started = time.monotonic()
    with pytest.raises(StepTimeout) as info:
        run_step("verify", payload, timeout=8)
    assert time.monotonic() - started < 60
    assert info.value.pgid and not alive(info.value.pgid)


def test_step_errors_come_back_with_their_reason(tmp_path: Path) -> None:
    from kernsearch.flows._steps import run_step

    with pytest.raises(Exception) as info:  # a user error inside the step is the same one-line error here
        run_step("verify", {"family": "nope", "dtype": "float32", "chip": "M2 Max", "shapes": [], "config": {},
                            "seed": 0, "verifier_backend": "cpu", "timeout": 10}, timeout=120)
    assert type(info.value).__name__ == "KernsearchError" and "unknown family" in str(info.value)


def test_step_process_that_dies_is_a_crash_worth_one_retry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step process that exits without a result is StepCrashed; only that is retried, never a timeout."""
    from kernsearch.flows._steps import StepCrashed, StepError, StepTimeout, run_step
    from kernsearch.flows.nightly import _retry_on_crash

    dies = write(tmp_path / "dies.sh", "#!/bin/sh\necho 'Fatal Python error: Segmentation fault' >&2\nkill -9 $$\n")
    dies.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(dies))
    with pytest.raises(StepCrashed) as info:
        run_step("verify", {}, timeout=60)
    assert "SIGKILL" in str(info.value) and "Segmentation fault" in str(info.value)

    class State:  # what Prefect hands a retry condition: result() raises the task's exception
        def __init__(self, exc: BaseException) -> None:
            self.exc = exc

        def result(self) -> None:
            raise self.exc

    assert _retry_on_crash(None, None, State(info.value))
    assert not _retry_on_crash(None, None, State(StepTimeout("timeout", "ran past 5 s")))
    assert not _retry_on_crash(None, None, State(StepError("no-winner", "no finalist passed")))


@pytest.mark.slow
def test_tune_step_resumes_the_study_with_trials_per_night(tmp_path: Path) -> None:
    from kernsearch.flows._jobs import JobOptions
    from kernsearch.flows._steps import Tuned, run_step

    options = JobOptions(trials=3, trials_per_night=2, sampler="random", finalists=1).model_dump()
    payload = {"family": "gemm", "shape": [32, 32, 32], "dtype": "float16", "chip": "M2 Max", "backend": "model",
               "storage": f"sqlite:///{tmp_path / 'studies.db'}", "options": options}
    first = Tuned.from_json(run_step("tune", payload, timeout=300))
    second = Tuned.from_json(run_step("tune", payload, timeout=300))
    assert first.evaluated == 2 and second.evaluated == 3  # +2 a night, never beyond `trials`
    assert first.study == second.study == "gemm/M2 Max/float16/32x32x32/model"  # the same study resumed
    assert second.evidence == "modeled" and second.winner.proof is not None
    assert second.winner.proof.verifier == "interpreter" and "32x32x32" in second.winner.proof.shapes


@pytest.mark.slow
def test_a_job_can_have_every_trial_verified_on_the_interpreter(tmp_path: Path) -> None:
    import optuna

    from kernsearch.flows._jobs import JobOptions
    from kernsearch.flows._steps import run_step
    from kernsearch.studies._storage import make_storage

    assert JobOptions().verify == "finalists"
    with pytest.raises(ValueError, match="verify"):
        JobOptions(verify="sometimes")  # type: ignore[arg-type]
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    for verify, shape in (("all", [24, 24, 24]), ("finalists", [32, 24, 24])):
        options = JobOptions(trials=3, sampler="random", finalists=1, verify=verify).model_dump()
        payload = {"family": "gemm", "shape": shape, "dtype": "float16", "chip": "M2 Max", "backend": "model",
                   "storage": storage, "options": options}
        result = run_step("tune", payload, timeout=300)
        trials = optuna.load_study(study_name=result["study"], storage=make_storage(storage)).get_trials()
        ran = [t.user_attrs["record"] for t in trials if t.user_attrs.get("status") == "ok"]
        checked = [r for r in ran if (r.get("proof") or {}).get("verifier") == "interpreter"]
        assert ran and len(checked) == (len(ran) if verify == "all" else 0), (verify, ran)


def test_measured_winner_is_published_with_the_detected_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The publish task (called as a plain function): measured evidence carries this machine's device_info."""
    from kernsearch import ArtifactStore, KernsearchError, load_family
    from kernsearch._records import Figures, ModeFigures, Proof, Winner
    from kernsearch._vocabulary import Evidence, Verifier
    from kernsearch.artifacts._artifacts import ArtifactKey
    from kernsearch.flows import nightly
    from kernsearch.flows._steps import Tuned, Verified
    from kernsearch.hardware import _chips
    from kernsearch.hardware._chips import chip_from_device_info

    (unit,) = load_jobs(write(tmp_path / "jobs.toml", """
[[jobs]]
family = "gemm"
shapes = ["64,64,64"]
dtypes = ["float16"]
chips = ["H100"]
""")).units("H100")
    mode = ModeFigures(median_ms=0.02, baseline_median_ms=0.03, speedup=1.5, low=1.45, high=1.55)
    figures = Figures(median_ms=0.02, spread=0.01, baseline_median_ms=0.03, baseline_spread=0.01, speedup_low=1.45,
                      speedup_high=1.55, modes={m: mode for m in ("graph", "eager")}, weight_sets=4)
    winner = Winner(0, dict(load_family("gemm").default), Evidence.MEASURED, figures,
                    "gemm/H100/float16/64x64x64/cuda", Proof(Verifier.DEVICE, ("64x64x64",), 0.001))
    tuned = Tuned(winner.study, Evidence.MEASURED, 1, {}, "trial budget reached", winner)
    verified = Verified(Proof(Verifier.DEVICE, ("68x68x68",), 0.002, 0.001))
    here = chip_from_device_info({"architecture": "sm_90", "device_name": "NVIDIA H100 80GB HBM3"})  # MLX's report
    monkeypatch.setattr(_chips, "detect_chip", lambda: here)  # the GPU here
    out = nightly.publish_task.fn(unit, "cuda", tuned, verified, str(tmp_path / "store"))
    assert out.published and out.version == "v1", out
    m = ArtifactStore(tmp_path / "store").load(ArtifactKey("gemm", "H100", "float16", (64, 64, 64))).manifest
    assert m.evidence == "measured" and m.chip.detected["device_name"] == "NVIDIA H100 80GB HBM3"
    assert m.kernel.target == "cuda" and m.measurements.speedup == pytest.approx(1.5)
    assert m.correctness.verifier == "device" and m.correctness.shapes_checked == ["64x64x64", "68x68x68"]

    elsewhere = chip_from_device_info({"architecture": "sm_90", "device_name": "NVIDIA H200"})
    monkeypatch.setattr(_chips, "detect_chip", lambda: elsewhere)
    with pytest.raises(KernsearchError, match="measured on H200, but the job is for H100"):
        nightly.publish_task.fn(unit, "cuda", tuned, verified, str(tmp_path / "store"))


def test_the_report_records_write_the_reports_json(tmp_path: Path) -> None:
    """A run's report is records; their ``to_json`` is the report's JSON: these keys, in this order, plain values."""
    from kernsearch._vocabulary import Evidence
    from kernsearch.flows._report import (
        Exported,
        ExportOutcome,
        ExportStatus,
        JobRow,
        NightlyReport,
        Outcome,
        Previous,
        Published,
    )
    from kernsearch.flows.nightly import FAILED, OUTCOMES, PUBLISHED, REJECTED

    assert (PUBLISHED, REJECTED, FAILED) == tuple(Outcome) == OUTCOMES == ("published", "rejected", "failed")
    (unit,) = load_jobs(write(tmp_path / "jobs.toml", only_job("square"))).units("M2 Max")
    head = ["job", "family", "family_ref", "chip", "dtype", "shape", "backend", "evidence", "old_ms", "old_version",
            "new_ms", "speedup", "outcome", "version", "reason"]
    failed = JobRow.start(unit, "model")
    failed.reason = "tune: timeout"
    assert list(failed.to_json()) == head and failed.to_json()["outcome"] == "failed"  # never tuned: no study keys
    done = JobRow.start(unit, "model")
    done.evidence, done.new_ms, done.study, done.evaluated, done.tune_window = Evidence.MODELED, 0.5, "s", 3, (1.0, 2.0)
    done.outcome, done.version = Outcome.PUBLISHED, "v1"
    row = done.to_json()
    assert list(row) == [*head, "study", "evaluated", "tune_window", "report"]
    assert (row["evidence"], row["outcome"], row["tune_window"], row["report"]) == ("modeled", "published",
                                                                                     [1.0, 2.0], None)
    assert done.verdict == "published v1" and failed.verdict == "failed"

    exported = Exported("dist", "dist/p.whl", "p", "1", ("gemm/M2-Max/float16/64x64x64/v1",), ())
    report = NightlyReport("M2 Max", "m1", str(tmp_path / "jobs.toml"), (done, failed),
                           ExportOutcome(ExportStatus.EXPORTED, exported=exported))
    data = json.loads(json.dumps(report.to_json()))
    assert list(data) == ["chip", "machine", "job_file", "jobs", "export", "published", "rejected", "failed"]
    assert (data["published"], data["rejected"], data["failed"]) == (1, 0, 1) == (report.published, report.rejected,
                                                                                   report.failed)
    assert data["export"] == {"status": "exported", "out": "dist", "wheel": "dist/p.whl", "package": "p",
                              "version": "1", "artifacts": ["gemm/M2-Max/float16/64x64x64/v1"], "notes": []}
    assert ExportOutcome(ExportStatus.FAILED, "export: boom").to_json() == {"status": "failed", "reason": "export: boom"}

    first = Published(True, "v1", "first version", "k", "v1")
    assert first.to_json() == {"published": True, "version": "v1", "reason": "first version", "key": "k",
                               "current": "v1", "old_ms": None, "old_version": None}
    later = Published(False, None, "not faster", "k", "v1", Previous(0.5, "v1", Evidence.MODELED))
    assert json.loads(json.dumps(later.to_json()))["old_evidence"] == "modeled"


# -- the flow, against prefect_test_harness ----------------------------------------------------------------

@pytest.fixture(scope="module")
def prefect_harness(tmp_path_factory: pytest.TempPathFactory):
    """One temporary Prefect server for this file's flow tests (its start takes ~15 s on 2 cores), stopped when they
    are done: idle, its services take ~1 s of CPU a minute, and the worker goes on with other files for minutes."""
    saved = {k: os.environ.get(k) for k in (*TELEMETRY_OFF, "PREFECT_HOME")}
    os.environ.update(TELEMETRY_OFF)
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    import prefect_api
    from prefect.testing import utilities
    from prefect.testing.utilities import prefect_test_harness

    def migrated_temp_dir() -> str:
        """The harness's database folder, holding a database already at Prefect's schema (prefect_api): the
        server skips its migrations."""
        folder = tmp_path_factory.mktemp("prefect-harness-db")
        shutil.copyfile(prefect_api.migrated_database(), folder / "prefect-test.db")
        return str(folder)

    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(utilities, "mkdtemp", migrated_temp_dir)  # where the harness puts its database
            with prefect_test_harness(server_startup_timeout=180):
                yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("farm")
    hanging_family(root)
    write(root / "first.toml", GOOD_JOBS + HANG_JOB)
    write(root / "again.toml", only_job("square"))  # one job: the second night's refusal is the same for each
    return root


def _artifact_table(key: str, kind: str = "table") -> list[dict]:
    """The latest table artifact of ``key``, read back from the server.

    (Raw filter request: Prefect 3.8's ``read_artifacts`` sends ``null`` filters that its own server
    refuses with 422.)
    """
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        response = client.request("POST", "/artifacts/filter", json={
            "artifacts": {"key": {"any_": [key]}, "type": {"any_": [kind]}}, "sort": "CREATED_DESC",
            "limit": 1, "offset": 0})
    response.raise_for_status()
    (art,) = response.json()
    data = art["data"]
    return json.loads(data) if isinstance(data, str) and kind == "table" else data


@pytest.mark.slow
def test_nightly_publishes_then_rejects_and_a_hanging_job_fails_alone(prefect_harness, farm: Path) -> None:
    from kernsearch import ArtifactStore
    from kernsearch.artifacts._artifacts import ArtifactKey
    from kernsearch.flows.nightly import gpu_limit_name, nightly, slug

    first = nightly(job_file=str(farm / "first.toml"), chip="M2 Max")
    rows = {r.job: r for r in first.jobs}
    assert set(rows) == {"square", "decode", "hang"}
    for name in ("square", "decode"):
        r = rows[name]
        assert r.outcome == "published" and r.version == "v1", r
        assert r.evidence == "modeled" and r.new_ms > 0 and r.old_ms is None
        assert r.reason.startswith("first version for this key")
    hang = rows["hang"]
    assert hang.outcome == "failed" and "timeout" in hang.reason, hang
    assert (first.published, first.rejected, first.failed) == (2, 0, 1)

    store = ArtifactStore(farm / "store")
    art = store.load(ArtifactKey("gemm", "M2-Max", "float16", (64, 64, 64)))
    assert art.manifest.evidence == "modeled" and art.manifest.correctness.verifier == "interpreter"
    assert {"64x64x64", "20x24x16"} <= set(art.manifest.correctness.shapes_checked)  # tuned + extra shape
    assert art.manifest.measurements.median_ms == pytest.approx(rows["square"].new_ms)
    assert not any(k.family == "gemmhang" for k in store.keys() if store.versions(k))  # the hang published nothing
    exported = first.export.exported
    assert first.export.status == "exported" and exported is not None and Path(exported.wheel).is_file()
    assert any("gemm/M2-Max/float16/64x64x64/v1" == a for a in exported.artifacts)

    table = _artifact_table("kernsearch-nightly-m2-max")
    assert [t["job"] for t in table] == ["square", "decode", "hang"]
    assert table[0]["outcome"] == "published v1" and table[0]["evidence"] == "modeled"
    assert table[2]["outcome"] == "failed" and "timeout" in table[2]["reason"]
    # one study report per job: the HTML file, and a markdown artifact that summarises and links it
    report = Path(rows["square"].report or "")
    assert report.is_file() and "MODELED (predicted by the performance model" in report.read_text()
    note = _artifact_table(f"kernsearch-report-{slug(rows['square'].job + ':float16:64x64x64')}", "markdown")
    assert "**MODELED" in note and report.as_uri() in note and "| 1 | `BM=" in note
    assert rows["hang"].report is None and "report" not in rows["hang"].to_json()  # its tune failed: no study

    # a second night with nothing better: the study resumes, the gate refuses, nothing is exported
    again = nightly(job_file=str(farm / "again.toml"), chip="M2 Max")
    assert (again.published, again.rejected, again.failed) == (0, 1, 0)
    for r in again.jobs:
        assert r.outcome == "rejected" and r.old_version == "v1"
        assert r.reason.startswith("not faster than v1 beyond the noise"), r.reason
        assert r.speedup == pytest.approx(1.0)
    assert again.export.to_json() == {"status": "skipped", "reason": "nothing new was published"}
    assert store.versions(ArtifactKey("gemm", "M2-Max", "float16", (64, 64, 64))) == ["v1"]
    table = _artifact_table("kernsearch-nightly-m2-max")  # the latest table is tonight's
    assert [t["outcome"] for t in table] == ["rejected"]
    assert "not faster than v1" in table[0]["reason"] and table[0]["old ms"].endswith("(v1)")

    # GPU work on this machine is serialised by a one-slot Prefect limit, released after the run
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(gpu_limit_name())
    assert limit.limit == 1 and limit.active_slots == 0


@pytest.mark.slow
def test_two_runs_on_one_machine_take_turns_on_the_gpu(prefect_harness, farm: Path) -> None:
    """Two nightly runs at once (say a manual one during the nightly): their tune steps never overlap."""
    from concurrent.futures import ThreadPoolExecutor

    from kernsearch.flows.nightly import nightly

    for name in ("square", "decode"):  # one job per file; the studies exist already, so tuning resumes
        write(farm / f"{name}.toml", only_job(name))
    with ThreadPoolExecutor(2) as pool:
        reports = list(pool.map(lambda n: nightly(job_file=str(farm / f"{n}.toml"), chip="M2 Max"),
                                ("square", "decode")))
    (a,), (b,) = (r.jobs for r in reports)
    assert a.job == "square" and b.job == "decode"
    assert {a.outcome, b.outcome} <= {"published", "rejected"}, (a, b)
    first, second = sorted([a.tune_window, b.tune_window])
    assert first[1] <= second[0], (first, second)  # one GPU slot per machine: the second waited


@pytest.mark.slow
def test_nightly_skips_jobs_for_other_chips(prefect_harness, farm: Path) -> None:
    from kernsearch.flows.nightly import nightly

    report = nightly(job_file=str(farm / "again.toml"), chip="M4 Max")
    assert report.jobs == () and report.export.status == "skipped"


# -- a real Prefect server on 127.0.0.1 ----------------------------------------------------------------------

def _wait(check, timeout: float, what: str, procs: list[subprocess.Popen]):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{what}: {p.args[:4]} exited with {p.returncode}")
        value = check()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.e2e
def test_real_server_serves_the_cron_deployment_and_runs_it_by_name(tmp_path: Path) -> None:
    import httpx
    import prefect_api

    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, **TELEMETRY_OFF, "PREFECT_HOME": str(prefect_api.migrated_home(tmp_path / "prefect-home")),
           "PREFECT_API_URL": api, "PREFECT_UI_ENABLED": "false", "PREFECT_SERVER_UI_ENABLED": "false",
           "KERNSEARCH_HOME": str(tmp_path / "home"), "PREFECT_RUNNER_POLL_FREQUENCY": "2",
           "PREFECT_WORKER_QUERY_SECONDS": "2"}
    # the "square" job only, for two chips: this machine serves M2 Max, no one serves M3 Max
    write(tmp_path / "jobs.toml", only_job("square").replace('chips = ["M2 Max"]', 'chips = ["M2 Max", "M3 Max"]'))
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("server", "serve", "worker")}  # noqa: SIM115
    procs: list[subprocess.Popen] = []
    try:
        server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                  env=env, stdout=logs["server"], stderr=subprocess.STDOUT,
                                  start_new_session=True, cwd=tmp_path)
        procs.append(server)

        def healthy() -> bool:
            try:
                return httpx.get(f"{api}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        _wait(healthy, 180, "the Prefect server", procs)
        serve = subprocess.Popen(KERNSEARCH + ["flows", "serve", str(tmp_path / "jobs.toml"), "--chip", "M2 Max",
                                               "--cron", "0 2 * * *", "--timezone", "Europe/Paris"],
                                 env=env, stdout=logs["serve"], stderr=subprocess.STDOUT, start_new_session=True,
                                 cwd=tmp_path)
        procs.append(serve)
        name = "kernsearch-nightly/nightly-m2-max"

        def deployment() -> dict | None:
            r = prefect_api.get(f"{api}/deployments/name/{name}", timeout=5)
            return r.json() if r.status_code == 200 else None

        dep = _wait(deployment, 180, "the served deployment", procs)
        (schedule,) = dep["schedules"]
        assert schedule["schedule"]["cron"] == "0 2 * * *" and schedule["schedule"]["timezone"] == "Europe/Paris"
        assert schedule["active"] and "chip:m2-max" in dep["tags"]
        assert dep["parameters"] == {"job_file": str(tmp_path / "jobs.toml"), "chip": "M2 Max"}

        trigger = subprocess.run([PREFECT, "deployment", "run", name], env=env, capture_output=True, text=True,
                                 timeout=120)
        assert trigger.returncode == 0, trigger.stdout + trigger.stderr
        run_id = re.search(r"UUID: ([0-9a-f-]{36})", trigger.stdout).group(1)
        runs = prefect_api.post(f"{api}/flow_runs/filter", json={"deployments": {"id": {"any_": [dep["id"]]}}},
                          timeout=10).json()
        manual = [r for r in runs if not r["auto_scheduled"]]
        assert [r["id"] for r in manual] == [run_id]  # the run we triggered by name (cron runs are auto-scheduled)

        def finished() -> dict | None:
            run = prefect_api.get(f"{api}/flow_runs/{run_id}", timeout=5).json()
            return run if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None

        run = _wait(finished, 300, "the triggered flow run", procs)
        assert run["state"]["type"] == "COMPLETED", run["state"]
        assert list((tmp_path / "store" / "gemm" / "M2-Max" / "float16" / "64x64x64").glob("v1/manifest.json"))

        # `kernsearch flows run` against the same server: once, now, no schedule; nothing better tonight
        once = subprocess.run(KERNSEARCH + ["flows", "run", str(tmp_path / "jobs.toml"), "--chip", "M2 Max"],
                              env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert once.returncode == 0, once.stdout[-2000:] + once.stderr[-2000:]
        assert "kernsearch nightly on M2 Max: 0 published, 1 rejected, 0 failed" in once.stdout
        assert "not faster than v1" in once.stdout and "modeled" in once.stdout
        runs = prefect_api.post(f"{api}/flow_runs/filter", json={"flow_runs": {"state": {"type": {"any_": ["COMPLETED"]}}}},
                          timeout=10).json()
        assert len(runs) == 2  # the served run and this one, both recorded by the server

        # work pools: a deployment per chip in pool kernsearch-<chip>; only the M2 Max pool has a worker
        stop(serve)
        assert serve.returncode is not None
        deployed = subprocess.run(KERNSEARCH + ["flows", "deploy", str(tmp_path / "jobs.toml"), "--cron", "0 2 * * *",
                                                "--timezone", "Europe/Paris"],  # as docs/flows.md writes it
                                  env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        pools = {}
        for chip in ("m2-max", "m3-max"):
            dep = prefect_api.get(f"{api}/deployments/name/kernsearch-nightly/nightly-{chip}", timeout=5).json()
            pools[chip] = dep["work_pool_name"]
            assert dep["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
            assert dep["schedules"][0]["schedule"]["timezone"] == "Europe/Paris"
        assert pools == {"m2-max": "kernsearch-m2-max", "m3-max": "kernsearch-m3-max"}
        worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "kernsearch-m2-max", "--limit", "1"],
                                  env=env, stdout=logs["worker"], stderr=subprocess.STDOUT, start_new_session=True,
                                  cwd=tmp_path)
        procs.append(worker)
        ids = {}
        for chip in ("m3-max", "m2-max"):
            t = subprocess.run([PREFECT, "deployment", "run", f"kernsearch-nightly/nightly-{chip}"], env=env,
                               capture_output=True, text=True, timeout=120)
            assert t.returncode == 0, t.stdout + t.stderr
            ids[chip] = re.search(r"UUID: ([0-9a-f-]{36})", t.stdout).group(1)
        run_id = ids["m2-max"]
        run = _wait(finished, 300, "the M2 Max run on its pool's worker", [server, worker])
        assert run["state"]["type"] == "COMPLETED", run["state"]
        m3 = prefect_api.get(f"{api}/flow_runs/{ids['m3-max']}", timeout=5).json()
        assert m3["state"]["type"] == "SCHEDULED"  # no M3 Max worker: the M2 Max worker left it alone
    finally:
        for p in reversed(procs):  # stop every process this test started (and their children)
            stop(p)
        for f in logs.values():
            f.close()
    assert all(p.poll() is not None for p in procs) and not any(alive(p.pid) for p in procs)


def stop(p: subprocess.Popen) -> None:
    """SIGTERM the process group, SIGKILL it if it lingers, and reap the leader."""
    with _suppress():
        os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with _suppress():
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
    with _suppress():
        os.killpg(p.pid, signal.SIGKILL)  # stragglers of the group


def _suppress():  # noqa: ANN202
    import contextlib

    return contextlib.suppress(ProcessLookupError, PermissionError)


@pytest.mark.parametrize(("here", "job_chip", "expected"), [
    ("M2 Max", "M2 Max", "metal"), ("M2 Max", "M3 Max", "model"), ("H100", "H100", "cuda"),
    ("H100", "M2 Max", "model"), ("cpu", "M2 Max", "model"),
])
def test_auto_measures_only_the_chip_that_is_here(here: str, job_chip: str, expected: str) -> None:
    from kernsearch import get_chip
    from kernsearch.flows.nightly import _backend

    assert _backend("auto", get_chip(here), job_chip) == expected
    assert _backend("model", get_chip(here), job_chip) == "model"


def test_publish_is_retried_only_when_the_key_is_busy(tmp_path: Path) -> None:
    """A busy key (typed KeyBusy) is worth a retry; an error whose text merely says "busy" is not."""
    import fcntl

    from test_artifacts import candidate, key

    from kernsearch import ArtifactStore
    from kernsearch.artifacts._manifest import ArtifactError, KeyBusy
    from kernsearch.flows.nightly import _retry_when_busy

    store = ArtifactStore(tmp_path / "store", lock_timeout=0.1)
    store.publish(candidate(median=1.0))
    with open(store.key_dir(key()) / ".lock", "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(KeyBusy) as info:
            store.publish(candidate(median=0.5))

    class State:
        def __init__(self, exc: BaseException) -> None:
            self.exc = exc

        def result(self) -> None:
            raise self.exc

    assert _retry_when_busy(None, None, State(info.value))
    assert not _retry_when_busy(None, None, State(ArtifactError("manifest says the GPU was busy")))

"""Fault tests: planted templates that fail to compile, hang, crash, compute wrong, produce NaN or leave
an output unwritten. Each variant runs on the CPU Metal interpreter in an isolated worker; each trial
must be marked failed with the right reason, the study must complete, and the winner must be correct."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernsearch import FinalRound, StopReason, get_chip, load_family, make_problem, run_study
from kernsearch.studies._objective import KernelObjective

FAMILY = """
name = "planted"
description = "C = 2·A, with planted faults"
reference = "A * 2"
baseline = "A * 2"

[problem]
dims = ["N"]
default_shape = [64]
dtypes = ["float32"]
default_dtype = "float32"
flops = "N"
bytes = "2 * N * dtype_size"

[[inputs]]
name = "A"
shape = "[N]"

[[outputs]]
name = "C"
shape = "[N]"

[templates]
metal = "planted.metal.j2"

[knobs.FAULT]
kind = "other"
values = ["compile", "hang", "crash", "wrong", "nan", "unwritten", "none"]

[knobs.TG]
kind = "threadgroup_size"
values = [32, 64]

[launch]
grid = "[N, 1, 1]"
threadgroup = "[TG, 1, 1]"

[default]
FAULT = "compile"
TG = 32

[tolerance.float32]
rtol = 1e-6
atol = 1e-6
"""

TEMPLATE = """
{% block header %}
#include <metal_stdlib>
using namespace metal;
{% endblock %}
{% block source %}
    uint i = thread_position_in_grid.x;
    if (i >= A_shape[0]) return;
{% if FAULT == "compile" %}
    C[i] = undefined_name * A[i];
{% elif FAULT == "hang" %}
    float x = A[i];
    while (x < 1.0e30f) {
        x = x * 1.0f;
        C[i] = x;
    }
{% elif FAULT == "crash" %}
    device float* p = (device float*)16;
    p[i] = A[i];
    C[i] = T(2) * A[i];
{% elif FAULT == "wrong" %}
    C[i] = T(3) * A[i];
{% elif FAULT == "ragged" %}
    C[i] = (A_shape[0] % {{ TG }} == 0) ? T(2) * A[i] : T(3) * A[i];
{% elif FAULT == "nan" %}
    C[i] = (i == 5) ? T(sqrt(A[i] - 2.0f)) : T(2) * A[i];
{% elif FAULT == "unwritten" %}
    if (i != 5) C[i] = T(2) * A[i];
{% else %}
    C[i] = T(2) * A[i];
{% endif %}
{% endblock %}
"""

EXPECTED = {"compile": "compile", "hang": "timeout", "crash": "crash", "wrong": "wrong", "nan": "nan",
            "unwritten": "unwritten"}


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("families") / "planted"
    folder.mkdir()
    (folder / "family.toml").write_text(textwrap.dedent(FAMILY))
    (folder / "planted.metal.j2").write_text(textwrap.dedent(TEMPLATE).lstrip())
    return folder


@pytest.fixture(scope="module")
def planted_ragged(tmp_path_factory) -> Path:
    """The planted family with one more fault: wrong only where the size is not a multiple of TG."""
    folder = tmp_path_factory.mktemp("families") / "planted"
    folder.mkdir()
    spec = textwrap.dedent(FAMILY).replace('"unwritten", "none"]', '"unwritten", "ragged", "none"]')
    assert '"ragged"' in spec
    (folder / "family.toml").write_text(spec)
    (folder / "planted.metal.j2").write_text(textwrap.dedent(TEMPLATE).lstrip())
    return folder


@pytest.fixture(scope="module")
def study_of_faults(planted, tmp_path_factory):
    """Every config of the planted family, each verified on the interpreter (model times: all equal)."""
    chip = get_chip("M2 Max")
    problem = make_problem(load_family(planted), "64", None, chip)
    objective = KernelObjective(problem, chip, "model", verify="all", timeout=6.0)
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'faults.db'}"
    result = run_study(objective, trials=14, sampler="grid", seed=0, storage=url)
    import optuna

    return result, optuna.load_study(study_name=result.study_name, storage=url)


@pytest.mark.slow
def test_each_planted_fault_fails_its_trial_with_the_right_reason(study_of_faults):
    result, study = study_of_faults
    assert result.evaluated == 14 and result.stop_reason == "every valid config evaluated"
    assert result.stop.reason is StopReason.EXHAUSTED
    seen = {}
    for t in study.trials:
        if t.user_attrs.get("status") in ("ok", "failed"):
            fault = t.user_attrs["config"]["FAULT"]
            seen[(fault, t.user_attrs["config"]["TG"])] = t.user_attrs.get("failure", {}).get("reason", "ok")
    assert len(seen) == 14
    for (fault, _), reason in seen.items():
        assert reason == EXPECTED.get(fault, "ok"), (fault, reason)
    assert result.failures == {reason: 2 for reason in EXPECTED.values()}


def test_the_study_completes_and_its_winner_is_correct(study_of_faults):
    result, study = study_of_faults
    assert result.best is not None and result.best.config["FAULT"] == "none"
    assert result.best.verified == "interpreter" and result.best.max_abs_err == 0.0
    assert result.evidence == "modeled" and result.best.evidence == "modeled"
    checks = result.final.checks
    assert checks and all(c.ok for c in checks.values())  # the finalists passed the interpreter again
    assert result.final.winner == result.best.number


@pytest.mark.slow
def test_finalist_verification_skips_a_faulty_leader(planted, tmp_path):
    """verify=finalists: faults are not checked per trial, so a broken variant can lead on predicted
    time; the final round on the interpreter must refuse it and crown a correct one."""
    chip = get_chip("M2 Max")
    problem = make_problem(load_family(planted), "64", None, chip)
    objective = KernelObjective(problem, chip, "model", verify="finalists", timeout=6.0)
    pair = [{"FAULT": "wrong", "TG": 32}, {"FAULT": "none", "TG": 64}]  # the only configs left valid
    objective.valid_configs = lambda: pair  # type: ignore[method-assign]
    objective.violation = lambda c: None if c in pair else "not_in_this_test"  # type: ignore[method-assign]
    objective.default = lambda: None  # type: ignore[method-assign]
    result = run_study(objective, trials=2, sampler="grid", seed=0, storage=f"sqlite:///{tmp_path / 'f.db'}")
    assert {str(t.config) for t in result.top} == {str(c) for c in pair}  # both led on (equal) predicted time
    wrong = [n for n, c in result.final.checks.items() if not c.ok]
    assert len(wrong) == 1 and result.final.checks[wrong[0]].reason == "wrong"
    assert result.best.config["FAULT"] == "none" and result.best.number == result.final.winner


# -- the measured pipeline, end to end, on a simulated GPU -------------------------------------------------
# No GPU here: this back-end verifies on the CPU interpreter (the exact Metal source) and "runs" each launch
# on a virtual clock, for a time that depends on the threadgroup size, so the whole measured path is
# exercised deterministically: worker, verification before timing, batching, the final round interleaved
# with the baseline op, and the judgement.

from kernsearch import get_backend as _get_backend
from kernsearch.backends import Evidence as _Evidence
from kernsearch.backends._base import BaseBackend as _BaseBackend
from kernsearch.backends._base import Timing as _Timing

_COST_MS = {32: 2.0, 64: 1.0}  # threadgroup size -> simulated kernel time
_BASELINE_MS = 3.0


class SimulatedGPU(_BaseBackend):
    name = "simulated"
    evidence = _Evidence.MEASURED
    target = "metal"
    times_as_consumers = True

    def __init__(self) -> None:
        self.cpu = _get_backend("cpu")
        self.now_ms = 0.0

    def clock(self) -> float:  # the timing method reads this instead of the wall clock
        return self.now_ms / 1e3

    def run(self, kernel, geometry, inputs, dtype, init_value=float("nan"), **options):
        return self.cpu.run(kernel, geometry, inputs, dtype, init_value=init_value, timeout=3.0)

    def precompile(self, kernel, geometry, shapes, dtype):  # the compile worker's check: build and run it once
        import numpy as np

        self.cpu.run(kernel, geometry, [np.zeros(s) for s in shapes], dtype, timeout=3.0)
        return False

    def _launcher(self, ms):
        def launch(i):
            self.now_ms += ms

        def sync():
            self.now_ms += 0.05

        return launch, sync

    def launcher(self, kernel, geometry, inputs, dtype, sets=None):
        return self._launcher(_COST_MS[geometry.threadgroup[0]])

    def baseline_launcher(self, family, problem, logical, sets=None):
        return self._launcher(_BASELINE_MS)

    # as consumers call it (the final round): the same simulated costs, one eval per graph or per call
    def _call(self, ms):
        def call(i, previous=None):
            self.now_ms += ms

        return call

    def consumer_kernel(self, kernel, geometry, family, problem, sets):
        return self._call(_COST_MS[geometry.threadgroup[0]])

    def consumer_op(self, family, problem, sets):
        return self._call(_BASELINE_MS)

    def evaluate(self, outputs):
        self.now_ms += 0.002

    def sync(self):
        self.now_ms += 0.05

    def time(self, kernel, geometry, inputs, dtype, **options):
        from kernsearch.evaluation._measure import measure

        launch, sync = self.launcher(kernel, geometry, inputs, dtype)
        return _Timing(measure(launch, sync, clock=self.clock), self.evidence, 0.0)


@pytest.mark.slow
def test_measured_pipeline_verifies_times_and_judges_against_the_baseline(planted, tmp_path):
    chip = get_chip("M2 Max")
    problem = make_problem(load_family(planted), "64", None, chip)
    # every config timed to the end (racing would stop the 2 ms one against the 1 ms incumbent: tests/test_racing.py)
    objective = KernelObjective(problem, chip, "test_faults:SimulatedGPU", timeout=30.0, racing=False)
    allowed = [{"FAULT": f, "TG": tg} for f in ("none", "wrong") for tg in (32, 64)]
    objective.valid_configs = lambda: allowed  # type: ignore[method-assign]
    objective.violation = lambda c: None if c in allowed else "not_in_this_test"  # type: ignore[method-assign]
    objective.default = lambda: None  # type: ignore[method-assign]
    result = run_study(objective, trials=4, sampler="grid", finalists=2, seed=0,
                       storage=f"sqlite:///{tmp_path / 'm.db'}")
    assert result.failures == {"wrong": 2}  # verified before timing: wrong variants are never timed
    assert [t.config for t in result.top] == [{"FAULT": "none", "TG": 64}, {"FAULT": "none", "TG": 32}]
    best = result.best
    assert best.config == {"FAULT": "none", "TG": 64} and best.evidence == "measured" and best.verified == "device"
    # timed as consumers call it: 8 calls per graph, one eval and one 0.05 ms sync per graph (0.7 % of a 1 ms kernel)
    assert 1.0 <= best.time_ms <= 1.01 and result.top[1].time_ms == pytest.approx(2.0, rel=1e-2)
    final = result.final
    assert final.winner == best.number and final.lead_exceeds_noise and final.beats_baseline
    # the final round times calls as consumers make them: 8 calls and one evaluation per graph (its 0.05 ms sync
    # spread over 8 calls), or an evaluation after every call (eager): 3.0x in graph use, 2.9x eager
    f = final.figures
    assert f.speedup == pytest.approx(3.0, rel=1e-2)
    assert set(f.modes) == {"graph", "eager"} and f.modes["eager"].speedup == pytest.approx(3.0, rel=5e-2)
    # the bound acted on: the interval of the median per-round ratio of the paired rounds, decided at the first look
    from kernsearch._rules import consumer_low, looks

    assert all(len(m.ratios) == looks()[0] for m in f.modes.values())
    assert f.speedup_low == consumer_low(f.consumer())


@pytest.mark.slow
def test_pipelined_search_compiles_ahead_and_a_fault_fails_only_its_trial(planted, tmp_path):
    """Two workers each compile a proposal and then time it, one timing at a time; a variant that fails to
    compile, hangs or crashes in its worker fails its own trial, is never timed, and frees the worker."""
    chip = get_chip("M2 Max")
    problem = make_problem(load_family(planted), "64", None, chip)
    objective = KernelObjective(problem, chip, "test_faults:SimulatedGPU", timeout=8.0, compile_workers=2)
    objective.default = lambda: None  # type: ignore[method-assign]
    assert objective.lookahead() == 2  # one config per worker: it compiles it, then times it
    url = f"sqlite:///{tmp_path / 'p.db'}"
    result = run_study(objective, trials=14, sampler="grid", finalists=2, seed=0, storage=url)
    assert result.evaluated == 14 and result.stop_reason == "every valid config evaluated"
    assert result.failures == {reason: 2 for reason in EXPECTED.values()}
    assert result.best is not None and result.best.config == {"FAULT": "none", "TG": 64}
    import optuna

    trials = optuna.load_study(study_name=result.study_name, storage=url).trials
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    timed = [t for t in trials if t.user_attrs.get("status") == "ok"]
    assert {t.user_attrs["config"]["FAULT"] for t in timed} == {"none"}


@pytest.mark.slow
def test_a_measured_winner_wrong_at_a_ragged_shape_is_refused_and_the_next_fastest_wins(planted_ragged, tmp_path):
    """Trials verify on the device at the tuned shape only (64: a multiple of every TG): a variant wrong where
    the size is not a multiple of its threadgroup passes them and is the fastest. The final round runs the
    finalists on the device at a ragged shape too, fastest first: it refuses that one and crowns the next."""
    chip = get_chip("M2 Max")
    problem = make_problem(load_family(planted_ragged), "64", None, chip)
    objective = KernelObjective(problem, chip, "test_faults:SimulatedGPU", timeout=30.0, racing=False)
    allowed = [{"FAULT": "ragged", "TG": 64}, {"FAULT": "none", "TG": 32}]
    objective.valid_configs = lambda: allowed  # type: ignore[method-assign]
    objective.violation = lambda c: None if c in allowed else "not_in_this_test"  # type: ignore[method-assign]
    objective.default = lambda: None  # type: ignore[method-assign]
    result = run_study(objective, trials=2, sampler="grid", finalists=2, seed=0,
                       storage=f"sqlite:///{tmp_path / 'r.db'}")
    assert not result.failures  # both pass the trials' check at 64
    assert [t.config for t in result.top] == allowed  # the ragged-wrong one is the fastest (1 ms vs 2 ms)
    fastest, correct = (t.number for t in result.top)
    final = result.final
    assert final.verified_on == "device" and final.verify_shape == (64,)
    assert not final.checks[fastest].ok and final.checks[fastest].reason == "wrong"
    assert final.checks[correct].ok and final.checks[correct].also == ("63",)  # odd: off every tile
    assert final.winner == correct and result.best.config == {"FAULT": "none", "TG": 32}
    assert final.figures.speedup == pytest.approx(1.5, rel=3e-3) and final.beats_baseline  # 3 ms op / 2 ms kernel
    assert final.verdict(fastest) == "FAIL (wrong)" and final.verdict(correct) == "device"
    stored = final.to_dict()
    assert stored["verified_on"] == "device" and "baseline" not in stored
    assert FinalRound.from_dict(stored) == final

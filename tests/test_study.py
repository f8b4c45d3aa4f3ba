"""The study loop on a small synthetic objective: budgets, rejection before compiling, no re-measuring,
failures recorded and survived, resume, samplers, and the result's shape."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kernsearch import KernsearchError, Stop, StopReason, run_study
from kernsearch._errors import VariantFailure
from kernsearch.studies._storage import study_name_for
from kernsearch.studies._study import Objective, Record, parse_duration


class Toy(Objective):
    """x, y in 0..9; x + y > 15 is invalid; x == 0 fails to "compile"; fastest at (7, 3)."""

    backend = "toy"
    evidence = "measured"

    def __init__(self, fail_x0: bool = True) -> None:
        self.calls: Counter[str] = Counter()
        self.fail_x0 = fail_x0

    @property
    def knobs(self):
        return {"x": list(range(10)), "y": list(range(10))}

    @property
    def study_key(self):
        return {"family": "toy", "chip": "none", "dtype": "float32", "shape": "1", "backend": "toy"}

    def violation(self, config):
        return "sum_at_most_15" if config["x"] + config["y"] > 15 else None

    def valid_configs(self):
        return [{"x": x, "y": y} for x in range(10) for y in range(10) if x + y <= 15]

    def default(self):
        return {"x": 1, "y": 1}

    def evaluate(self, config):
        key = f"{config['x']},{config['y']}"
        self.calls[key] += 1
        assert self.violation(config) is None, "an invalid config reached evaluate"
        if self.fail_x0 and config["x"] == 0:
            raise VariantFailure("compile", "planted")
        t = 1.0 + (config["x"] - 7) ** 2 + (config["y"] - 3) ** 2
        return Record(t, self.evidence, [t])


def storage(tmp_path):
    return f"sqlite:///{tmp_path / 'studies.db'}"


@pytest.mark.slow
def test_default_config_is_trial_zero_and_nothing_is_measured_twice(tmp_path):
    toy = Toy()
    result = run_study(toy, trials=40, seed=1, storage=storage(tmp_path))
    assert result.evaluated == 40
    assert max(toy.calls.values()) == 1, "a config was measured twice"
    assert sum(toy.calls.values()) == 40
    import optuna

    study = optuna.load_study(study_name=result.study_name, storage=storage(tmp_path))
    first = min(study.trials, key=lambda t: t.number)
    assert first.user_attrs["config"] == {"x": 1, "y": 1} and first.user_attrs["status"] == "ok"
    statuses = Counter(t.user_attrs.get("status") for t in study.trials)
    assert statuses["ok"] + statuses["failed"] == 40
    for t in study.trials:  # invalid proposals are rejected with the constraint's name, never evaluated
        if t.user_attrs.get("status") == "invalid":
            assert t.user_attrs["failure"]["reason"] == "sum_at_most_15"


@pytest.mark.slow
def test_failures_are_recorded_with_their_reason_and_the_search_goes_on(tmp_path):
    toy = Toy()
    result = run_study(toy, trials=91, sampler="grid", seed=0, storage=storage(tmp_path))
    # 91 valid configs: the grid covers them all, the ten with x == 0 fail to compile
    assert result.evaluated == 91 and result.failures == Counter({"compile": 10})
    assert result.best.config == {"x": 7, "y": 3} and result.best.time_ms == 1.0
    assert all(t.config["x"] != 0 for t in result.top)
    assert result.stop.reason is StopReason.BUDGET and result.stop_reason == "trial budget reached"
    data = result.to_dict()  # as `tune --json` prints it: the stop's text, the final round's stored form
    assert list(data) == ["study_name", "storage", "backend", "evidence", "key", "best", "top", "evaluated",
                          "failures", "invalid", "elapsed_s", "stop_reason", "final", "overhead_s_per_trial"]
    assert data["stop_reason"] == "trial budget reached" and data["failures"] == {"compile": 10}
    assert data["final"] == {"winner": result.best.number} and data["best"]["config"] == {"x": 7, "y": 3}


@pytest.mark.slow
def test_tpe_beats_a_third_of_the_space_and_records_figures(tmp_path):
    result = run_study(Toy(), trials=30, seed=3, storage=storage(tmp_path))
    assert result.best.time_ms <= 3.0, result.best  # top few of 91 configs within a third of the space
    assert result.best.evidence == "measured"
    assert [t.time_ms for t in result.top] == sorted(t.time_ms for t in result.top)


@pytest.mark.slow
def test_resume_continues_the_same_study(tmp_path):
    first = run_study(Toy(), trials=10, seed=0, storage=storage(tmp_path))
    toy = Toy()
    second = run_study(toy, trials=25, seed=1, storage=storage(tmp_path))
    assert second.study_name == first.study_name == study_name_for(Toy().study_key)
    assert second.evaluated == 25 and sum(toy.calls.values()) == 15  # only the 15 new ones measured
    again = run_study(Toy(), trials=25, seed=2, storage=storage(tmp_path))
    assert second.stop == Stop(StopReason.BUDGET) and second.stop_reason == "trial budget reached"
    assert again.stop == Stop(StopReason.BUDGET, before_run=True, evaluated=25)
    assert again.evaluated == 25 and again.stop_reason.startswith("trial budget reached: the study already has 25")
    assert "--trials 75 evaluates 50 more" in again.stop_reason  # how to go on, not just "budget reached"


@pytest.mark.slow
def test_stop_request_keeps_finished_trials(tmp_path):
    toy = Toy()
    result = run_study(toy, trials=50, seed=0, storage=storage(tmp_path), stop=lambda: sum(toy.calls.values()) >= 7)
    assert result.evaluated == 7 and result.stop.reason is StopReason.STOPPED and result.stop.reason.by_request
    assert result.stop_reason == "stopped (Ctrl-C or a stop request); finished trials are kept"
    resumed = run_study(Toy(), trials=12, seed=0, storage=storage(tmp_path))
    assert resumed.evaluated == 12


@pytest.mark.slow
def test_a_stop_during_a_pipelined_evaluation_counts_it_and_frees_the_queued_proposals(tmp_path):
    """A pipelined objective (proposals queued ahead of the one evaluated, the evaluation in a thread) asked to stop
    while an evaluation runs: that evaluation finishes and counts, the proposals still queued were never evaluated and
    are recorded as cancelled (their configs stay free: not evaluated, asked for again by a resumed search)."""
    import time

    import optuna

    class Pipelined(Toy):
        def lookahead(self) -> int:
            return 3

        def evaluate(self, config):
            self.calls["started"] += 1
            time.sleep(0.2)  # still in flight when the loop checks the stop request
            return super().evaluate(config)

    toy = Pipelined(fail_x0=False)
    url = storage(tmp_path)
    result = run_study(toy, trials=30, seed=0, sampler="random", storage=url, stop=lambda: toy.calls["started"] >= 3)
    assert result.stop.reason is StopReason.STOPPED and result.evaluated == 3 == toy.calls["started"]
    trials = optuna.load_study(study_name=result.study_name, storage=url).trials
    cancelled = [t for t in trials if t.user_attrs.get("status") == "cancelled"]
    assert cancelled and all(t.state == optuna.trial.TrialState.PRUNED for t in cancelled)
    evaluated = {str(t.user_attrs["config"]) for t in trials if t.user_attrs.get("status") == "ok"}
    assert len(evaluated) == 3 and not evaluated & {str(t.user_attrs["config"]) for t in cancelled}
    resumed = run_study(Toy(fail_x0=False), trials=6, seed=0, sampler="random", storage=url)
    assert resumed.evaluated == 6


def test_keyboard_interrupt_inside_a_trial_keeps_the_others(tmp_path):
    class Interrupted(Toy):
        def evaluate(self, config):
            if sum(self.calls.values()) == 5:
                self.calls["interrupt"] += 1
                raise KeyboardInterrupt
            return super().evaluate(config)

    result = run_study(Interrupted(fail_x0=False), trials=20, seed=0, storage=storage(tmp_path))
    assert result.stop.reason is StopReason.INTERRUPTED and result.stop.reason.by_request
    assert result.stop_reason == "interrupted (Ctrl-C); finished trials are kept" and result.evaluated == 5
    assert result.final is None  # no final round after an interrupt: the leader is the best
    resumed = run_study(Toy(fail_x0=False), trials=8, seed=0, storage=storage(tmp_path))
    assert resumed.evaluated == 8  # the interrupted config is not counted as evaluated


def test_patience_and_time_budget_stop_early(tmp_path):
    result = run_study(Toy(), trials=91, patience=5, seed=0, sampler="random", storage=":memory:")
    assert result.stop_reason == "no improvement in 5 trials" and result.evaluated < 91
    assert result.stop == Stop(StopReason.PATIENCE, patience=5) and not result.stop.reason.by_request
    timed = run_study(Toy(), trials=None, time_budget=0.0, storage=":memory:")
    assert timed.stop_reason == "time budget reached" and timed.evaluated == 0
    assert timed.stop.reason is StopReason.TIME_BUDGET


def test_patience_spent_before_the_run_says_how_to_go_on(tmp_path):
    first = run_study(Toy(), trials=91, patience=5, seed=0, sampler="random", storage=storage(tmp_path))
    again = run_study(Toy(), trials=91, patience=5, seed=0, sampler="random", storage=storage(tmp_path))
    assert again.evaluated == first.evaluated and again.stop == Stop(StopReason.PATIENCE, 5, before_run=True)
    assert again.stop_reason == ("no improvement in 5 trials (before this run started: to search on, raise "
                                 "--patience, or 0 for no early stop)")


def test_run_study_takes_an_objective():
    with pytest.raises(TypeError, match="kernsearch.tune"):
        run_study("gemm", trials=1)  # type: ignore[arg-type]


def test_a_study_for_another_space_is_refused(tmp_path):
    run_study(Toy(), trials=2, storage=storage(tmp_path), study_name="shared")

    class Other(Toy):
        @property
        def knobs(self):
            return {"x": list(range(5)), "y": list(range(10))}

    with pytest.raises(KernsearchError, match="another space"):
        run_study(Other(), trials=2, storage=storage(tmp_path), study_name="shared")


def test_a_study_for_another_problem_is_refused(tmp_path):
    run_study(Toy(), trials=2, storage=storage(tmp_path), study_name="shared")

    class OtherShape(Toy):
        @property
        def study_key(self):
            return {**super().study_key, "shape": "128"}

    with pytest.raises(KernsearchError, match="shape '1' \\(asked: '128'\\)"):
        run_study(OtherShape(), trials=2, storage=storage(tmp_path), study_name="shared")


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("10m", 600), ("1h30m", 5400), ("2.5", 2.5)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "ten minutes", "5x"])
def test_bad_durations_are_user_errors(text):
    with pytest.raises(KernsearchError):
        parse_duration(text)


def test_unknown_sampler_and_bad_storage_are_user_errors(tmp_path):
    with pytest.raises(KernsearchError, match="unknown sampler"):
        run_study(Toy(), trials=1, sampler="anneal", storage=":memory:")
    with pytest.raises(KernsearchError, match="storage"):
        run_study(Toy(), trials=1, storage="nosuchdb://x")


def test_random_fill_only_returns_valid_configs():
    toy = Toy()
    rng = random.Random(0)
    assert all(toy.violation(toy.random_config(rng)) is None for _ in range(50))


def test_a_bug_in_evaluation_surfaces_and_leaves_no_running_trial(tmp_path):
    class Buggy(Toy):
        def evaluate(self, config):
            if sum(self.calls.values()) == 3:
                raise TypeError("a bug in kernsearch")
            return super().evaluate(config)

    with pytest.raises(TypeError):
        run_study(Buggy(fail_x0=False), trials=10, seed=0, storage=storage(tmp_path))
    import optuna

    study = optuna.load_study(study_name=study_name_for(Toy().study_key), storage=storage(tmp_path))
    assert all(t.state != optuna.trial.TrialState.RUNNING for t in study.trials)
    assert Counter(t.user_attrs.get("status") for t in study.trials)["error"] == 1


def test_a_modeled_search_for_an_nvidia_chip_ranks_its_cuda_kernel_unverified():
    from kernsearch import get_chip, load_family, make_problem
    from kernsearch.studies._objective import KernelObjective

    h100, m2 = get_chip("H100"), get_chip("M2 Max")
    fam = load_family("gemm")
    nvidia = KernelObjective(make_problem(fam, "64,64,64", "float16", h100), h100, "model")
    apple = KernelObjective(make_problem(fam, "64,64,64", "float16", m2), m2, "model")
    assert (nvidia.target, nvidia.verify) == ("cuda", "none")  # the interpreter runs Metal only
    assert (apple.target, apple.verify) == ("metal", "finalists")


class Judged(Toy):
    """A Toy whose final round verifies the leaders (as the interpreter does), counting each round, with a model
    ranking (a prior) the default sampler needs the whole valid set for."""

    def __init__(self) -> None:
        super().__init__(fail_x0=False)
        self.rounds = 0
        self.ranked = 0

    def prior(self, configs):
        self.ranked += 1
        return [1.0 + (c["x"] - 7) ** 2 + (c["y"] - 3) ** 2 for c in configs]

    def finalize(self, top):
        from kernsearch.studies._final import FinalistCheck, FinalRound

        self.rounds += 1
        return FinalRound(top[0].number, verified_on="interpreter", verify_shape=(1,),
                          checks={t.number: FinalistCheck(True, 0.0, (1,)) for t in top})


@pytest.mark.slow
def test_a_finished_study_run_again_redoes_no_final_round_and_no_ranking(tmp_path):
    """Issue 24: running a finished study again cost 51 s re-verifying its finalists (and ranking the space)."""
    first = Judged()
    done = run_study(first, trials=12, seed=0, storage=storage(tmp_path))
    assert first.rounds == 1 and first.ranked == 1 and done.final is not None
    again = Judged()
    result = run_study(again, trials=12, seed=0, storage=storage(tmp_path))
    assert result.stop.before_run and sum(again.calls.values()) == 0
    assert again.rounds == 0 and again.ranked == 0  # the stored round stands: same leaders, nothing new
    assert result.final is not None and result.final.winner == done.final.winner
    assert result.final.checks == done.final.checks and "nothing new was evaluated" in (result.final.note or "")
    more = Judged()  # a bigger budget evaluates new configs: the leaders are judged again
    run_study(more, trials=16, seed=0, storage=storage(tmp_path))
    assert more.rounds == 1 and sum(more.calls.values()) == 4

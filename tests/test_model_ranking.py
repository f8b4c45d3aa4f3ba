"""Can the performance model rank a space (issue 25), and which of its tied configs wins (issue 24)?

A family the model predicts flat (no [model]: a roofline, the same for every config) gets a "cannot rank"
message: `tune` prints it, the study stores it (the report and `show` print it), and on the model back-end
the search stops with that reason after the default config and the model's pick, instead of running out of
patience. Configs the model ties (rmsnorm's DRAM floor) are ordered by headroom (modeled on-core time), then
by trial: the winner is no longer whichever tied config the search happened to see first."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernsearch import StopReason, get_chip, load_family, make_problem, run_study
from kernsearch.studies._objective import KernelObjective
from kernsearch.studies._ranking import FLAT_SHARE, Prediction, ranking

FIXTURE = Path(__file__).parent / "families" / "residual_rmsnorm"
M2MAX = get_chip("M2 Max")


@pytest.fixture(scope="module")
def flat_family(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture without its [model] table: what a user's family looks like before one is written."""
    folder = tmp_path_factory.mktemp("flat") / "residual_rmsnorm"
    shutil.copytree(FIXTURE, folder)
    spec = (folder / "family.toml").read_text()
    start, end = spec.index("\n[model]\n"), spec.index("\n[default]\n")
    (folder / "family.toml").write_text(spec[:start] + spec[end:])
    assert not load_family(folder).model
    return folder


def test_a_space_is_flat_when_most_configs_tie_with_the_best() -> None:
    tied = ranking([Prediction(1.0, 0.5)] * 6 + [Prediction(1.005, 0.5)] + [Prediction(2.0, 1.0)] * 3)
    assert (tied.configs, tied.tied, tied.flat) == (10, 7, True)
    spread = ranking([Prediction(1.0 + i / 10, 0.5) for i in range(10)])
    assert spread.tied == 1 and not spread.flat
    assert not ranking([Prediction(1.0, 1.0)]).flat  # one config: nothing to rank
    assert FLAT_SHARE == 0.5 and ranking([Prediction(1.0, 1.0)] * 5 + [Prediction(3.0, 1.0)] * 5).flat
    text = ranking([Prediction(0.026, 0.0)] * 61, roofline=True).text()
    assert text.startswith("the performance model cannot rank this space: 61 of 61 valid configs are predicted "
                           "within 1% of the best (0.026 ms; the family has no [model] table")


def test_a_family_without_a_model_cannot_be_ranked_and_says_so(flat_family: Path) -> None:
    problem = make_problem(load_family(flat_family), "64,512", "float16", M2MAX)
    modeled = KernelObjective(problem, M2MAX, "model", verify="none")
    message = modeled.unrankable()
    assert message is not None and "cannot rank this space: 45 of 45 valid configs" in message
    assert modeled.prior(modeled.valid_configs()) is None  # a flat prior is no guidance
    assert "the search evaluates the default config and the model's 3 picks" in modeled.model_note()
    with_model = KernelObjective(make_problem(load_family(FIXTURE), "64,4096", "float16", M2MAX), M2MAX, "model",
                                 verify="none")
    assert with_model.unrankable() is None and with_model.model_note() is None
    assert with_model.prior(with_model.valid_configs()) is not None


@pytest.mark.slow
def test_a_modeled_search_of_a_flat_space_stops_with_that_reason(flat_family: Path, tmp_path: Path) -> None:
    problem = make_problem(load_family(flat_family), "64,512", "float16", M2MAX)
    objective = KernelObjective(problem, M2MAX, "model", verify="none")
    url = f"sqlite:///{tmp_path / 'flat.db'}"
    result = run_study(objective, trials=150, patience=60, seed=0, storage=url)
    assert result.stop.reason is StopReason.UNRANKABLE and "cannot rank this space" in result.stop_reason
    # the default config and the model's 3 picks: equal roofline times, so the configs nearest the default (the
    # default itself and two one knob away): what a whole search would have ranked first
    assert result.evaluated == 3 and result.best.config == {"TG": 256, "ROWS": 1, "VEC": 4}
    assert all(sum(t.config[k] != v for k, v in result.best.config.items()) <= 1 for t in result.top)
    import optuna

    stored = optuna.load_study(study_name=result.study_name, storage=url).user_attrs
    assert stored["cannot_rank"] == result.stop_reason
    again = run_study(KernelObjective(problem, M2MAX, "model", verify="none"), trials=150, seed=0, storage=url)
    assert again.stop.reason is StopReason.UNRANKABLE and again.stop.before_run and again.evaluated == 3
    fixture = KernelObjective(make_problem(load_family(FIXTURE), "512,2048", "float16", M2MAX), M2MAX, "model",
                              verify="none")  # with [model]: 36 of 45 configs at the DRAM floor
    assert "36 of 45 valid configs" in fixture.unrankable() and "[model] puts them at the same bound" in \
        fixture.unrankable()
    assert fixture.model_ranking()[1] == fixture.warm_start()  # its picks: the most headroom under the floor
    verified = KernelObjective(problem, M2MAX, "model", verify="all")  # every trial a correctness check: go on
    assert verified.unrankable() is None and "goes on only to verify configs" in verified.model_note()


def test_configs_the_model_ties_are_ordered_by_headroom_not_by_trial() -> None:
    """rmsnorm at 4096x4096 on M2 Max: 138 configs predicted at exactly the DRAM floor (0.1728 ms). Evaluated in
    the worst order (least headroom first), the study's leader is still the one with the least on-core work."""
    from kernsearch.studies._ranking import predict

    problem = make_problem(load_family("rmsnorm"), None, "float16", M2MAX)
    objective = KernelObjective(problem, M2MAX, "model", verify="none")
    assert objective.unrankable() is None  # rmsnorm's model ranks its space: the search runs as before
    valid = objective.valid_configs()
    predictions = predict(objective.space, valid)
    best = min(p.time_ms for p in predictions)
    tied = [(p, c) for p, c in zip(predictions, valid) if p.time_ms == best]
    assert len(tied) >= 10 and len({p.tie_break for p, _ in tied}) >= 5
    doc = " ".join((Path(__file__).resolve().parents[1] / "docs" / "model.md").read_text().split())
    assert f"has {len(tied)} configs at exactly the same predicted time" in doc  # docs/model.md says how many
    distinct = {f"{p.tie_break:.6g}": c for p, c in tied}  # as a trial's record stores it (6 digits)
    order = [distinct[k] for k in sorted(distinct, key=float, reverse=True)][:10]  # least headroom first
    objective.valid_configs = lambda: order  # type: ignore[method-assign]
    objective.violation = lambda c: None if c in order else "not_in_this_test"  # type: ignore[method-assign]
    objective.default = lambda: order[0]  # type: ignore[method-assign]
    result = run_study(objective, trials=10, sampler="grid", seed=0, storage=":memory:")
    assert result.evaluated == 10 and len({t.time_ms for t in result.top}) == 1  # a tie, exactly
    assert result.best.config == order[-1] and result.best.number != 0  # the most headroom, not trial 0


@pytest.mark.slow
def test_tune_show_and_the_report_say_the_model_cannot_rank_a_flat_family(flat_family: Path, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    env_home = {"KERNSEARCH_HOME": str(tmp_path / "home")}
    run = lambda *a: subprocess.run([sys.executable, "-m", "kernsearch", *a], capture_output=True, text=True,  # noqa: E731
                                    timeout=600, cwd=tmp_path, env={**__import__("os").environ, **env_home})
    tune = run("tune", str(flat_family), "--shape", "64,512", "--time-budget", "60s", "--storage", db, "--report")
    assert tune.returncode == 0, tune.stderr
    assert "cannot rank this space: 45 of 45 valid configs" in " ".join(tune.stderr.split())  # before the search
    assert "3 configs evaluated" in tune.stdout and "no improvement" not in tune.stdout + tune.stderr
    assert "the family has no [model] table" in tune.stdout  # the stop reason, markup-safe
    report = Path(tune.stderr.strip().splitlines()[-1].removeprefix("report: "))
    html = report.read_text()
    assert "cannot rank this space: 45 of 45 valid configs" in html
    from kernsearch.artifacts._manifest import MODELED_POLICY

    assert MODELED_POLICY in html.replace("&#x27;", "'")
    show = run("show", "residual_rmsnorm/M2 Max/float16/64x512/model", "--storage", db)
    assert show.returncode == 0 and "cannot rank this space" in show.stdout, show.stderr


def test_percent_of_peak_is_of_the_roofline_bandwidth_for_a_memory_bound_kernel() -> None:
    from kernsearch.studies._objective import roofline, roofline_pct

    fixture = make_problem(load_family(FIXTURE), "64,4096", "float16", M2MAX)
    assert roofline(M2MAX, fixture)[1] == "DRAM bandwidth"
    at_bandwidth_ms = fixture.bytes() / (M2MAX.memory_bandwidth_gbs * 1e9) * 1e3
    assert roofline_pct(M2MAX, fixture, 2 * at_bandwidth_ms) == pytest.approx(50.0)  # not ~1 % of the FLOP peak
    gemm = make_problem(load_family("gemm"), "4096,4096,4096", "float16", M2MAX)
    at_peak_ms = gemm.flops() / (M2MAX.peak_tflops("float16") * 1e12) * 1e3
    assert roofline(M2MAX, gemm)[1] == "compute peak" and roofline_pct(M2MAX, gemm, 4 * at_peak_ms) == pytest.approx(25)


@pytest.mark.slow
def test_the_worked_model_in_the_docs_is_the_fixtures_and_its_figures_hold() -> None:
    """docs/model.md's worked [model] is the fixture's table, word for word, and the figures it quotes are what
    the model gives (a change to either shows here)."""
    import re

    from kernsearch import Space
    from kernsearch.backends import get_backend
    from kernsearch.studies._ranking import predict

    repo = Path(__file__).resolve().parents[1]
    doc = (repo / "docs" / "model.md").read_text()
    commands = re.search(r"What it predicts.*?```sh\n(.*?)```", doc, re.S).group(1).splitlines()
    for line, time_ms in zip(commands, ("0.01026", "0.1205")):  # the doc's commands, as written, from the repo
        done = subprocess.run([sys.executable, "-m", *line.split()], capture_output=True, text=True, cwd=repo,
                              timeout=120)
        assert done.returncode == 0 and f"{time_ms} ms modeled" in done.stdout, done.stdout + done.stderr
    spec = (FIXTURE / "family.toml").read_text()
    table = spec[spec.index("\n[model]\n") + 1:spec.index("\n[default]\n")].rstrip("\n") + "\n"
    assert re.search(r"## A worked `\[model\]`.*?```toml\n(.*?)```", doc, re.S).group(1) == table
    doc = " ".join(doc.split())  # the prose, whatever its line breaks
    fam = load_family(FIXTURE)
    model = get_backend("model", chip=M2MAX)
    sp = Space(make_problem(fam, "64,4096", "float16", M2MAX), M2MAX)
    fast, slow = (model.breakdown(sp, sp.parse_config(c)) for c in ("TG=256,VEC=4", "TG=32,VEC=1"))
    assert f"`TG=256,VEC=4` is predicted at {fast['time_ms']:.4g} ms, bound by DRAM" in doc and fast["bound"] == "dram"
    assert f"`TG=32,VEC=1` at {slow['time_ms']:.4g} ms, bound by cache bandwidth" in doc
    assert slow["bound"] == "cache bandwidth" and f"{slow['bandwidth_efficiency'] * 100:.0f} % of the bytes in flight" in doc

    def spread(shape: str, chip: str) -> tuple[str, bool]:
        c = get_chip(chip)
        space = Space(make_problem(fam, shape, "float16", c), c)
        r = ranking(predict(space, space.enumerate().valid))
        return f"{r.tied} of {r.configs}", r.flat

    assert spread("64,4096", "M2 Max") == ("9 of 45", False) and "9 of 45 valid configs are within 1 %" in doc
    assert spread("512,2048", "M2 Max") == ("36 of 45", True) and "puts 36 of 45 configs" in doc
    assert spread("512,2048", "H100") == ("9 of 45", False) and "it ranks it (9 of 45 within 1 %)" in doc

"""Racing: a config is timed only as long as it can still win (``kernsearch.evaluation._race``).

The rule's risk is measured on the recorded landscapes (``benchmarks/data`` and ``../shared/landscapes``),
with samples drawn from each config's recorded repetitions (``times``), NumPy-vectorised over 1000 seeded
runs: the landscape's best config is never dropped, and near-best configs are dropped less often than a full
timing ranks them the wrong way."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np
import pytest

from kernsearch import run_study
from kernsearch.evaluation._measure import TimingPlan, measure_raced
from kernsearch.evaluation._race import RACE_AFTER, RACE_MARGIN, Race, loses, lower_bound, upper_bound
from kernsearch.studies._landscape import Landscape, LandscapeWriter
from kernsearch.studies._replay import Replay
from kernsearch.studies._study import STATUS_NOT_WINNING, STATUS_OK, _known

REPO = Path(__file__).resolve().parents[1]
LANDSCAPES = Path(os.environ.get("KERNSEARCH_LANDSCAPES", REPO.parent / "shared" / "landscapes"))
RUNS = 1000
#: Samples of an incumbent in replay (``Replay.draws``); a GPU search takes more (``SEARCH_PLAN``: >= 6).
INCUMBENT_SAMPLES = 5


def _landscape_files() -> list[Path]:
    """The recorded landscapes (KernelTuner caches) among the benchmarks' data and the shared ones, told by their
    two keys in the text: collection runs in every worker, and loading each file whole (its checks) took ~2 s of CPU
    there; the tests load them whole."""
    files = sorted(p for p in (REPO / "benchmarks" / "data").glob("*.json") if not p.name.endswith(".summary.json"))
    files += sorted(LANDSCAPES.glob("*.json.gz")) if LANDSCAPES.is_dir() else []
    out = []
    for p in files:
        text = p.read_bytes()
        if p.suffix == ".gz":
            text = zlib.decompress(text, wbits=31)
        if b'"tune_params"' in text and b'"cache"' in text:
            out.append(p)
    return out


FILES = _landscape_files()


def _times(land: Landscape) -> list[np.ndarray]:
    """Every working config's recorded repetitions, fastest (by the recorded ``time``) first."""
    ok = sorted((e for e in land.entries.values() if not land.failed(e)), key=lambda e: float(e["time"]))
    return [np.asarray(e.get("times") or [e["time"]], dtype=float) for e in ok]


def _clock_launcher(ms: list[float]) -> tuple:
    """A GPU whose n-th launch lasts ``ms[n % len(ms)]`` on a virtual clock (a sync costs 1 us)."""
    now = [0.0]
    n = [0]

    def launch(_: int) -> None:
        now[0] += ms[n[0] % len(ms)]
        n[0] += 1

    def sync() -> None:
        now[0] += 0.001

    return launch, sync, lambda: now[0] / 1e3


def test_a_timing_stops_once_it_cannot_win_and_runs_to_the_end_while_it_can():
    plan = TimingPlan(warmup=2, min_batch_ms=5.0, min_samples=6, max_samples=30, target_spread=0.0, max_seconds=60)
    race = Race.against([1.0, 1.01, 0.99, 1.02, 1.0])  # the incumbent: ~1 ms, p90 1.016 ms
    assert race is not None and race.limit_ms == pytest.approx((1 + RACE_MARGIN) * 1.016)
    launch, sync, clock = _clock_launcher([2.0])
    slow = measure_raced(launch, sync, race, plan=plan, clock=clock)
    assert slow.not_winning and len(slow.samples) == RACE_AFTER and min(slow.samples) == pytest.approx(2.0, rel=1e-3)
    # within the margin: timed to the end of the plan (30 samples), never stopped
    launch, sync, clock = _clock_launcher([1.1])
    close = measure_raced(launch, sync, race, plan=plan, clock=clock)
    assert not close.not_winning and len(close.samples) == 30
    # one fast sample among the first RACE_AFTER keeps a config in the race (its lower bound is the fastest);
    # only the first RACE_AFTER decide (a later check could only see a lower minimum)
    assert race.lost([2.0] * RACE_AFTER) and not race.lost([2.0] * (RACE_AFTER - 1))
    assert not race.lost([2.0] * (RACE_AFTER - 1) + [1.0]) and not race.lost([2.0] * (RACE_AFTER - 1) + [1.0, 2.0])
    launch, sync, clock = _clock_launcher([2.0])
    assert len(measure_raced(launch, sync, None, plan=plan, clock=clock).samples) == 30  # no race: no stop


@pytest.mark.slow
def test_a_replayed_search_records_not_winning_configs_as_measured_slower_never_as_finalists(tmp_path):
    """Racing in the study loop: configs stopped early are NotWinning trials, told to the strategy with their
    partial median (a measured, slower time), never finalists; a resumed study does not time them again."""
    writer = LandscapeWriter(tmp_path / "race.json", {"X": list(range(16))})
    for x in range(16):
        writer.add({"X": x}, [1.0 + x / 10 + d for d in (0.0, 0.01, 0.02, 0.01, 0.0)])
    writer.save()
    url = f"sqlite:///{tmp_path / 'r.db'}"
    result = run_study(Replay(tmp_path / "race.json", seed=0).objective(), trials=16, sampler="random", seed=0,
                       storage=url, finalists=3)
    import optuna

    trials = optuna.load_study(study_name=result.study_name, storage=url).trials
    status = {t.number: t.user_attrs.get("status") for t in trials}
    stopped = [t for t in trials if status[t.number] == STATUS_NOT_WINNING]
    assert stopped and result.evaluated == 16 and not result.failures
    for t in stopped:  # its partial samples (RACE_AFTER of them), their median told as its value
        samples = t.user_attrs["record"]["samples_ms"]
        assert len(samples) == RACE_AFTER and t.value == pytest.approx(float(np.median(samples)))
    assert result.best is not None and result.best.config == {"X": 0}
    assert all(status[t.number] == STATUS_OK for t in result.top)  # finalists: configs timed to the end
    assert set(result.final.finalists) <= {t.number for t in trials if status[t.number] == STATUS_OK}
    from kernsearch.studies._history import load_history

    points = {p.number: p for p in load_history(result.study_name, url, importances=False).trials}
    assert all(points[t.number].reason == STATUS_NOT_WINNING and points[t.number].time_ms == t.value
               for t in stopped)  # the report and `show` draw them as measured, slower
    known = _known(optuna.load_study(study_name=result.study_name, storage=url))
    assert len(known) == 16 and all(known[f"X={t.user_attrs['config']['X']}"].value == t.value for t in stopped)
    replay = Replay(tmp_path / "race.json", seed=1)
    again = run_study(replay.objective(), trials=16, sampler="random", seed=1, storage=url,
                      study_name=result.study_name)
    assert again.evaluated == 16 and replay.calls == 0  # resumed: a config stopped early is not timed again


def test_replay_races_only_when_asked(tmp_path):
    writer = LandscapeWriter(tmp_path / "race.json", {"X": [0, 1]})
    writer.add({"X": 0}, [1.0, 1.0, 1.0])
    writer.add({"X": 1}, [3.0, 3.0, 3.0])
    writer.save()
    race = Race.against([1.0] * 5)
    raced = Replay(tmp_path / "race.json", seed=0).objective().evaluate_against({"X": 1}, race)
    assert raced.not_winning and len(raced.samples_ms) == RACE_AFTER
    full = Replay(tmp_path / "race.json", seed=0, racing=False).objective().evaluate_against({"X": 1}, race)
    assert not full.not_winning and len(full.samples_ms) == 5  # every draw: timed to the end


@pytest.mark.skipif(not FILES, reason="no recorded landscapes")
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name.split(".json")[0])
def test_racing_never_drops_the_best_config_of_a_recorded_landscape(path: Path):
    """1000 seeded runs per landscape. In each, the landscape's best config (lowest recorded ``time``) races
    against every other config that could ever stop it (one whose fastest repetition, plus the margin, is
    below the best's slowest), each timed with ``INCUMBENT_SAMPLES`` draws: the incumbent of a real run is one
    of them, so this bound covers every search order."""
    times = _times(Landscape.load(path))
    best, others = times[0], times[1:]
    rng = np.random.default_rng(zlib.crc32(path.name.encode()))
    first = rng.choice(best, (RUNS, RACE_AFTER))
    rivals = [t for t in others if t.min() * (1 + RACE_MARGIN) < best.max()]
    dropped = np.zeros(RUNS, dtype=bool)
    for rival in rivals:
        dropped |= loses(first, rng.choice(rival, (RUNS, INCUMBENT_SAMPLES)))
    assert not dropped.any(), f"{int(dropped.sum())} of {RUNS} runs drop the best config of {path.name}"


@pytest.mark.slow
@pytest.mark.skipif(not FILES, reason="no recorded landscapes")
def test_racing_drops_a_faster_config_less_often_than_noise_misranks_it():
    """The risk, bounded on replayed samples: for every pair of the 30 fastest configs of each landscape, the
    chance that racing stops the faster one against the slower one (as incumbent) is no more than the chance
    that timing both fully (median of the same number of draws) ranks them the wrong way, and summed over
    all pairs it is under 5 % of it. Racing adds little to the noise a search lives with anyway."""
    rng = np.random.default_rng(7)
    worst = []
    for path in FILES:
        top = _times(Landscape.load(path))[:30]
        drops = misranks = 0.0
        for i, fast in enumerate(top):
            a = rng.choice(fast, (RUNS, INCUMBENT_SAMPLES))
            for slow in top[i + 1:]:
                if np.median(slow) <= np.median(fast):
                    continue  # ordered by the recorded mean; the pair's faster one by median is what matters
                b = rng.choice(slow, (RUNS, INCUMBENT_SAMPLES))
                drop = float(loses(a, b).mean())
                misrank = float((np.median(a, axis=1) > np.median(b, axis=1)).mean())
                assert drop <= misrank + 0.01, (path.name, drop, misrank)  # 0.01: sampling error of 1000 runs
                drops, misranks = drops + drop, misranks + misrank
        worst.append(drops / misranks if misranks else 0.0)
        assert drops <= 0.05 * misranks, (path.name, drops, misranks)
    assert max(worst) < 0.05


def test_the_rule_uses_the_fastest_early_sample_and_the_incumbents_p90():
    cand = np.array([[3.0, 2.0, 4.0, 5.0, 0.1]])  # only the first RACE_AFTER count: 2.0
    inc = np.array([[1.0] * 9 + [1.7]])
    assert lower_bound(cand)[0] == 2.0 and upper_bound(inc)[0] == pytest.approx(1.07)
    assert loses(cand, inc)[0] and not loses(cand, np.array([[1.9] * 10]))[0]

"""The ``forest`` strategy: its trees fit what they are shown, its features carry a kernel space's structure, and
its proposals are valid, new, and find a needle (a power-of-two width in one slice) far more often than random."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from kernsearch.family._space import format_config
from kernsearch.studies import _trees
from kernsearch.studies._forest import ForestSearch, expected_improvement
from kernsearch.studies._knob_features import knob_features
from kernsearch.studies._landscape import LandscapeWriter


def test_trees_fit_a_step_and_an_interaction() -> None:
    rng = np.random.default_rng(0)
    X = rng.random((200, 3))
    y = np.where(X[:, 0] > 0.5, 1.0, 0.0) + np.where((X[:, 1] > 0.5) & (X[:, 2] > 0.5), 2.0, 0.0)
    model = _trees.fit(X, y, rng, trees=16)
    test = rng.random((500, 3))
    truth = np.where(test[:, 0] > 0.5, 1.0, 0.0) + np.where((test[:, 1] > 0.5) & (test[:, 2] > 0.5), 2.0, 0.0)
    pred = model.predict(test)
    assert pred.shape == (16, 500)
    constant = np.abs(y.mean() - truth).mean()  # about 0.9
    assert np.abs(pred.mean(axis=0) - truth).mean() < 0.35 * constant
    assert np.allclose(_trees.fit(X, y, np.random.default_rng(1), trees=4).predict(X[:5]),
                       _trees.fit(X, y, np.random.default_rng(1), trees=4).predict(X[:5]))  # seeded: repeatable


def test_trees_leave_a_constant_target_one_leaf() -> None:
    X = np.arange(20, dtype=float)[:, None]
    model = _trees.fit(X, np.full(20, 3.0), np.random.default_rng(0), trees=3)
    assert (model.feature == -1).all() and np.allclose(model.predict(X), 3.0)


def test_knob_features_carry_powers_of_two_and_products() -> None:
    knobs: dict[str, list[Any]] = {"bx": [16, 48, 64], "by": [1, 2, 4], "mode": ["a", "b", "c"], "fixed": [7]}
    configs = [dict(zip(["bx", "by", "mode", "fixed"], v)) for v in itertools.product([16, 48, 64], [1, 2, 4],
                                                                                       ["a", "b", "c"], [7])]
    X = knob_features(knobs, configs)
    # bx: position, log2, twos, power of two (4); by: the same (4); mode: one-hot (3); fixed: none; bx x by: 1
    assert X.shape == (27, 12)
    pow2 = X[:, 3]
    assert pow2.tolist() == [0.0 if c["bx"] == 48 else 1.0 for c in configs]
    assert np.allclose(X[:, -1], [np.log2(c["bx"] * c["by"]) for c in configs])


def _needle_space() -> tuple[dict[str, list[Any]], list[dict[str, Any]], dict[str, float]]:
    """A space whose best config is a power-of-two width in one slice of two switches: its width's position in the
    list says nothing (widths off a power of two are 20x slower)."""
    widths = list(range(16, 528, 16))
    knobs: dict[str, list[Any]] = {"w": widths, "h": [1, 2, 4, 8], "s": [0, 1], "r": [0, 1]}
    configs, time = [], {}
    for w, h, s, r in itertools.product(widths, [1, 2, 4, 8], [0, 1], [0, 1]):
        c = {"w": w, "h": h, "s": s, "r": r}
        t = (1.0 if w & (w - 1) == 0 else 20.0) * (1.0 + 0.1 * abs(np.log2(h) - (0 if s == 0 else 3))) \
            * (0.8 if (s, r) == (0, 1) else 1.0) * (1 + 0.01 * (w % 7))
        configs.append(c)
        time[format_config(c)] = float(t)
    return knobs, configs, time


def _search(strategy: Any, time: dict[str, float], budget: int) -> dict[str, Any]:
    known: dict[str, Any] = {}
    for _ in range(budget):
        c = strategy.propose(known, set())
        key = format_config(c)
        assert key not in known  # never twice
        known[key] = SimpleNamespace(value=time[key])
    return known


@pytest.mark.slow
def test_forest_finds_the_needle_far_more_often_than_random() -> None:
    knobs, configs, time = _needle_space()
    best = min(time.values())
    found = random_found = 0
    for seed in range(6):
        known = _search(ForestSearch(knobs, configs, seed=seed, budget=40), time, 40)
        found += min(s.value for s in known.values()) <= best * 1.05
        rng = np.random.default_rng(seed)
        picks = rng.choice(len(configs), 40, replace=False)
        random_found += min(time[format_config(configs[i])] for i in picks) <= best * 1.05
    assert found >= 5 and found > random_found + 2


def test_forest_proposes_only_free_valid_configs_and_stops_when_none_is_left() -> None:
    knobs, configs, time = _needle_space()
    valid = configs[::5]  # a constrained space: most of the product is invalid
    strategy = ForestSearch(knobs, valid, seed=0, budget=len(valid))
    busy = {format_config(valid[0]), format_config(valid[1])}
    keys = {format_config(c) for c in valid}
    known: dict[str, Any] = {}
    while True:
        c = strategy.propose(known, busy)
        if c is None:
            break
        key = format_config(c)
        assert key in keys and key not in known and key not in busy
        # every third config failed: the search goes on around failures
        known[key] = SimpleNamespace(value=None if len(known) % 3 == 2 else time[key])
    assert len(known) == len(valid) - len(busy)


def test_expected_improvement_prefers_a_lower_mean_then_a_wider_spread() -> None:
    ei = expected_improvement(np.array([0.0, 1.0, 1.0]), np.array([0.1, 0.1, 1.0]), best=0.5)
    assert ei[0] > ei[2] > ei[1]


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["forest", "thompson"])
def test_run_study_evaluates_only_valid_configs(tmp_path: Path, sampler: str) -> None:
    from kernsearch import run_study
    from kernsearch.studies._replay import Replay

    knobs, configs, time = _needle_space()
    writer = LandscapeWriter(tmp_path / "needle.json", knobs, device_name="test GPU")
    for c in configs[::2]:
        writer.add(c, [time[format_config(c)]] * 3)
    result = run_study(Replay(writer.save(), seed=0).objective(), trials=30, sampler=sampler, seed=0,
                       storage=":memory:")
    assert result.evaluated == 30 and result.invalid == 0 and result.best is not None


def test_forest_never_proposes_a_config_it_did_not_propose_itself_but_the_study_holds() -> None:
    """Configs the loop evaluated or holds in flight without this strategy proposing them (the default config, a
    warm start, another process's) count as taken: known ones found by their config, busy ones by their key."""
    knobs, configs, time = _needle_space()
    valid = configs[:12]
    strategy = ForestSearch(knobs, valid, seed=0, budget=12)
    known = {format_config(c): SimpleNamespace(value=time[format_config(c)], config=c) for c in valid[:5]}
    busy = {format_config(c) for c in valid[5:10]}
    proposed = []
    while (c := strategy.propose(known, busy)) is not None:
        key = format_config(c)
        proposed.append(key)
        known[key] = SimpleNamespace(value=time[key], config=c)
    assert sorted(proposed) == sorted(format_config(c) for c in valid[10:])


@pytest.mark.slow
def test_run_study_hybrid_asks_tpe_first_then_only_the_forest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hybrid``: Optuna's TPE proposes the first HYBRID_SWITCH trials, the forest (no random start of its own:
    TPE's points are its data) every later one."""
    from kernsearch import run_study
    from kernsearch.studies import _forest
    from kernsearch.studies._replay import Replay

    knobs, configs, time = _needle_space()
    writer = LandscapeWriter(tmp_path / "needle.json", knobs, device_name="test GPU")
    for c in configs[::2]:
        writer.add(c, [time[format_config(c)]] * 3)
    calls: list[int] = []
    starts: list[int] = []
    propose, init = ForestSearch.propose, ForestSearch.__init__

    def counted(self: ForestSearch, known: dict[str, Any], busy: set[str]) -> Any:
        calls.append(len(known))
        return propose(self, known, busy)

    def recorded(self: ForestSearch, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        starts.append(self.n_start)

    monkeypatch.setattr(ForestSearch, "propose", counted)
    monkeypatch.setattr(ForestSearch, "__init__", recorded)
    monkeypatch.setattr(_forest, "HYBRID_SWITCH", 12)
    result = run_study(Replay(writer.save(), seed=0).objective(), trials=30, sampler="hybrid", seed=0,
                       storage=":memory:")
    assert result.evaluated == 30 and result.best is not None
    assert starts == [0] and len(calls) == 30 - 12 and min(calls) >= 12  # the forest: trials 12..29 only


@pytest.mark.slow
def test_thompson_finds_the_needle_far_more_often_than_random() -> None:
    knobs, configs, time = _needle_space()
    best = min(time.values())
    found = random_found = 0
    for seed in range(6):
        known = _search(ForestSearch(knobs, configs, seed=seed, budget=40, acquisition="thompson"), time, 40)
        found += min(s.value for s in known.values()) <= best * 1.05
        rng = np.random.default_rng(seed)
        picks = rng.choice(len(configs), 40, replace=False)
        random_found += min(time[format_config(configs[i])] for i in picks) <= best * 1.05
    assert found >= 5 and found > random_found + 2


class _Disagreeing:
    """Four trees over a one-knob space of 8 widths (feature 0 is the width's position, /7): tree t ranks width
    t + 1 far best (-3), every tree gives width 0 a middling 0.4 and the rest 1."""

    def predict(self, X: np.ndarray) -> np.ndarray:
        pos = np.rint(X[:, 0] * 7).astype(int)
        out = np.where(pos == 0, 0.4, 1.0)[None, :].repeat(4, axis=0)
        for t in range(4):
            out[t, pos == t + 1] = -3.0
        return out


def test_thompson_proposes_what_a_draw_of_trees_ranks_best_and_spreads_over_their_disagreement(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Expected improvement ranks by the ensemble's mean and spread: the same width every time. Thompson sampling
    ranks by the mean of THOMPSON_TREES trees drawn at random: a width one of the drawn trees ranks best, a
    different one as the draws differ (three of four trees drawn: the first width that is any drawn tree's best)."""
    from kernsearch.studies import _forest

    monkeypatch.setattr(_trees, "fit", lambda *args, **kwargs: _Disagreeing())
    knobs: dict[str, list[Any]] = {"w": [16, 32, 48, 64, 80, 96, 112, 128], "fixed": [1]}
    configs = [{"w": w, "fixed": 1} for w in knobs["w"]]
    known = {format_config(c): SimpleNamespace(value=1.0 + i, config=c) for i, c in enumerate(configs[6:])}
    picks = {a: [ForestSearch(knobs, configs, seed=seed, start=0, acquisition=a).propose(known, set())["w"]
                 for seed in range(20)] for a in _forest.ACQUISITIONS}
    assert set(picks["ei"]) == {picks["ei"][0]}
    assert set(picks["thompson"]) <= {32, 48, 64, 80} and len(set(picks["thompson"])) >= 2
    with pytest.raises(ValueError, match="acquisition"):
        ForestSearch(knobs, configs, acquisition="ucb")

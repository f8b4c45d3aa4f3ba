"""The ``forest`` search strategy: a tree-ensemble surrogate over the enumerated valid configs.

Kernel spaces are finite and enumerable; their landscapes are not smooth: a block width off a power of two,
a tile of 3, shared memory off, can each multiply the time, and the best config often sits where several
such knobs interact (on the recorded convolution landscapes: the best is 1 of 4,362 configs, in a slice
whose values look bad on average). ``ForestSearch`` therefore

1. starts with random valid configs (``START_SHARE`` of the budget, 5 to 20);
2. then, after every evaluation, fits extremely randomised trees (``_trees``) to log time over the
   structural features of the evaluated configs (``_knob_features``: positions, log2, powers of two,
   products of knobs), a failed config counting as slower than the slowest that ran (``_strategy.FAILURE_PENALTY``),
   and proposes the unevaluated valid config of highest expected improvement under the trees' mean and
   spread: with probability ``LOCAL_SHARE`` among the configs one knob (any value) away from the three
   best so far, else among all (a random ``MAX_CANDIDATES`` of them when there are more).

The ``hybrid`` strategy asks Optuna's TPE for the first ``HYBRID_SWITCH`` trials and this search (``start=0``) after.
The ``thompson`` strategy is this search with Thompson sampling in place of expected improvement
(``acquisition="thompson"``): each proposal is the candidate of lowest predicted time under the mean of
``THOMPSON_TREES`` trees drawn at random from the ensemble, one plausible landscape rather than the average of all;
the draws spread the proposals over the modes the trees disagree on (docs/search.md, fourth round).

Chosen by measurement on the tuned-on landscapes of ``benchmarks/search_landscapes.py`` (docs/search.md has
the figures and what was tried). NumPy only; a proposal costs a few milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..family._space import Config, format_config
from . import _trees
from ._knob_features import knob_features
from ._strategy import training_rows

#: Share of the budget spent on random configs before the first model (at least 5, at most 20 configs).
START_SHARE = 0.2
#: Probability that a proposal is chosen among the one-knob neighbours of the three best configs.
LOCAL_SHARE = 0.5
#: Largest candidate sample scored, and training set fitted (the best half and a random rest), per proposal.
MAX_CANDIDATES, MAX_TRAIN = 2000, 200
#: Trees of the ensemble, the share of the features each split draws from, and the trees fitted per proposal: the
#: ensemble keeps the newest TREES (those fitted before the last evaluations miss them; their spread is still
#: the model's uncertainty), so a proposal fits a third of them.
TREES, FEATURE_SHARE, FIT_TREES = 12, 0.5, 4
#: Below this many evaluated configs trees are fitted for every proposal, above it for every second one (each new
#: point then moves the model less than it costs: a fit on 200 points is most of a proposal's milliseconds).
REFIT_ALWAYS = 60
#: The ``hybrid`` strategy: Optuna's TPE proposes the first HYBRID_SWITCH trials, the forest every later one (from all
#: the points TPE measured, with no random start of its own). TPE learns more from a few dozen points than trees fitted
#: to them (pnpoly at 1 %, 41 trials: TPE 0.988, forest 0.961 on the tuned-on files); the forest proposes only valid,
#: new configs and costs a third of TPE's time a proposal past that (docs/search.md, third round).
HYBRID_SWITCH = 40
#: The ``thompson`` strategy: trees drawn (without replacement) from the ensemble per proposal; their mean is the
#: landscape sampled. One tree explored more and exploited less, five behaved as expected improvement (docs/search.md).
THOMPSON_TREES = 3
ACQUISITIONS = ("ei", "thompson")


class ForestSearch:
    """Proposes valid, unevaluated configs: random first, then tree-ensemble expected improvement."""

    def __init__(self, knobs: dict[str, list[Any]], valid: Sequence[Config], *, seed: int | None = None,
                 budget: int | None = None, start: int | None = None, acquisition: str = "ei") -> None:
        if acquisition not in ACQUISITIONS:
            raise ValueError(f"unknown acquisition {acquisition!r} (known: {', '.join(ACQUISITIONS)})")
        self.acquisition = acquisition
        self.valid = list(valid)
        varying = {k: list(v) for k, v in knobs.items() if len(v) > 1}
        self.X = knob_features(varying, self.valid)
        # each knob's value as a code: for "one knob away", and to find a config's row without formatting every
        # valid config's key (a second of set-up on a space of 18,000)
        self.positions = {k: {_hashable(v): i for i, v in enumerate(values)} for k, values in varying.items()}
        self.codes = np.array([[pos[_hashable(c[k])] for k, pos in self.positions.items()] for c in self.valid],
                              dtype=np.int32).reshape(len(self.valid), len(varying))
        self.by_codes = {row.tobytes(): i for i, row in enumerate(self.codes)}
        self.rows: dict[str, int] = {}  # key -> row, for every key met so far
        self.all_keys = False
        self.rng = np.random.default_rng(seed)
        # random configs first; ``start`` overrides (0: another sampler measured the first points)
        self.n_start = max(5, min(20, round(START_SHARE * (budget or 50)))) if start is None else start
        self.models: list[_trees.Ensemble] = []
        self.picks = 0

    def propose(self, known: dict[str, Any], busy: set[str]) -> Config | None:
        """The next config to evaluate; ``known``: key -> object with ``.value`` (None: failed); ``busy``: keys
        in flight."""
        rows = {k: self._row(k, getattr(s, "config", None)) for k, s in known.items()}
        taken = np.zeros(len(self.valid), dtype=bool)
        for i in [*rows.values(), *(self._row(k, None) for k in busy)]:
            if i is not None:
                taken[i] = True
        free = np.flatnonzero(~taken)
        if len(free) == 0:
            return None
        seen = [(i, s.value) for s, i in zip(known.values(), rows.values()) if i is not None]
        done = [(i, v) for i, v in seen if v is not None]
        if len(done) < self.n_start:
            pick = int(self.rng.choice(free))
        else:
            failed = [i for i, v in seen if v is None]
            pick = self._pick(free, done, failed)
        self.rows[format_config(self.valid[pick])] = pick
        return dict(self.valid[pick])

    def _row(self, key: str, config: Config | None) -> int | None:
        """The valid config's row of ``key`` (its ``config`` when known), None when it is not a valid config."""
        row = self.rows.get(key)
        if row is not None or self.all_keys:
            return row
        if config is not None:
            try:
                code = np.array([pos[_hashable(config[k])] for k, pos in self.positions.items()], dtype=np.int32)
            except (KeyError, TypeError):
                return None
            row = self.by_codes.get(code.tobytes())
            if row is not None and format_config(self.valid[row]) == key:
                self.rows[key] = row
                return row
            return None
        # a key without its config (in flight, not proposed here): every valid config's key, once
        self.rows.update({format_config(c): i for i, c in enumerate(self.valid)})
        self.all_keys = True
        return self.rows.get(key)

    def _training(self, done: list[tuple[int, float]], failed: list[int]) -> tuple[np.ndarray, np.ndarray]:
        return training_rows(done, failed, self.rng, MAX_TRAIN)

    def _candidates(self, free: np.ndarray, idx: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The one-knob neighbours of the three best (with probability LOCAL_SHARE, when any is free), else a
        random sample of the free configs."""
        if self.rng.random() < LOCAL_SHARE:
            near = np.zeros(len(free), dtype=bool)
            for b in idx[np.argsort(y, kind="stable")[:3]]:
                near |= (self.codes[free] != self.codes[b]).sum(axis=1) <= 1
            if near.any():
                return free[near]
        if len(free) > MAX_CANDIDATES:
            return np.asarray(self.rng.choice(free, MAX_CANDIDATES, replace=False))
        return free

    def _pick(self, free: np.ndarray, done: list[tuple[int, float]], failed: list[int]) -> int:
        idx, y = self._training(done, failed)
        cand = self._candidates(free, idx, y)
        self.picks += 1
        if len(done) < REFIT_ALWAYS or self.picks % 2 == 0 or not self.models:
            self.models = [*self.models, _trees.fit(self.X[idx], y, self.rng, trees=FIT_TREES,
                                                    feature_share=FEATURE_SHARE)][-(TREES // FIT_TREES):]
        Xc = self.X[cand]
        pred = np.concatenate([m.predict(Xc) for m in self.models])
        if self.acquisition == "thompson":
            drawn = self.rng.choice(len(pred), min(THOMPSON_TREES, len(pred)), replace=False)
            return int(cand[int(np.argmin(pred[drawn].mean(axis=0)))])
        return int(cand[int(np.argmax(expected_improvement(pred.mean(axis=0), pred.std(axis=0), float(y.min()))))])


def _hashable(value: Any) -> Any:
    """A knob value as a dict key that tells 1, 1.0 and True apart (a list's ``index`` would not)."""
    return (type(value).__name__, value if not isinstance(value, list) else tuple(value))


def expected_improvement(mean: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """Expected improvement below ``best`` of a normal prediction (``sd`` floored so a point the trees
    agree on still ranks by its mean)."""
    sd = np.maximum(sd, 1e-6)
    z = (best - mean) / sd
    cdf = 0.5 * (1.0 + _erf(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return np.asarray(sd * (z * cdf + pdf))


def _erf(x: np.ndarray) -> np.ndarray:
    """The error function, vectorised (Abramowitz-Stegun 7.1.26: absolute error below 1.5e-7)."""
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.asarray(np.sign(x) * (1.0 - poly * np.exp(-x * x)))

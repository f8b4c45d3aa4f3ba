"""The ``auto`` search strategy: proposals only inside the valid set, for small budgets.

Kernel spaces are enumerable and mostly invalid (constraints), ordered (tile sizes, widths) and small
enough to score every valid config. ``ValidSetSearch`` therefore proposes one valid, unevaluated config
at a time from an index over the valid set, so no trial and no model capacity goes to invalid configs:

1. a start: the configs the objective's prior ranks best (a performance model's predictions, when the
   objective has one), else a space-filling design (greedy max-min distance over a random sample);
2. then a Gaussian-process surrogate of log time over the evaluated configs (ordered knobs by position,
   categorical ones by equality, each weighted by how much of the variance its values explain; its mean
   is the prior when there is one, so the model only learns the prior's error) picks the config of
   highest expected improvement — alternately among all valid configs and inside a trust region around
   the incumbent (configs one knob step away: a wider region let the weights, which see main effects
   only, hide a knob that matters in combination, e.g. ``read_only`` of the convolution landscape).
   A config that failed counts as slower than the slowest that ran (``FAILURE_PENALTY``), so the model
   steers away from where kernels fail instead of proposing their neighbours again.

Everything is NumPy on a few hundred points; the candidate set is capped so a proposal costs milliseconds.
"""

from __future__ import annotations

import math
import operator
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..family._space import Config, format_config

#: Largest training set and candidate sample a proposal looks at (keeps a proposal to milliseconds).
MAX_TRAIN, MAX_CANDIDATES = 160, 4000
LENGTHSCALES = (0.15, 0.3, 0.6, 1.2)
#: A failed config's log time: the slowest working one's plus this (about 1.65x slower).
FAILURE_PENALTY = 0.5
#: The trust region: free configs at most this many knob steps from the incumbent.
TRUST_STEPS = 1


def _ordered(values: Sequence[Any]) -> bool:
    return len(values) > 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _log_times(done: Sequence[tuple[int, float]]) -> tuple[np.ndarray, np.ndarray]:
    """The rows that ran and their times' logs."""
    return np.array([i for i, _ in done]), np.log(np.maximum(np.array([v for _, v in done], dtype=float), 1e-12))


def training_rows(done: Sequence[tuple[int, float]], failed: Sequence[int], rng: np.random.Generator,
                  max_train: int) -> tuple[np.ndarray, np.ndarray]:
    """A surrogate's training set (rows, log times): what ran, a failed config counting as slower than the slowest
    that ran (``FAILURE_PENALTY``), and past ``max_train`` rows the best half and a random rest."""
    idx, y = _log_times(done)
    if failed:
        idx = np.concatenate([idx, np.array(failed)])
        y = np.concatenate([y, np.full(len(failed), y.max() + FAILURE_PENALTY)])
    if len(idx) > max_train:
        order = np.argsort(y)
        keep = np.concatenate([order[: max_train // 2],
                               rng.choice(order[max_train // 2:], max_train // 2, replace=False)])
        idx, y = idx[keep], y[keep]
    return idx, y


def _encoded(knobs: dict[str, list[Any]], ordered: np.ndarray, valid: list[Config]) -> np.ndarray:
    """The configs as points (one row a config, one column a knob): an ordered knob's value by its position in
    [0, 1], a categorical one's by its index (compared for equality only)."""
    cols = []
    for (k, values), is_ordered in zip(knobs.items(), ordered):
        # A knob's values have one type (bool, int or str): equal ones are the same value.
        pos = {v: i for i, v in enumerate(sorted(values) if is_ordered else values)}
        scale = max(1, len(values) - 1) if is_ordered else 1
        cols.append(np.fromiter(map(pos.__getitem__, map(operator.itemgetter(k), valid)), float, len(valid)) / scale)
    return np.array(cols, dtype=float).T if cols else np.zeros((len(valid), 0))


def _prior_log(prior: Callable[[list[Config]], Sequence[float] | None] | None, valid: list[Config]
               ) -> np.ndarray | None:
    """The log of the prior's predicted times of the configs (a missing or non-positive one: ten times the worst),
    or None where there is no usable prior."""
    p = prior(valid) if prior is not None and valid else None
    if p is None:
        return None
    arr = np.asarray(list(p), dtype=float)
    if arr.shape != (len(valid),) or not np.isfinite(arr).any():
        return None
    worst = np.nanmax(arr[np.isfinite(arr)])
    return np.log(np.where(np.isfinite(arr) & (arr > 0), arr, worst * 10))


class ValidSetSearch:
    """Proposes valid, unevaluated configs: prior or space-filling start, then GP expected improvement."""

    def __init__(self, knobs: dict[str, list[Any]], valid: list[Config], *, seed: int | None = None,
                 budget: int | None = None, prior: Callable[[list[Config]], Sequence[float] | None] | None = None
                 ) -> None:
        self.knobs = {k: list(v) for k, v in knobs.items() if len(v) > 1}  # a fixed knob tells nothing
        self.valid = valid
        self.rng = random.Random(seed)
        self.np_rng = np.random.default_rng(seed)
        self.keys = [format_config(c) for c in valid]
        self.index = {k: i for i, k in enumerate(self.keys)}
        # encoding: ordered knobs by position in [0, 1]; categorical knobs by value index (compared for equality)
        self.ordered = np.array([_ordered(v) for v in self.knobs.values()])
        self.X = _encoded(self.knobs, self.ordered, valid)
        self.n_init = max(3, min(10, (budget or 40) // 5, len(valid)))
        self.prior_log = _prior_log(prior, valid)
        self.proposed = 0

    # -- geometry ---------------------------------------------------------------------------------------
    def _sqdist(self, A: np.ndarray, B: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
        """Weighted mean squared per-knob distance (ordered: position difference; categorical: 0 or 1)."""
        if A.shape[1] == 0:
            return np.zeros((len(A), len(B)))
        w = np.full(A.shape[1], 1.0 / A.shape[1]) if w is None else w
        out = np.zeros((len(A), len(B)))
        for d in range(A.shape[1]):  # per knob: no (A, B, knobs) temporary
            diff = np.abs(A[:, d, None] - B[None, :, d])
            out += w[d] * (diff * diff if self.ordered[d] else (diff > 0))
        return out

    def _relevance(self, idx: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Per-knob weights: how much of the variance of log time the knob's values explain (main
        effects of the evaluated configs), floored so no knob is ignored; they sum to one."""
        w = np.zeros(self.X.shape[1])
        total = y.var() or 1.0
        for d in range(self.X.shape[1]):
            col = self.X[idx, d]
            groups = [y[col == v] for v in np.unique(col)]
            w[d] = sum(len(g) * (g.mean() - y.mean()) ** 2 for g in groups) / len(y) / total
        w = np.maximum(w, 0.05 * max(w.max(), 1e-9))
        return np.asarray(w / w.sum())

    def _steps(self, i: int, free: np.ndarray) -> np.ndarray:
        """Free configs at most ``TRUST_STEPS`` knob steps from config ``i`` (ordered knobs: to the adjacent
        value)."""
        d = np.abs(self.X[free] - self.X[i])
        steps = np.where(self.ordered, np.round(d * np.maximum(1, [len(v) - 1 for v in self.knobs.values()])), d > 0)
        return np.asarray(free[steps.sum(axis=1) <= TRUST_STEPS])

    # -- proposing --------------------------------------------------------------------------------------
    def propose(self, known: dict[str, Any], busy: set[str]) -> Config | None:
        """The next config to evaluate; ``known``: key → object with ``.value`` (None: failed)."""
        taken = np.zeros(len(self.valid), dtype=bool)
        for k in list(known) + list(busy):
            i = self.index.get(k)
            if i is not None:
                taken[i] = True
        free = np.flatnonzero(~taken)
        if len(free) == 0:
            return None
        done = [(self.index[k], s.value) for k, s in known.items() if k in self.index and s.value is not None]
        failed = [self.index[k] for k, s in known.items() if k in self.index and s.value is None]
        self.proposed += 1
        if len(done) < self.n_init:
            i = self._start(free, np.flatnonzero(taken))
        else:
            i = self._model_pick(free, done, failed)
        return dict(self.valid[i])

    def _start(self, free: np.ndarray, taken: np.ndarray) -> int:
        if self.prior_log is not None:  # the best-ranked free config that differs from those taken
            order = free[np.argsort(self.prior_log[free], kind="stable")]
            if len(taken) == 0:
                return int(order[0])
            head = order[: max(1, len(order) // 20)][:200]
            gap = self._sqdist(self.X[head], self.X[taken]).min(axis=1)
            # rank by prior, but skip near-duplicates of taken configs (one knob apart) when others exist
            far = head[gap > 1.0 / max(1, self.X.shape[1]) + 1e-9]
            return int(far[0] if len(far) else order[0])
        sample = free if len(free) <= MAX_CANDIDATES else self.np_rng.choice(free, MAX_CANDIDATES, replace=False)
        if len(taken) == 0:
            return int(self.np_rng.choice(sample))
        gap = self._sqdist(self.X[sample], self.X[taken]).min(axis=1)
        return int(sample[int(np.argmax(gap))])

    def _model_pick(self, free: np.ndarray, done: list[tuple[int, float]], failed: list[int]) -> int:
        prior = self.prior_log  # its level is not the measurements': shifted by their median difference
        shift = 0.0
        if prior is not None:
            ran, log_t = _log_times(done)
            shift = float(np.median(log_t - prior[ran]))
        idx, y = training_rows(done, failed, self.np_rng, MAX_TRAIN)
        if prior is not None:
            m: Callable[[np.ndarray], np.ndarray] = lambda ix: prior[ix] + shift  # noqa: E731
        else:
            level = float(y.mean())
            m = lambda ix: np.full(len(ix), level)  # noqa: E731
        mean = m(idx)
        r = y - mean
        scale = r.std() or 1.0
        r = r / scale
        w = self._relevance(idx, y)
        K0 = self._sqdist(self.X[idx], self.X[idx], w)
        best_ll, best_l, best_fact = -math.inf, LENGTHSCALES[0], None
        for ls in LENGTHSCALES:
            K = np.exp(-K0 / (2 * ls * ls)) + 1e-2 * np.eye(len(idx))
            try:
                L = np.linalg.cholesky(K)
            except np.linalg.LinAlgError:
                continue
            a = np.linalg.solve(L.T, np.linalg.solve(L, r))
            ll = -0.5 * r @ a - np.log(np.diag(L)).sum()
            if ll > best_ll:
                best_ll, best_l, best_fact = ll, ls, (L, a)
        # alternate: global candidates, then the trust region around the incumbent
        incumbent = idx[int(np.argmin(y))]
        if self.proposed % 2 == 0:
            cand = self._steps(int(incumbent), free)
            if len(cand) == 0:
                cand = free
        else:
            cand = free
        if len(cand) > MAX_CANDIDATES:
            cand = self.np_rng.choice(cand, MAX_CANDIDATES, replace=False)
        if best_fact is None:
            return int(self.rng.choice(list(cand)))
        L, a = best_fact
        Ks = np.exp(-self._sqdist(self.X[cand], self.X[idx], w) / (2 * best_l * best_l))
        mu = Ks @ a
        v = np.linalg.solve(L, Ks.T)
        sd = np.sqrt(np.maximum(1e-12, 1.0 - (v * v).sum(axis=0)))
        pred = m(cand) + scale * mu
        sd = scale * sd
        best = float(y.min())
        # expected improvement of log time
        z = (best - pred) / sd
        ei = sd * (z * _ncdf(z) + _npdf(z))
        return int(cand[int(np.argmax(ei))])


def _npdf(z: np.ndarray) -> np.ndarray:
    return np.asarray(np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi))


def _ncdf(z: np.ndarray) -> np.ndarray:
    return np.asarray(0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2))))

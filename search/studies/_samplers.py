"""How a study proposes configs: the sampler Optuna asks (:func:`make_sampler`), and the local steps the loop takes
instead when the sampler keeps proposing configs that are invalid or known (:func:`fill`, :func:`neighbour`)."""

from __future__ import annotations

import math
import random
import warnings
from typing import TYPE_CHECKING, Any

from .._errors import KernsearchError
from ..family._space import Config, format_config
from ._objective_base import Objective
from ._trial import Trial

if TYPE_CHECKING:
    import optuna

__all__ = ["CONSTANT_LIAR", "PRIOR_SAMPLERS", "SAMPLERS", "distributions", "fill", "leaders", "make_sampler",
           "neighbour", "ordinal", "stale_for"]

SAMPLERS = ("default", "tpe", "random", "grid", "auto", "forest", "hybrid", "thompson")
#: ``default``: ``auto`` when the objective has a prior (the chip's performance model ranks the family's
#: configs), else ``tpe``. Measured on the held-out H100 GEMM landscape (benchmarks/search_landscapes.txt):
#: with the prior, auto scores 0.999 at 1 % of the space where TPE scores 0.61; without one, auto is not
#: reliably better than TPE on the tuning landscapes.
#: The samplers that rank every valid config with the model's prior before the search (``default`` may become auto).
PRIOR_SAMPLERS = ("default", "auto")


def ordinal(values: list[Any]) -> bool:
    """Numeric knobs with more than two values: a local step moves them to an adjacent value."""
    return len(values) > 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def distributions(knobs: dict[str, list[Any]]) -> dict[str, Any]:
    """Every knob is categorical for the sampler. (Numeric knobs searched by position were tried: no
    better on the four benchmark landscapes, worse on two.)"""
    from optuna.distributions import CategoricalDistribution

    return {k: CategoricalDistribution(v) for k, v in knobs.items()}


#: Constant liar (TPE treats configs being evaluated elsewhere as bad) stays off: with N = 2..8 workers on
#: one study it did not improve best-found vs budget (benchmarks/farm_scale.txt: within the seed spread,
#: slightly lower medians at N = 2 and 8). Alone it changes nothing either way.
CONSTANT_LIAR = False


def make_sampler(name: str, seed: int | None, knobs: dict[str, list[Any]]) -> optuna.samplers.BaseSampler:
    import optuna

    if name in ("tpe", "default", "hybrid"):  # hybrid: TPE, then the forest (``_fixed``)
        # constant liar: configs proposed but not timed yet (pipelined, or other processes') repel proposals
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=10,
                                              constant_liar=CONSTANT_LIAR)
    if name in ("random", "auto", "forest", "thompson"):  # auto, forest, thompson: every config comes from the
        # strategy, Optuna only stores
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        class Grid(optuna.samplers.GridSampler):
            def after_trial(self, *args: Any, **kwargs: Any) -> None:
                """Optuna's grid stops the study when its grid is done, which only works inside
                ``optimize``; the loop here stops by itself (every valid config evaluated)."""

        return Grid(knobs, seed=seed)
    raise KernsearchError(f"unknown sampler {name!r} (known: {', '.join(SAMPLERS)})")


def stale_for(known: dict[str, Trial]) -> int:
    """Evaluated configs since the last new best, in trial order."""
    best, since = math.inf, 0
    for s in sorted(known.values(), key=lambda s: s.number):
        if s.value is not None and s.value < best:
            best, since = s.value, 0
        else:
            since += 1
    return since


def leaders(known: dict[str, Trial], n: int) -> list[Trial]:
    return sorted((s for s in known.values() if s.value is not None), key=lambda s: (s.value, s.number))[:n]


def fill(known: dict[str, Trial], objective: Objective, rng: random.Random,
          busy: set[str] = frozenset()) -> Config | None:  # type: ignore[assignment]
    """An unevaluated config (not ``busy``): a one-knob neighbour of a leader if one is left, else a random one."""
    if rng.random() < 0.7:
        cfg = neighbour(known, objective, rng, busy)
        if cfg is not None:
            return cfg
    for _ in range(50):
        cfg = objective.random_config(rng)
        if cfg is not None and format_config(cfg) not in known and format_config(cfg) not in busy:
            return cfg
    fresh = [c for c in objective.valid_configs() if format_config(c) not in known and format_config(c) not in busy]
    return rng.choice(fresh) if fresh else None


def neighbour(known: dict[str, Trial], objective: Objective, rng: random.Random,
               busy: set[str] = frozenset()) -> Config | None:  # type: ignore[assignment]
    """An unevaluated valid config one knob away from one of the three leaders (numeric knobs: one step)."""
    lead = leaders(known, 3)
    if not lead:
        return None
    base = rng.choice(lead).config
    moves = []
    for k, values in objective.knobs.items():
        i = values.index(base[k])
        near = [values[j] for j in (i - 1, i + 1) if 0 <= j < len(values)] if ordinal(values) else values
        moves += [(k, v) for v in near if v != base[k]]
    rng.shuffle(moves)
    for k, v in moves:
        cfg = {**base, k: v}
        if format_config(cfg) not in known and format_config(cfg) not in busy and objective.violation(cfg) is None:
            return cfg
    return None

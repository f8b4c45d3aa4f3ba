"""Can the performance model rank a space? Its predictions of the valid configs, their ties, and the verdict.

A model that predicts most valid configs within 1 % of its best one cannot say which is fastest: a family
without ``[model]`` (a plain roofline of its FLOPs and bytes: the same for every config), or a memory-bound
family whose every config reaches the same DRAM floor. A search on the model back-end then has nothing to
search: it says so and stops (``StopReason.UNRANKABLE``) instead of running out of patience, and on a GPU
the model gives no guidance (no prior).

Exact ties are broken by something the model knows: the on-core time (``core_ms`` of the breakdown). At the
same predicted time (the same DRAM floor), the config with less on-core work has the most headroom under
the bound, so it is the least likely to miss it on the chip (the model's absolute times are optimistic).
Remaining ties go to the earlier trial (the family's default config is trial 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._records import Prediction

__all__ = ["FLAT_SHARE", "TIE", "Prediction", "Ranking", "predict", "ranking"]

if TYPE_CHECKING:
    from ..family._space import Config, Space

#: Predictions within this fraction of the best one are ties: far below what the model can tell apart.
TIE = 0.01
#: The model cannot rank a space where at least this share of its valid configs ties with the best.
FLAT_SHARE = 0.5


@dataclass(frozen=True)
class Ranking:
    """How the model's predictions spread over the valid configs of a space (all of them, or a sample)."""

    configs: int  # valid configs the model predicted
    tied: int  # of them within TIE of the best prediction
    best_ms: float
    sampled: bool = False  # a random sample of a space too big to enumerate
    roofline: bool = False  # the family has no [model]: every config gets the same roofline

    @property
    def flat(self) -> bool:
        """Most valid configs tie with the best: the model cannot say which is fastest."""
        return self.configs >= 2 and self.tied >= FLAT_SHARE * self.configs

    def text(self) -> str:
        """The one-line "cannot rank" message (tune, the report, the search's stop reason)."""
        of = f"{self.tied} of {self.configs} {'sampled ' if self.sampled else ''}valid configs"
        why = ("the family has no [model] table, so every config gets the same roofline of its FLOPs and bytes"
               if self.roofline else "its [model] puts them at the same bound")
        return (f"the performance model cannot rank this space: {of} are predicted within {TIE:.0%} of the best "
                f"({self.best_ms:.4g} ms; {why}); a [model] table that separates them (docs/model.md) or a GPU "
                "run can")


def predict(space: Space, configs: list[Config]) -> list[Prediction] | None:
    """The chip's performance model's predictions for ``configs`` (inf where it cannot say), or None when it has
    nothing for this family or chip. Never raises: a prediction is optional."""
    try:
        from ..backends import get_backend
        from ..backends._model import ModelBackend
        from ..backends._model_columns import predict_many

        model = get_backend("model", chip=space.chip)
        if not isinstance(model, ModelBackend):
            return None
        out = predict_many(model, space, configs)  # inf where the model cannot say
        return out if any(math.isfinite(p.time_ms) for p in out) else None
    except Exception:  # noqa: BLE001 - no model for this family or chip: no prediction
        return None


def ranking(predictions: list[Prediction], *, sampled: bool = False, roofline: bool = False) -> Ranking:
    """The spread of ``predictions`` (the finite ones)."""
    times = [p.time_ms for p in predictions if math.isfinite(p.time_ms)]
    best = min(times, default=math.inf)
    tied = sum(1 for t in times if t <= best * (1 + TIE))
    return Ranking(len(times), tied, best, sampled, roofline)

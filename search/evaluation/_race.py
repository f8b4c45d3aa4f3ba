"""Racing: a config is timed only as long as it can still win (the rule and its risk: ``docs/timing.md``).

During a search most configs are far slower than the best one found so far (the incumbent), and timing
them to a 2 % spread only to rank them behind it is wasted GPU time. The rule: after the warm-up, the
batch calibration and :data:`RACE_AFTER` samples, a config whose *lower bound* (the fastest of those
samples) is slower than the incumbent's *upper bound* (the p90 of its samples) by more than
:data:`RACE_MARGIN` stops. It is recorded as not winning, with its partial samples: a measured time, told
to the strategy as such, never a finalist and never published.

Only the first :data:`RACE_AFTER` samples decide: their minimum can only fall as samples are added, so a
config that survives that check runs to the end of its timing plan. The risk is a config dropped by noise:
all of its first samples slow (a clock not yet up, a neighbour's burst) while the incumbent's p90 is low.
``tests/test_racing.py`` bounds it on every recorded landscape, with samples drawn from the recorded
repetitions: the best config is never dropped in 1000 seeded runs per landscape, and for every pair of
near-best configs racing drops the faster one less often than full timing ranks the pair the wrong way.

NumPy is imported inside the functions: the CLI's start-up path imports this module's importers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Samples taken (after warm-up and calibration) before the one check; chosen on the recorded landscapes.
RACE_AFTER = 4
#: How much slower than the incumbent's upper bound a config's lower bound must be to stop it.
RACE_MARGIN = 0.10
#: The incumbent's upper bound: this percentile of its samples.
UPPER_PERCENTILE = 90.0


def upper_bound(samples: Any) -> Any:
    """The incumbent's upper bound: the p90 of its samples (along the last axis of an array)."""
    import numpy as np

    return np.percentile(np.asarray(samples, dtype=float), UPPER_PERCENTILE, axis=-1)


def lower_bound(samples: Any, after: int = RACE_AFTER) -> Any:
    """A candidate's lower bound: the fastest of its first ``after`` samples (last axis)."""
    import numpy as np

    return np.min(np.asarray(samples, dtype=float)[..., :after], axis=-1)


def loses(candidate: Any, incumbent: Any, margin: float = RACE_MARGIN) -> Any:
    """The rule, vectorised: ``candidate`` (..., >= RACE_AFTER samples) stops against ``incumbent``
    (..., n samples) when its lower bound exceeds (1 + margin) x the incumbent's upper bound."""
    import numpy as np

    return np.asarray(lower_bound(candidate) > (1.0 + margin) * upper_bound(incumbent))


@dataclass(frozen=True)
class Race:
    """What a timing races against: it stops once its first ``after`` samples are all slower than
    ``limit_ms`` ((1 + margin) x the incumbent's upper bound)."""

    limit_ms: float
    after: int = RACE_AFTER

    @classmethod
    def against(cls, incumbent_samples: Sequence[float], margin: float = RACE_MARGIN) -> Race | None:
        """The race against an incumbent timed with ``incumbent_samples`` (None: nothing to race against)."""
        if not incumbent_samples:
            return None
        return cls(float((1.0 + margin) * upper_bound(list(incumbent_samples))))

    def lost(self, samples: Sequence[float]) -> bool:
        """True once ``after`` samples are in and the fastest of them is slower than the limit."""
        return len(samples) >= self.after and float(lower_bound(samples, self.after)) > self.limit_ms

"""What a study optimises: an :class:`Objective` is a space of configs and a way to evaluate one (its time, a
:class:`~kernsearch.studies._trial.Record`). A kernel family's is ``KernelObjective`` (``_objective``), a replayed
landscape's ``Replay(path).objective()``; tests and plug-ins write their own."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from ..family._space import Config
from ._final import FinalRound
from ._storage import StudyKey
from ._trial import Record, Trial

if TYPE_CHECKING:
    from ..evaluation._race import Race

__all__ = ["Objective"]


class Objective(ABC):
    """A space of configs and a way to evaluate one; a study minimises its time."""

    backend: str
    evidence: str

    @property
    @abstractmethod
    def knobs(self) -> dict[str, list[Any]]:
        """Knob name → values, as the sampler sees them."""

    @property
    @abstractmethod
    def study_key(self) -> StudyKey:
        """What identifies the study: family, chip, dtype, shape, backend (an objective of your own may give a
        mapping of these five)."""

    @abstractmethod
    def violation(self, config: Config) -> str | None:
        """Why ``config`` cannot be built (a constraint's name), or None when it is valid."""

    def family_sha256(self) -> str:
        """The content hash of what configs render from ("": nothing to tell apart). A study keeps the one it was
        made with: a resumed study whose family changed since is another study (:func:`study_for`)."""
        return ""

    def rendered_sha256(self, config: Config) -> str | None:
        """The hash of the exact kernel ``config`` renders to now (None: no rendered kernel). A proof stored with
        the study holds only for the kernel it ran: the final round is re-run where they differ."""
        return None

    @abstractmethod
    def valid_configs(self) -> list[Config]:
        """Every valid config (may be slow for large spaces: the loop asks only when it must)."""

    def size(self) -> int | None:
        """How many valid configs there are, when that is cheap to know (the search stops at it)."""
        return len(self.valid_configs())

    def random_config(self, rng: random.Random, tries: int = 200) -> Config | None:
        """A random valid config: rejection sampling over the knobs, else one from the enumeration."""
        for _ in range(tries):
            cfg = {k: rng.choice(v) for k, v in self.knobs.items()}
            if self.violation(cfg) is None:
                return cfg
        valid = self.valid_configs()
        return rng.choice(valid) if valid else None

    @abstractmethod
    def evaluate(self, config: Config) -> Record:
        """Measure one config; raise :class:`VariantFailure` when it fails."""

    @property
    def races(self) -> bool:
        """Whether :meth:`evaluate_against` stops a timing that can no longer win (the loop then works out
        the incumbent's bound for it)."""
        return False

    def evaluate_against(self, config: Config, race: Race | None) -> Record:
        """:meth:`evaluate`, racing the incumbent: a config that cannot beat it may stop early and come back
        with ``not_winning`` and its partial samples (see ``kernsearch.evaluation._race``)."""
        return self.evaluate(config)

    def default(self) -> Config | None:
        return None

    def first_configs(self) -> list[Config]:
        """Configs the user asked to be evaluated first (``tune --start``), before the default and warm start."""
        return []

    def prior(self, configs: list[Config]) -> list[float] | None:
        """Predicted times of ``configs`` (e.g. the chip's performance model), or None: the ``auto``
        strategy starts from the best-predicted configs and learns the prediction's error."""
        return None

    def lookahead(self) -> int:
        """How many proposals the loop may hand to :meth:`prefetch` before the oldest is evaluated
        (1: one at a time, the loop as it always was)."""
        return 1

    def prefetch(self, config: Config) -> None:
        """``config`` will be evaluated soon: start what can run ahead (e.g. compiling it elsewhere)."""

    def warm_start(self) -> list[Config]:
        return []

    def unrankable(self) -> str | None:
        """Why evaluating more configs cannot rank this space (a performance model that predicts most of them
        alike), or None. The search then evaluates its first configs (default, warm start) and stops."""
        return None

    def baseline_ms(self) -> float | None:
        """The baseline op's time on this problem, when it can be measured here (for the progress display)."""
        return None

    def finalize(self, top: list[Trial]) -> FinalRound:
        """Final checks of the leaders (re-measure, verify): the winner, and what to record on the study."""
        return FinalRound(top[0].number if top else None)

    def close(self) -> None:
        """Release workers."""

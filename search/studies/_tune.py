"""``kernsearch.tune``: the library call under ``kernsearch tune`` — search one problem, judge the winner
against the baseline op, and (if asked) publish it through the store's gate.

The CLI adds the terminal around it (progress, tables, notes); flows and scripts call this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import KernsearchError
from .._rules import DEFAULT_MARGIN, beats_op, consumer_verdict, modes_text, speedup_text
from .._vocabulary import Evidence
from .._vocabulary import Verdict as Decision
from ..artifacts._manifest import MODELED_POLICY

if TYPE_CHECKING:
    from ..artifacts._artifacts import ArtifactStore, PublishOutcome
    from ..family._spec import Family
    from ..hardware._chips import Chip
    from ._kernel import KernelVariants
    from ._storage import StudyKey
    from ._study import StudyResult


@dataclass(frozen=True)
class Verdict:
    """Does the winner beat the family's baseline op? ``beats`` is None when nothing can say (modeled)."""

    beats: bool | None
    text: str


@dataclass
class TuneResult:
    """A finished search: the study's result, the verdict on the baseline, and a way to publish the winner."""

    study: StudyResult
    verdict: Verdict
    objective: KernelVariants

    def publish(self, store: ArtifactStore | None = None, margin: float = DEFAULT_MARGIN) -> PublishOutcome:
        """Offer the winner to ``store`` (default: ./artifacts); the gate decides (docs/artifacts.md)."""
        outcome: PublishOutcome = self.objective.publish(self.study, store, margin=margin)
        return outcome


def verdict(result: StudyResult, key: StudyKey, op: str, margin: float = DEFAULT_MARGIN,
            judged: tuple[str, ...] | None = None) -> Verdict:
    """The search's last word: does a correct variant beat ``op`` beyond the noise and the margin? (``judged``: the
    consumer modes the family is judged in; default every mode timed.)"""
    where = f"on {key.chip} at {key.shape} {key.dtype}"
    final = result.final
    if result.best is None:
        return Verdict(False, f"no correct variant {where}; keep the MLX op")
    if result.evidence == Evidence.MODELED:
        return Verdict(None, f"modeled result: {op} is not modeled, so nothing says this variant beats it; measure "
                             f"it on {key.chip} to know; {MODELED_POLICY}")
    f = final.figures if final is not None else None
    if f is None or f.speedup_low is None:
        return Verdict(None, f"{op} was not timed in this run: no verdict on the baseline {where}")
    text = speedup_text(f.speedup, f.speedup_low, f.speedup_high)
    why = ""
    if f.modes:  # judged as consumers call it: each mode with its interval, and what the intervals say
        figures = f.consumer()
        text = modes_text(figures, tuple(figures))
        said = consumer_verdict(figures, judged or tuple(figures), margin)
        why = {Decision.SLOWER: "; slower than the op",
               Decision.UNDECIDED: "; not decided: an interval spans the margin"}.get(said, "")
    if beats_op(f.speedup_low, margin):
        return Verdict(True, f"the winner beats {op} {where}: {text} (lower bound above {1 + margin:.2f}x)")
    return Verdict(False, f"no variant beats {op} {where} (best: {text}{why}); keep the MLX op")


def tune(family: str | Family, shape: str | tuple[int, ...] | None = None, dtype: str | None = None, *,
         backend: str = "model", chip: str | Chip | None = None, trials: int | None = 150,
         time_budget: str | float | None = None, patience: int | None = 60, sampler: str = "tpe", seed: int = 0,
         storage: str | None = ":memory:", study: str | None = None, finalists: int = 3, timeout: float = 120.0,
         verify: str = "finalists", margin: float = DEFAULT_MARGIN, **options: Any) -> TuneResult:
    """Search ``family`` at ``shape``/``dtype`` on ``backend`` (``model``: predicted times for ``chip``, default the
    GPU here, else an M-series chip, finalists verified on the CPU interpreter; ``metal``/``cuda``: measured on the
    GPU here; ``auto``: as ``kernsearch tune`` chooses) and judge the winner."""
    from ..backends import select_backend
    from ..family._space import make_problem
    from ..family._spec import load_family
    from ._objective import KernelObjective
    from ._storage import StudyKey
    from ._study import run_study

    fam = load_family(family) if isinstance(family, str) else family
    chosen = select_backend(backend, chip, verify=verify)  # the chip, as every command resolves it
    if chosen.refusal:
        raise KernsearchError(chosen.refusal)
    backend, the_chip = chosen.backend, chosen.chip
    problem = make_problem(fam, shape, dtype, the_chip)
    objective = KernelObjective(problem, the_chip, backend, seed=seed, timeout=timeout, verify=verify, **options)
    result = run_study(objective, trials=trials, time_budget=time_budget, patience=patience, sampler=sampler,
                       seed=seed, storage=storage, study_name=study, finalists=finalists)
    said = verdict(result, StudyKey.of(objective.study_key), fam.baseline_name, margin, tuple(fam.consumer_modes))
    return TuneResult(result, said, objective)

"""A stored study read back as typed data: every trial's outcome, the leaders, the final round and the
parameter importances. What `kernsearch report` draws and what `show` summarises."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .._errors import KernsearchError
from .._vocabulary import TrialStatus
from ._final import FinalRound
from ._trial import Trial
from ._trials import top, trials_of


@dataclass(frozen=True)
class TrialPoint:
    """One evaluated config: a time (ok; or not winning: the partial time of a config stopped early, ``reason``
    says so) or the reason it failed. Invalid and known proposals are not here."""

    number: int
    config: dict[str, Any]
    time_ms: float | None
    reason: str | None = None


@dataclass
class StudyHistory:
    name: str
    attrs: dict[str, Any]
    trials: list[TrialPoint]
    top: list[Trial]
    invalid: int
    known: int
    importances: dict[str, float] = field(default_factory=dict)
    importance_note: str = ""

    @property
    def evidence(self) -> str:
        """The study's evidence kind as users read it: modeled, interpreted, measured, or measured, replayed."""
        from ..backends import evidence_label

        return evidence_label(str(self.attrs.get("evidence", "unknown")), self.attrs.get("backend"))

    @property
    def final(self) -> FinalRound | None:
        """The stored final round (None: none ran, or what is stored is not one)."""
        return FinalRound.from_dict(self.attrs.get("final"))

    @property
    def knobs(self) -> dict[str, list[Any]]:
        knobs = self.attrs.get("knobs")
        return knobs if isinstance(knobs, dict) else {}

    @property
    def failures(self) -> Counter[str]:
        return Counter(t.reason or "?" for t in self.trials if t.time_ms is None)


def load_history(study_name: str, storage: str | None = None, importances: bool = True) -> StudyHistory:
    """Read a study; a name not in the storage is a one-line error naming how to list them."""
    import optuna

    from ._storage import make_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    store = make_storage(storage)
    if study_name not in {s.study_name for s in optuna.get_all_study_summaries(store)}:
        raise KernsearchError(f"no study {study_name!r} in this storage (see `kernsearch studies`)")
    study = optuna.load_study(study_name=study_name, storage=store)
    points, invalid, known, ok = [], 0, 0, []
    frozen = {t.number: t for t in study.get_trials(deepcopy=False)}
    for t in trials_of(study):
        if t.evaluated:
            points.append(TrialPoint(t.number, t.config, t.time_ms,
                                     None if t.status == TrialStatus.OK else TrialStatus.NOT_WINNING.value))
            if t.status == TrialStatus.OK:
                ok.append(frozen[t.number])
        elif t.status == TrialStatus.FAILED:
            points.append(TrialPoint(t.number, t.config, None, t.reason or "?"))
        elif t.status == TrialStatus.INVALID:
            invalid += 1
        elif t.status == TrialStatus.KNOWN:
            known += 1
    history = StudyHistory(study_name, dict(study.user_attrs), points, top(study, 10), invalid, known)
    if importances:
        history.importances, history.importance_note = _importances(ok)
    return history


def _importances(ok: list[Any]) -> tuple[dict[str, float], str]:
    """PED-ANOVA importances (no scikit-learn needed) over the distinct successful trials (duplicates told as
    'known' would weigh twice)."""
    import optuna

    if len(ok) < 4:
        return {}, f"too few successful trials ({len(ok)}) to estimate importances"
    varied = [p for p in ok[0].distributions if len({str(t.params.get(p)) for t in ok}) > 1]
    if not varied:
        return {}, "every successful trial has the same value of each knob"
    tmp = optuna.create_study(direction="minimize")
    tmp.add_trials([t for t in ok if set(t.distributions) == set(ok[0].distributions)])
    try:
        values = optuna.importance.get_param_importances(tmp, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    except (RuntimeError, ValueError, ImportError) as exc:
        return {}, f"importances not available: {exc}"
    return dict(values), "PED-ANOVA (Optuna): which knobs separate the top 10 % of successful trials"

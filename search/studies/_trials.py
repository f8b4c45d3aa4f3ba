"""A study's trials as the search loop reads and writes them: what the study has evaluated
(:func:`evaluated_configs`), a config another process holds (:func:`claimed_elsewhere`), the leaders (:func:`top`),
the incumbent a timing races (:func:`race`), an evaluated proposal recorded (:func:`record`) and the progress
display's line (:func:`progress`). Every stored trial is read through
:func:`~kernsearch.studies._trial.read_trial` and written through :func:`~kernsearch.studies._trial.trial_attrs`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._errors import VariantFailure
from .._vocabulary import TrialStatus
from ..family._space import Config, format_config
from ._objective_base import Objective
from ._result import Progress
from ._samplers import leaders, stale_for
from ._trial import Record, StoredTrialError, Trial, read_trial, trial_attrs

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from ..evaluation._race import Race
    from ._inflight import InFlight

__all__ = ["claimed_elsewhere", "evaluated_configs", "progress", "race", "record", "top", "trials_of", "write_trial"]


def trials_of(study: optuna.Study, frozen: Sequence[FrozenTrial] | None = None) -> list[Trial]:
    """Every trial of ``study`` (or of ``frozen``, one read of it already made), read and validated (a malformed
    one is a ``StoredTrialError``, one line)."""
    shape = study.user_attrs.get("shape")
    frozen = study.get_trials(deepcopy=False) if frozen is None else frozen
    try:
        return [read_trial(t, shape if isinstance(shape, str) else None) for t in frozen]
    except StoredTrialError as exc:
        raise StoredTrialError(f"study {study.study_name!r}: {exc}") from None


def write_trial(trial: optuna.Trial, record: Trial) -> None:
    """Store ``record`` on the Optuna trial it is of (its user attributes; the value is told by the caller)."""
    for name, value in trial_attrs(record).items():
        trial.set_user_attr(name, value)


def evaluated_configs(study: optuna.Study, frozen: Sequence[FrozenTrial] | None = None) -> dict[str, Trial]:
    """Every config the study has evaluated (timed, or failed), by its key: the first trial of each."""
    out: dict[str, Trial] = {}
    for t in trials_of(study, frozen):
        if t.evaluated or t.status == TrialStatus.FAILED:
            out.setdefault(format_config(t.config), t)
    return out


def claimed_elsewhere(study: optuna.Study, trial: optuna.Trial, objective: Objective, key: str) -> Trial | None:
    """Another process holds this config: a running trial of it (its params are stored when it is asked for;
    a status written but not told yet still holds it), or a finished one (told since ``known`` was read).

    One read of the study answers both: two reads would miss a trial told between them."""
    from optuna.trial import TrialState

    shape = study.user_attrs.get("shape")
    for t in study.get_trials(deepcopy=False):
        if t.number == trial.number or set(t.params) != set(objective.knobs) or \
                format_config({k: t.params[k] for k in objective.knobs}) != key:
            continue
        held = read_trial(t, shape if isinstance(shape, str) else None)
        if held.evaluated or held.status == TrialStatus.FAILED:
            return held
        if t.state == TrialState.RUNNING and held.status not in (TrialStatus.INVALID, TrialStatus.CANCELLED):
            return Trial(t.number, dict(t.params), TrialStatus.RUNNING, reason="running elsewhere")
    return None


def top(study: optuna.Study, n: int | None) -> list[Trial]:
    """The study's best distinct configs (timed to the end), fastest first; equal times by their tie-break."""
    ok = [t for t in trials_of(study) if t.status == TrialStatus.OK and t.value is not None]
    seen: set[str] = set()
    out = []
    for t in sorted(ok, key=lambda t: (t.time_ms, t.tie_break, t.number)):
        key = format_config(t.config)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out if n is None else out[:n]


def race(known: dict[str, Trial]) -> Race | None:
    """The race against the incumbent: the fastest config timed to the end (not one stopped early)."""
    from ..evaluation._race import Race

    timed = [s for s in known.values() if s.status == TrialStatus.OK and s.value is not None and s.samples]
    if not timed:
        return None
    return Race.against(min(timed, key=lambda s: (s.time_ms, s.number)).samples)


def record(study: optuna.Study, trial: optuna.Trial, config: Config, key: str, outcome: InFlight[Record],
           known: dict[str, Trial], failures: Counter[str]) -> str:
    """Record one evaluated proposal on its trial; a failure is a value, never an exception (anything else the
    evaluation raised is a bug, and raised here)."""
    from optuna.trial import TrialState

    try:
        rec = outcome.result()
    except VariantFailure as exc:
        failed = Trial(trial.number, config, TrialStatus.FAILED, reason=exc.reason, detail=exc.detail)
        write_trial(trial, failed)
        study.tell(trial, state=TrialState.FAIL)
        failures[exc.reason] += 1
        known[key] = failed
        return f"trial {trial.number} failed ({exc.reason})"
    timed = Trial(trial.number, config, TrialStatus.NOT_WINNING if rec.not_winning else TrialStatus.OK, rec,
                  rec.time_ms)
    write_trial(trial, timed)
    study.tell(trial, rec.time_ms)  # not winning: its partial median, a measured (slower) time
    known[key] = timed
    return f"trial {trial.number}: {rec.time_ms:.4g} ms" + (" (not winning: stopped early)" if rec.not_winning else "")


def progress(known: dict[str, Trial], total: int | None, budget: float | None, elapsed: float,
             failures: Counter[str], invalid: int, last: str, new: int, baseline: float | None,
             pace: float | None = None, patience: int | None = None) -> Progress:
    """``pace``: seconds per new config in this run's loop (the set-up before it is not a trial's cost); the
    estimate counts the trials that can still run: to the budget, or to the patience if no new best comes."""
    remaining = None
    left = [total - len(known)] if total is not None else []
    if patience:
        left.append(patience - stale_for(known))
    if left and new:
        remaining = (pace if pace is not None else elapsed / new) * max(0, min(left))
    if budget is not None:
        remaining = min(remaining if remaining is not None else budget, max(0.0, budget - elapsed))
    lead = leaders(known, 1)
    return Progress(len(known), total, elapsed, remaining, lead[0] if lead else None, failures, invalid, last,
                    baseline)


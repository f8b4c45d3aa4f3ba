"""Where a study lives and what it holds already: the study a run resumes or starts (:func:`study_for`: a family
changed since is another study), opening it (:func:`open_study`) or checking it read-only first
(:func:`check_study`), whether it already holds its budget (:func:`finished`), and the final round a run that
evaluated nothing new may take from it (:func:`earlier_final`)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .._errors import KernsearchError
from .._vocabulary import Evidence
from ._final import FinalRound
from ._objective_base import Objective
from ._samplers import make_sampler, stale_for
from ._storage import StudyKey, make_storage, retry_collisions
from ._trial import Trial
from ._trials import evaluated_configs as read_known

if TYPE_CHECKING:
    import optuna

__all__ = ["StudyPlace", "check_study", "earlier_final", "finished", "metric_name", "open_study", "study_for"]


@dataclass(frozen=True)
class StudyPlace:
    """Which study a run works in: its name, the trials it holds already (0: a new one) and, where the named study
    was made from another version of the family, what this run says about it (the study it uses instead)."""

    name: str
    trials: int = 0
    changed: str | None = None


def study_for(objective: Objective, storage: str | None, study_name: str | None) -> StudyPlace:
    """The study ``objective`` resumes or starts: ``study_name`` (default: its key's name), unless that study was
    made from another version of the family (its content hash differs): its trials and proofs are of other
    kernels, so the run works in ``NAME@HASH`` instead (found again by the next run of the same family)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    key = StudyKey.of(objective.study_key)
    name = study_name or key.name
    sha = objective.family_sha256()
    study = _load(name, storage)
    if study is None:
        return StudyPlace(name)
    stored = study.user_attrs.get("family_sha256")
    made = study.user_attrs.get("knobs") is not None
    if not sha or not made or stored == sha:
        return StudyPlace(name, len(study.get_trials(deepcopy=False)))
    other = f"{name}@{sha[:12]}"
    again = _load(other, storage)
    was = f"family content {str(stored)[:12]}" if isinstance(stored, str) else "a family of unrecorded content"
    note = (f"study {name!r} was made from another version of family {key.family} ({was}, now {sha[:12]}): its "
            f"trials prove other kernels, so this run {'resumes' if again is not None else 'starts'} study "
            f"{other!r}")
    return StudyPlace(other, len(again.get_trials(deepcopy=False)) if again is not None else 0, note)


def _load(name: str, storage: str | None) -> optuna.Study | None:
    import optuna

    try:
        return optuna.load_study(study_name=name, storage=make_storage(storage))
    except KeyError:
        return None


def open_study(objective: Objective, storage: str | None, study_name: str | None, sampler: str,
               seed: int | None) -> optuna.Study:
    """Create or resume the study (before any worker starts: a new SQLite file must not race)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    key = StudyKey.of(objective.study_key)
    name = study_for(objective, storage, study_name).name
    made = make_sampler(sampler, seed, objective.knobs)
    study = retry_collisions(lambda: optuna.create_study(study_name=name, storage=make_storage(storage),
                                                         direction="minimize", sampler=made, load_if_exists=True))
    if study.user_attrs.get("knobs") is None:
        for k, v in key.as_dict().items():
            study.set_user_attr(k, v)
        if objective.family_sha256():
            study.set_user_attr("family_sha256", objective.family_sha256())
        study.set_user_attr("knobs", objective.knobs)
        study.set_user_attr("evidence", objective.evidence)
    else:
        _check_same_problem(study, objective, name)
    if study.metric_names is None:  # optuna-dashboard labels its axes with it ("Objective 0" without)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([metric_name(objective.evidence)])
    return study


def metric_name(evidence: str) -> str:
    """What a study minimises, with its unit: a predicted time is said to be one."""
    return "predicted kernel time (ms)" if evidence == Evidence.MODELED else "kernel time (ms)"


def check_study(objective: Objective, storage: str | None, study_name: str | None) -> None:
    """What :func:`open_study` refuses, checked read-only before any work (the CLI: before its banner): an
    existing study of that name made for another space or problem."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    name = study_for(objective, storage, study_name).name
    try:
        study = optuna.load_study(study_name=name, storage=make_storage(storage))
    except KeyError:  # no such study yet: open_study creates it
        return
    if study.user_attrs.get("knobs") is not None:
        _check_same_problem(study, objective, name)


def _check_same_problem(study: optuna.Study, objective: Objective, name: str) -> None:
    differs = [f"{k} {study.user_attrs.get(k)!r} (asked: {v!r})"
               for k, v in StudyKey.of(objective.study_key).as_dict().items()
               if study.user_attrs.get(k) != v]
    if study.user_attrs.get("knobs") != objective.knobs:
        differs.append("its knobs")
    if differs:
        raise KernsearchError(f"study {name!r} was made for another space or problem: {', '.join(differs)}; "
                              "choose another --study name")


def finished(objective: Objective, storage: str | None, study_name: str | None, trials: int | None,
              patience: int | None) -> bool:
    """The stored study already holds its budget or ran out of patience: this run proposes nothing (so it
    needs no ranking of the space)."""
    import optuna

    if trials is None and not patience:
        return False
    try:
        study = optuna.load_study(study_name=study_name or StudyKey.of(objective.study_key).name,
                                  storage=make_storage(storage))
    except KeyError:
        return False
    known = read_known(study)
    return (trials is not None and len(known) >= trials) or bool(patience and stale_for(known) >= patience)


def earlier_final(study: optuna.Study, top: list[Trial], objective: Objective) -> FinalRound | None:
    """The final round stored by the run that evaluated these leaders, when this run evaluated nothing new and
    that round judged exactly them (and decided): running it again would redo the same work. Not when a check it
    stored was of another kernel than its config renders to now (a template changed since): then it is re-run."""
    stored = FinalRound.from_dict(study.user_attrs.get("final"))
    if stored is None or stored.winner is None:
        return None
    judged = set(stored.checks) | set(stored.finalists)
    if judged != {t.number for t in top}:
        return None
    configs = {t.number: t.config for t in top}
    for number, check in stored.checks.items():
        now = objective.rendered_sha256(configs[number]) if check.ok else None
        if now is not None and check.sha256 != now:
            return None
    note = "final round of the run that evaluated these trials (nothing new was evaluated since)"
    return replace(stored, note=f"{stored.note}; {note}" if stored.note else note)

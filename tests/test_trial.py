"""One trial record from the objective to the study's store and back: the worker's proof travels whole, a record of
an older kernsearch (its proof flattened) is migrated, and a hostile store is one line, never a traceback."""

from __future__ import annotations

from typing import Any

import optuna
import pytest

from kernsearch._errors import KernsearchError
from kernsearch._records import Proof
from kernsearch._vocabulary import Evidence, TrialStatus, Verifier
from kernsearch.studies._trial import Record, StoredTrialError, Trial, read_trial, trial_attrs

KNOB = {"BM": optuna.distributions.CategoricalDistribution([32, 64])}


def stored(attrs: dict[str, Any], value: float | None = 1.5, number: int = 0) -> optuna.trial.FrozenTrial:
    state = optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL
    t = optuna.trial.create_trial(params={"BM": 64}, distributions=KNOB, value=value, user_attrs=attrs, state=state)
    t.number = number
    return t


def test_a_trial_reads_back_as_it_was_written_with_its_proof_whole() -> None:
    proof = Proof(Verifier.DEVICE, ("64x64x64", "63x61x60"), 1e-3, 2e-4, 12)
    record = Record(1.5, Evidence.MEASURED, (1.4, 1.5, 1.6), 0.13, 2.0, "ab" * 32, 900.0, 41.0, proof, None, True)
    trial = Trial(7, {"BM": 64}, TrialStatus.NOT_WINNING, record, 1.5)
    back = read_trial(stored(trial_attrs(trial), 1.5, 7))
    assert back == trial and back.proof == proof and back.max_abs_err == 1e-3 and back.verified == "device"
    failed = Trial(8, {"BM": 32}, TrialStatus.FAILED, reason="compile", detail="x" * 600)
    again = read_trial(stored(trial_attrs(failed), None, 8))
    assert (again.status, again.reason, again.detail, again.value) == (TrialStatus.FAILED, "compile", "x" * 500, None)
    known = Trial(9, {"BM": 64}, TrialStatus.KNOWN, reason=TrialStatus.KNOWN.value, same_as=7)
    assert read_trial(stored(trial_attrs(known), 1.5, 9)).same_as == 7


def test_an_older_record_is_migrated_its_proof_made_whole_at_the_studys_shape() -> None:
    old = {"config": {"BM": 64}, "status": "ok",
           "record": {"time_ms": 1.5, "evidence": "measured", "samples_ms": [1.5], "verified": "device",
                      "max_abs_err": 1e-3, "max_rel_err": 1e-4}}
    trial = read_trial(stored(old), shape="64x64x64")
    assert trial.proof == Proof(Verifier.DEVICE, ("64x64x64",), 1e-3, 1e-4)
    assert trial.record is not None and trial.record.not_winning is False
    unverified = read_trial(stored({**old, "record": {"time_ms": 1.5, "evidence": "modeled", "not_winning": None}}))
    assert unverified.proof is None and unverified.evidence == "modeled"


@pytest.mark.parametrize("attrs, said", [
    ({"status": "ok", "config": {"BM": 64}, "record": {"time_ms": "fast", "evidence": "measured"}}, "time_ms"),
    ({"status": "ok", "config": {"BM": 64}, "record": {"time_ms": 1.0, "evidence": "guessed"}}, "evidence"),
    ({"status": "ok", "config": {"BM": 64}, "record": {"time_ms": 1.0, "evidence": "measured",
                                                       "samples_ms": [1.0, float("nan")]}}, "samples_ms"),
    ({"status": "ok", "config": {"BM": 64}, "record": {"time_ms": 1.0, "evidence": "measured",
                                                       "proof": {"verifier": "oracle"}}}, "proof"),
    ({"status": "ok", "config": {"BM": 64}, "record": [1.0]}, "not a mapping"),
    ({"status": "ok", "config": [64]}, "config"),
    ({"status": "great", "config": {"BM": 64}}, "unknown status"),
])
def test_a_hostile_stored_trial_is_one_line(attrs: dict[str, Any], said: str) -> None:
    with pytest.raises(StoredTrialError, match=said) as caught:
        read_trial(stored(attrs))
    assert isinstance(caught.value, KernsearchError) and "\n" not in str(caught.value)


def test_a_study_with_a_hostile_trial_is_refused_by_name(tmp_path: Any) -> None:
    from kernsearch.studies._history import load_history

    url = f"sqlite:///{tmp_path / 's.db'}"
    s = optuna.create_study(study_name="hostile", storage=url)
    t = s.ask(KNOB)
    t.set_user_attr("config", {"BM": 64})
    t.set_user_attr("status", "ok")
    t.set_user_attr("record", {"time_ms": 1.0, "evidence": "measured", "samples_ms": "many"})
    s.tell(t, 1.0)
    with pytest.raises(StoredTrialError, match="study 'hostile': trial 0: malformed record: samples_ms"):
        load_history("hostile", url)

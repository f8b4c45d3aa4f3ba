"""One trial of a study, as one frozen record from the objective that evaluated it to the study that stores it.

An objective's ``evaluate`` returns a :class:`Record` (what was measured, predicted or replayed of one variant,
the worker's :class:`~kernsearch._records.Proof` whole); the study stores it on its Optuna trial, and every reader
of a study (the search loop, the final round, the report) reads the trial back as a :class:`Trial`: its number,
config, status (``TrialStatus``) and record. The stored form is written by :func:`trial_attrs` and read by
:func:`read_trial`, the one pair: a store is trusted for nothing, so a record is validated on read (a malformed one
is a :class:`StoredTrialError`, one line), and a record of an older kernsearch (its proof flattened into
``verified``, ``max_abs_err``, ``max_rel_err``) is migrated as it is read.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from .._errors import KernsearchError
from .._records import Proof
from .._vocabulary import Evidence, TrialStatus, Verifier
from ..family._space import Config

if TYPE_CHECKING:
    import optuna

__all__ = ["Record", "StoredTrialError", "Trial", "read_trial", "trial_attrs"]


#: A timing sample as a store may hold it: a finite number (a NaN would poison the race's bound).
Sample = Annotated[float, Field(allow_inf_nan=False)]


@dataclass(frozen=True)
class Record:
    """Everything measured (or predicted, or replayed) about one variant: its time (ms; a prediction for modeled
    evidence: interpreted runs are correctness only and never a time), the samples and their relative spread, the
    compile time, the rendered kernel's hash, its throughput and share of the roofline, where it was proven (the
    worker's proof, None: not verified), what orders equal times (``tie_break``, smaller first: the modeled on-core
    time under the bound) and whether its timing stopped early because it could not beat the incumbent (racing)."""

    __pydantic_config__ = ConfigDict(extra="ignore")

    time_ms: float
    evidence: Evidence
    samples_ms: tuple[Sample, ...] = ()
    spread: float = 0.0
    compile_seconds: float = 0.0
    sha256: str = ""
    gflops: float | None = None
    peak_pct: float | None = None
    proof: Proof | None = None
    tie_break: float | None = None
    not_winning: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence", Evidence(self.evidence))  # a kind given by its name is the kind
        object.__setattr__(self, "samples_ms", tuple(float(x) for x in self.samples_ms))

    def to_json(self) -> dict[str, Any]:
        """As the study stores it (its ``record`` attribute, one JSON): no empty fields, figures to 6 significant
        digits (far finer than the timing noise), so optuna-dashboard and `show --json` stay readable."""
        def short(v: Any) -> Any:
            if isinstance(v, float):
                return float(f"{v:.6g}")
            if isinstance(v, (list, tuple)):
                return [short(x) for x in v]
            return v

        out = {k: short(v) for k, v in asdict(self).items()
               if k != "proof" and v is not None and v is not False and v != ()}
        out["evidence"] = self.evidence.value
        if self.proof is not None:
            out["proof"] = self.proof.to_json()
        return out


_RECORD = TypeAdapter(Record)


class StoredTrialError(KernsearchError):
    """A study's stored trial is not one kernsearch wrote (a hostile or damaged store): said in one line."""


@dataclass(frozen=True)
class Trial:
    """One trial as a study holds it: ``status`` says what became of its config (``TrialStatus``); ``record`` is
    what its evaluation measured (``ok`` and ``not_winning`` trials), ``value`` the time the sampler was told (a
    known config's too), ``reason`` why it failed or was not evaluated. The views below are what the tables, the
    final round and the race read."""

    number: int
    config: Config
    status: TrialStatus
    record: Record | None = None
    value: float | None = None
    reason: str = ""
    detail: str = ""
    same_as: int | None = None  # known: the trial that evaluated the config

    @property
    def evaluated(self) -> bool:
        """Timed (to the end, or until it could not win): its value is a result."""
        return self.status in (TrialStatus.OK, TrialStatus.NOT_WINNING) and self.value is not None

    @property
    def time_ms(self) -> float:
        return self.value if self.value is not None else math.inf

    @property
    def evidence(self) -> str:
        return self.record.evidence.value if self.record is not None else ""

    @property
    def spread(self) -> float:
        return self.record.spread if self.record is not None else 0.0

    @property
    def gflops(self) -> float | None:
        return self.record.gflops if self.record is not None else None

    @property
    def peak_pct(self) -> float | None:
        return self.record.peak_pct if self.record is not None else None

    @property
    def sha256(self) -> str:
        return self.record.sha256 if self.record is not None else ""

    @property
    def proof(self) -> Proof | None:
        return self.record.proof if self.record is not None else None

    @property
    def max_abs_err(self) -> float | None:
        return self.proof.max_abs_err if self.proof is not None else None

    @property
    def verified(self) -> str | None:
        """Where it was proven (a ``Verifier``), None: not verified."""
        return self.proof.verifier.value if self.proof is not None else None

    @property
    def samples(self) -> tuple[float, ...]:
        return self.record.samples_ms if self.record is not None else ()

    def summary(self) -> dict[str, Any]:
        """The trial as ``tune --json`` prints a leader (its views, flat)."""
        return {"number": self.number, "config": dict(self.config), "time_ms": self.time_ms,
                "evidence": self.evidence, "spread": self.spread, "gflops": self.gflops, "peak_pct": self.peak_pct,
                "max_abs_err": self.max_abs_err, "verified": self.verified, "sha256": self.sha256}

    @property
    def tie_break(self) -> float:
        """What orders trials of equal time (0 when none was recorded)."""
        return self.record.tie_break or 0.0 if self.record is not None else 0.0


def trial_attrs(trial: Trial) -> dict[str, Any]:
    """The user attributes a study stores of ``trial`` (:func:`read_trial` reads them back)."""
    attrs: dict[str, Any] = {"config": dict(trial.config), "status": trial.status.value}
    if trial.record is not None:
        attrs["record"] = trial.record.to_json()
    if trial.status not in (TrialStatus.OK, TrialStatus.NOT_WINNING, TrialStatus.RUNNING):
        failure: dict[str, Any] = {"reason": trial.reason}
        if trial.detail:
            failure["detail"] = trial.detail[:500]
        if trial.same_as is not None:
            failure["same_as"] = trial.same_as
        attrs["failure"] = failure
    return attrs


def read_trial(t: optuna.trial.FrozenTrial, shape: str | None = None) -> Trial:
    """A stored trial as a :class:`Trial`, validated: a status, config or record that is not one is a
    :class:`StoredTrialError` (one line); a record of an older kernsearch is migrated (``shape``: the study's tuned
    shape, where an old record's proof was made). A trial with no status yet is ``running``."""
    attrs = t.user_attrs
    where = f"trial {t.number}"
    try:
        status = TrialStatus(attrs.get("status", TrialStatus.RUNNING))
    except ValueError:
        raise StoredTrialError(f"{where}: unknown status {str(attrs.get('status'))[:40]!r}") from None
    config = attrs.get("config", dict(t.params))
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise StoredTrialError(f"{where}: its config is not a mapping of knobs")
    value = t.value if t.value is not None and isinstance(t.value, (int, float)) else None
    record = _read_record(attrs.get("record"), value, shape, where) if "record" in attrs else None
    failure = attrs.get("failure")
    failure = failure if isinstance(failure, dict) else {}
    same_as = failure.get("same_as")
    reason = str(failure.get("reason", "?" if status == TrialStatus.FAILED else ""))
    return Trial(t.number, dict(config), status, record, None if value is None else float(value), reason,
                 str(failure.get("detail", "")),
                 same_as if isinstance(same_as, int) and not isinstance(same_as, bool) else None)


def _read_record(data: object, value: float | None, shape: str | None, where: str) -> Record:
    if not isinstance(data, dict):
        raise StoredTrialError(f"{where}: its record is not a mapping")
    data = _migrated(data, shape)
    if "time_ms" not in data and value is not None:
        data["time_ms"] = value
    try:
        return _RECORD.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        at = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise StoredTrialError(f"{where}: malformed record: {at}: {first['msg']}") from None


def _migrated(data: dict[str, Any], shape: str | None) -> dict[str, Any]:
    """A record as this kernsearch stores it: before proofs were stored whole, a record held the verifier and the
    errors (``verified``, ``max_abs_err``, ``max_rel_err``) and ``not_winning`` only when true. The shape an old
    device or replayed proof was made at is the tuned one (the study's ``shape``); an old interpreter proof's small
    shape was not recorded (a trial's proof never publishes: the final round proves the winner again)."""
    out = {k: v for k, v in data.items() if k not in ("verified", "max_abs_err", "max_rel_err")}
    if out.get("not_winning") is None:
        out.pop("not_winning", None)
    verified, err = data.get("verified"), data.get("max_abs_err")
    if "proof" not in data and verified is not None and isinstance(err, (int, float)):
        kept = verified in (Verifier.DEVICE, Verifier.RECORDED) and isinstance(shape, str)
        out["proof"] = {"verifier": verified, "shapes": [shape] if kept else [],
                        "max_abs_err": data.get("max_abs_err"), "max_rel_err": data.get("max_rel_err")}
    return out

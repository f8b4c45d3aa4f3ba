"""The nightly run's report as records: per job what happened (tune, verify, publish), and the export.

No Prefect here: :mod:`kernsearch.flows.nightly` builds these, the CLI prints them and tests read their fields.
Each record's ``to_json`` is the report's JSON form, one shape for every reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernsearch._vocabulary import Evidence, Word

from ._jobs import Unit


class Outcome(Word):
    """A job's outcome in the run's report (and its counts)."""

    PUBLISHED = "published"  # its winner became current
    REJECTED = "rejected"  # the regression gate refused it
    FAILED = "failed"  # a step failed before the gate


class ExportStatus(Word):
    """What became of the run's export (one per run, after the jobs)."""

    EXPORTED = "exported"
    SKIPPED = "skipped"  # no export folder, or nothing new was published
    FAILED = "failed"


@dataclass(frozen=True)
class Previous:
    """The version that was current before a publish (all None: there was none): the speedup's reference."""

    ms: float | None = None
    version: str | None = None
    evidence: Evidence | None = None


@dataclass(frozen=True)
class Published:
    """What the publish task hands the flow: the gate's decision and what was current before it."""

    published: bool
    version: str | None
    reason: str
    key: str
    current: str | None
    previous: Previous = Previous()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"published": self.published, "version": self.version, "reason": self.reason,
                               "key": self.key, "current": self.current, "old_ms": self.previous.ms,
                               "old_version": self.previous.version}
        if self.previous.version is not None:  # the evidence of a version that exists only
            out["old_evidence"] = _text(self.previous.evidence)
        return out


@dataclass(frozen=True)
class Exported:
    """What the export task built: the package's wheel and the artifacts it ships."""

    out: str
    wheel: str
    package: str
    version: str
    artifacts: tuple[str, ...]
    notes: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"out": self.out, "wheel": self.wheel, "package": self.package, "version": self.version,
                "artifacts": list(self.artifacts), "notes": list(self.notes)}


@dataclass(frozen=True)
class ExportOutcome:
    """The run's export: built (``exported``), or skipped or failed with the reason."""

    status: ExportStatus
    reason: str = ""
    exported: Exported | None = None

    @property
    def out(self) -> str | None:
        return self.exported.out if self.exported is not None else None

    @property
    def wheel(self) -> str | None:
        return self.exported.wheel if self.exported is not None else None

    def to_json(self) -> dict[str, Any]:
        if self.exported is not None:
            return {"status": self.status.value, **self.exported.to_json()}
        return {"status": self.status.value, "reason": self.reason}


@dataclass
class JobRow:
    """One unit of a run, filled in as its steps go (so a failed step leaves what came before it)."""

    job: str
    family: str
    family_ref: str  # the family as the job file names it (a name, or an absolute folder)
    chip: str
    dtype: str
    shape: str
    backend: str
    evidence: Evidence | None = None
    old_ms: float | None = None
    old_version: str | None = None
    new_ms: float | None = None
    speedup: float | None = None
    outcome: Outcome = Outcome.FAILED  # until the gate decides
    version: str | None = None
    reason: str = ""
    study: str | None = None  # this and the three below: set once the tune step has run
    evaluated: int | None = None
    tune_window: tuple[float, float] | None = None  # while the tune step held the GPU slot (epoch seconds)
    report: str | None = None  # the study's HTML report (None: it could not be made)

    @classmethod
    def start(cls, unit: Unit, backend: str) -> JobRow:
        """The row of a unit before any step ran: failed, without a reason yet."""
        return cls(job=unit.job, family=unit.family_name, family_ref=unit.family, chip=unit.chip, dtype=unit.dtype,
                   shape=unit.shape_text, backend=backend)

    @property
    def problem(self) -> str:
        return f"{self.family} {self.dtype} {self.shape}"

    @property
    def verdict(self) -> str:
        """The outcome with the version it made (``published v2``)."""
        return f"{self.outcome}" + (f" {self.version}" if self.version else "")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job": self.job, "family": self.family, "family_ref": self.family_ref, "chip": self.chip,
            "dtype": self.dtype, "shape": self.shape, "backend": self.backend, "evidence": _text(self.evidence),
            "old_ms": self.old_ms, "old_version": self.old_version, "new_ms": self.new_ms, "speedup": self.speedup,
            "outcome": self.outcome.value, "version": self.version, "reason": self.reason}
        if self.study is not None:  # a job whose tune step failed has no study to tell of
            out.update(study=self.study, evaluated=self.evaluated,
                       tune_window=list(self.tune_window) if self.tune_window is not None else None,
                       report=self.report)
        return out


@dataclass(frozen=True)
class NightlyReport:
    """A run of the nightly flow on one machine: its jobs, the export and the outcome counts."""

    chip: str
    machine: str
    job_file: str
    jobs: tuple[JobRow, ...]
    export: ExportOutcome

    def count(self, outcome: Outcome) -> int:
        return sum(r.outcome == outcome for r in self.jobs)

    @property
    def published(self) -> int:
        return self.count(Outcome.PUBLISHED)

    @property
    def rejected(self) -> int:
        return self.count(Outcome.REJECTED)

    @property
    def failed(self) -> int:
        return self.count(Outcome.FAILED)

    @property
    def totals(self) -> str:
        """The counts as the summaries say them."""
        return f"{self.published} published, {self.rejected} rejected, {self.failed} failed"

    def to_json(self) -> dict[str, Any]:
        return {"chip": self.chip, "machine": self.machine, "job_file": self.job_file,
                "jobs": [r.to_json() for r in self.jobs], "export": self.export.to_json(),
                **{o.value: self.count(o) for o in Outcome}}


def _text(word: Evidence | None) -> str | None:
    return word.value if word is not None else None

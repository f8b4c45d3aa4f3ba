"""What a search ends with: why it stopped (:class:`Stop`), its result (:class:`StudyResult`), and what the progress
display shows after each trial (:class:`Progress`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ._final import FinalRound
from ._storage import StudyKey
from ._trial import Trial

__all__ = ["Progress", "Stop", "StopReason", "StudyResult"]


class StopReason(Enum):
    """Why a search ended."""

    BUDGET = "budget"  # the study holds the --trials evaluated configs it was asked for
    TIME_BUDGET = "time budget"
    PATIENCE = "patience"  # no new best in the last --patience evaluated configs
    EXHAUSTED = "exhausted"  # every valid config of the space evaluated
    UNRANKABLE = "cannot rank"  # the objective's times cannot rank the space (a flat performance model)
    STOPPED = "stopped"  # a first Ctrl-C or a stop request: the trial in flight finished first
    INTERRUPTED = "interrupted"  # a second Ctrl-C: the trial in flight was abandoned

    @property
    def by_request(self) -> bool:
        """Cut short by a person (Ctrl-C) or a stop request rather than ended by the search's own limits:
        nothing is published and the CLI exits 130."""
        return self in (StopReason.STOPPED, StopReason.INTERRUPTED)


@dataclass(frozen=True)
class Stop:
    """A :class:`StopReason` with what its message needs; :attr:`text` is what the CLI prints."""

    reason: StopReason
    patience: int | None = None  # PATIENCE: the patience that ran out
    before_run: bool = False  # BUDGET, PATIENCE: already so when this run started (it evaluated nothing)
    evaluated: int = 0  # BUDGET before_run: configs the study already held
    note: str = ""  # UNRANKABLE: why (the objective's message)

    @property
    def text(self) -> str:
        if self.reason is StopReason.UNRANKABLE:
            return self.note or "the performance model cannot rank this space"
        if self.reason is StopReason.BUDGET:
            if not self.before_run:
                return "trial budget reached"
            # a resumed study that already had its budget: say how to go on
            return (f"trial budget reached: the study already has {self.evaluated} configs evaluated and --trials "
                    f"counts the whole study (e.g. --trials {self.evaluated + 50} evaluates 50 more)")
        if self.reason is StopReason.PATIENCE:
            return f"no improvement in {self.patience} trials" + (
                " (before this run started: to search on, raise --patience, or 0 for no early stop)"
                if self.before_run else "")
        return _STOP_TEXT[self.reason]


_STOP_TEXT = {StopReason.TIME_BUDGET: "time budget reached", StopReason.EXHAUSTED: "every valid config evaluated",
              StopReason.STOPPED: "stopped (Ctrl-C or a stop request); finished trials are kept",
              StopReason.INTERRUPTED: "interrupted (Ctrl-C); finished trials are kept"}


@dataclass
class StudyResult:
    study_name: str
    storage: str
    backend: str
    evidence: str
    key: StudyKey
    best: Trial | None  # the final round's winner (the leader when no final round ran)
    top: list[Trial]
    evaluated: int  # distinct configs evaluated in the study (ok + failed)
    failures: Counter[str]
    invalid: int  # proposals rejected before compiling
    elapsed_s: float
    stop: Stop
    final: FinalRound | None = None  # None: no final round ran (nothing correct, or interrupted)
    overhead_s_per_trial: float = 0.0  # time per new trial not spent evaluating (sampler, storage, loop)

    @property
    def stop_reason(self) -> str:
        """Why the search ended, as the CLI prints it."""
        return self.stop.text

    def to_dict(self) -> dict[str, Any]:
        """As ``tune --json`` prints it: ``stop_reason`` the text, ``final`` its stored form."""
        views = {"key": self.key.as_dict(), "best": self.best.summary() if self.best is not None else None,
                 "top": [t.summary() for t in self.top], "stop": self.stop.text,
                 "final": self.final.to_dict() if self.final is not None else {}, "failures": dict(self.failures)}
        return {"stop_reason" if k == "stop" else k: views.get(k, getattr(self, k)) for k in self.__dataclass_fields__}


@dataclass
class Progress:
    """What the progress display shows after each trial."""

    done: int
    total: int | None
    elapsed_s: float
    remaining_s: float | None
    best: Trial | None
    failures: Counter[str]
    invalid: int
    last: str
    baseline_ms: float | None = None

    @property
    def speedup(self) -> float | None:
        """Baseline time / best time so far (measured back-ends only; the final round re-measures)."""
        return self.baseline_ms / self.best.time_ms if self.baseline_ms and self.best else None

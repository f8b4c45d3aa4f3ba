"""The records a result travels in, from the worker that measured it to the manifest that publishes it.

One fact, one shape: a worker returns a :class:`Proof` (where and at which shapes a variant was verified) and a
:class:`Measurement` (its timing); the final round returns :class:`FinalTimings` (every finalist and the MLX op
timed as consumers call them, by mode) and yields a :class:`Winner` (the winning config with its proof and
:class:`Figures`), from which ``Candidate.from_winner`` drafts the manifest. :class:`Figures` is the one record
of a result's figures: the final round's, the winner's and the manifest's (``Measurements`` extends it), validated
wherever it is read (a pydantic model). The others are frozen dataclasses; the ones that travel as JSON (a flow's
steps run in their own processes) read it back with ``from_json``, trusting nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ._vocabulary import ConsumerMode, Evidence, Verifier


@dataclass(frozen=True)
class Proof:
    """Where a variant was proven correct against the float64 reference, and at which shapes (each once); its
    largest errors over them."""

    verifier: Verifier
    shapes: tuple[str, ...]
    max_abs_err: float
    max_rel_err: float | None = None
    #: Of a big shape on the interpreter, when only a sample of its threadgroups ran.
    threadgroups_checked: int | None = None

    @property
    def checks(self) -> int:
        return len(self.shapes)

    def also(self, other: Proof) -> Proof:
        """This proof and ``other`` (a further check of the same variant by the same verifier) as one: every shape
        once, the larger errors. Proofs of two verifiers are not one proof (a ``ValueError``)."""
        if other.verifier != self.verifier:
            raise ValueError(f"a {other.verifier} check cannot extend a proof on the {self.verifier}")
        rel = [e for e in (self.max_rel_err, other.max_rel_err) if e is not None]
        shapes = self.shapes + tuple(s for s in other.shapes if s not in self.shapes)
        return replace(self, shapes=shapes, max_abs_err=max(self.max_abs_err, other.max_abs_err),
                       max_rel_err=max(rel) if rel else None,
                       threadgroups_checked=self.threadgroups_checked or other.threadgroups_checked)

    def to_json(self) -> dict[str, Any]:
        return {"verifier": self.verifier.value, "shapes": list(self.shapes), "max_abs_err": self.max_abs_err,
                "max_rel_err": self.max_rel_err, "threadgroups_checked": self.threadgroups_checked}

    @classmethod
    def from_json(cls, data: Any) -> Proof:
        """A proof read back (from a step's output file); anything malformed is a ``ValueError``."""
        if not isinstance(data, dict) or not isinstance(data.get("shapes"), list) or not data["shapes"]:
            raise ValueError("not a proof")
        threadgroups = data.get("threadgroups_checked")
        return cls(Verifier(data.get("verifier")), tuple(str(s) for s in data["shapes"]),
                   _finite(data.get("max_abs_err")), _finite_or_none(data.get("max_rel_err")),
                   threadgroups if isinstance(threadgroups, int) and not isinstance(threadgroups, bool) else None)


@dataclass(frozen=True)
class Prediction:
    """The performance model's time of one config and its tie-break (both in ms; smaller ranks first): the busiest
    core's time, so that of equal predictions the one with more headroom ranks first."""

    time_ms: float
    tie_break: float

    @property
    def key(self) -> tuple[float, float]:
        return (self.time_ms, self.tie_break)


@dataclass(frozen=True)
class Measurement:
    """A variant's timing in one worker: per-launch (or per-call) samples in ms, their median and relative spread
    ((p90 - p10) / median), the compile time, and whether it stopped early because it could no longer beat the
    incumbent (racing); ``proof``: the check it passed on the device before it was timed."""

    samples_ms: tuple[float, ...]
    median_ms: float
    spread: float
    compile_seconds: float = 0.0
    not_winning: bool = False
    proof: Proof | None = None


@dataclass(frozen=True)
class ModeSamples:
    """One consumer mode of the final round: each finalist's samples (ms per call), in finalist order, and the
    MLX op's (None: the op could not be timed)."""

    finalists: tuple[tuple[float, ...], ...]
    baseline: tuple[float, ...] | None


@dataclass(frozen=True)
class FinalTimings:
    """The final round's samples: finalists and the MLX op interleaved as consumers call them, by mode (graph
    first), with cold weights (``weight_sets`` copies rotated); ``baseline_error``: why the op was not timed.

    A back-end that cannot call kernels as consumers do (a simulation) times them by separate ``launches``
    instead: such timings have no consumer modes, so the gate records them and never ships them as a win."""

    modes: dict[str, ModeSamples]
    weight_sets: int | None = None
    baseline_error: str | None = None
    launches: ModeSamples | None = None
    #: The decision's fresh paired rounds (:func:`~kernsearch.evaluation._consumer.paired_rounds`): per-round ratios
    #: (op / kernel) by mode, of the finalist at index ``paired_finalist`` (the ranking's fastest).
    paired: dict[str, tuple[float, ...]] = field(default_factory=dict)
    paired_finalist: int | None = None
    #: The same finalist against the key's current version (``VariantTask.incumbent``) in fresh paired rounds:
    #: per-round ratios (current / finalist) by mode; empty where no current version was timed.
    against_current: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def ratios(self, index: int) -> dict[str, tuple[float, ...]]:
        """Finalist ``index``'s per-round ratios by mode: the paired rounds where it had them, else the ranking
        rounds' (the op and it timed in the same round)."""
        if index == self.paired_finalist and self.paired:
            return dict(self.paired)
        return {m: tuple(b / f for f, b in zip(s.finalists[index], s.baseline) if f > 0)
                for m, s in self.modes.items() if s.baseline}
    #: The mode that ranks the finalists: the family's first declared one (``graph``, the chain, by default).
    rank_mode: str = ConsumerMode.GRAPH.value

    @property
    def ranking(self) -> ModeSamples:
        """The samples that rank the finalists: the family's judging mode, else the launches."""
        ranked = self.modes.get(self.rank_mode, self.launches)
        if ranked is None:
            raise ValueError(f"final timings without {self.rank_mode}-mode or launch samples")
        return ranked

    @property
    def finalists(self) -> tuple[tuple[float, ...], ...]:
        """Each finalist's samples in the mode that ranks them."""
        return self.ranking.finalists

    @property
    def baseline(self) -> tuple[float, ...] | None:
        return self.ranking.baseline

    def keep(self, indices: list[int]) -> FinalTimings:
        """Only the finalists at ``indices`` (in that order)."""
        def pick(s: ModeSamples) -> ModeSamples:
            return ModeSamples(tuple(s.finalists[i] for i in indices), s.baseline)

        paired = indices.index(self.paired_finalist) if self.paired_finalist in indices else None
        return replace(self, modes={m: pick(s) for m, s in self.modes.items()},
                       launches=pick(self.launches) if self.launches is not None else None,
                       paired=self.paired if paired is not None else {}, paired_finalist=paired,
                       against_current=self.against_current if paired is not None else {})

    def against_current_of(self, index: int) -> dict[str, tuple[float, ...]]:
        """Finalist ``index``'s ratios against the current version (empty: it was not the one timed against it)."""
        return dict(self.against_current) if index == self.paired_finalist else {}


#: One round's ratio (op / kernel): a positive finite number (``_rules.valid_ratios``, as the dispatcher reads it).
Ratio = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]


#: The figures' validators are built when first used (``defer_build``), not when this module is imported: most processes
#: that import it (a search's worker, most commands) never validate one, and building them took ~50 ms of each.
_FROZEN = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class ModeFigures(BaseModel):
    """The winner and the op in one consumer mode (``graph``, ``eager``, ``batch``: docs/timing.md), called through
    the exported package's own planned calls: per-call medians (ms), the speedup with its range (op p10 / winner p90
    .. op p90 / winner p10: the spread shown), and the per-round ratios (op / winner, timed back to back) whose
    interval the gate and the dispatcher act on (``_rules.ratio_interval``; a result judged before paired rounds has
    none and is judged by ``low``)."""

    model_config = _FROZEN

    median_ms: float = Field(gt=0)
    baseline_median_ms: float = Field(gt=0)
    speedup: float = Field(gt=0)
    low: float = Field(gt=0)
    high: float = Field(gt=0)
    ratios: tuple[Ratio, ...] | None = Field(None, min_length=1, max_length=10_000)


class Versus(BaseModel):
    """The winner against the key's current version, both called as consumers call them in fresh paired rounds of one
    final round: per-round ratios (the current version's time / the winner's) by consumer mode. The gate decides a
    replacement on them (``_rules.decide``): two kernels timed back to back in one run, where the two versions'
    speedups over the op come from two runs whose hosts differ by 10 % and more (docs/artifacts.md)."""

    model_config = _FROZEN

    version: str = Field(pattern=r"^v[1-9][0-9]{0,8}$")
    modes: dict[ConsumerMode, Annotated[tuple[Ratio, ...], Field(min_length=1, max_length=10_000)]] = Field(
        min_length=1)


class Figures(BaseModel):
    """What a result measured (or predicted) against the op: the one record of figures that the final round
    (``FinalRound.figures``), the winner (``Winner.figures``) and the manifest (``Measurements``, which adds the raw
    samples) hold, and whose every field the exported package's dispatch record carries (``_rules.dispatch_figures``).
    A figure is added here, once (``tests/test_figures.py`` fails on a second declaration).

    ``median_ms``, ``spread``: the result's own per-call median and relative spread ((p90 - p10) / median: the noise
    the gate must beat); ``baseline_*``: the MLX op's in the same interleaved run; ``speedup`` (baseline median / its
    median) with its range ``speedup_low`` .. ``speedup_high`` (baseline p10 / p90 .. baseline p90 / p10); ``modes``:
    the consumer modes it was timed in (``_rules.consumer_low``: what the gate and the dispatcher act on);
    ``weight_sets``: the rotating copies of the weights those modes called with (cold weights); ``versus``: the
    winner against the key's current version in the same round (:class:`Versus`)."""

    model_config = _FROZEN

    median_ms: float = Field(gt=0)
    spread: float = Field(ge=0)
    baseline_median_ms: float | None = Field(None, gt=0)
    baseline_spread: float | None = Field(None, ge=0)
    speedup: float | None = Field(None, gt=0)
    speedup_low: float | None = Field(None, gt=0)
    speedup_high: float | None = Field(None, gt=0)
    modes: dict[ConsumerMode, ModeFigures] | None = None
    weight_sets: int | None = Field(None, ge=1)
    #: The winner timed against the current version of its key in the same final round (None: there was none to
    #: time, or the search was not publishing).
    versus: Versus | None = None

    @field_validator("modes")
    @classmethod
    def _no_modes(cls, v: dict[ConsumerMode, ModeFigures] | None) -> dict[ConsumerMode, ModeFigures] | None:
        return v or None  # none timed: None, as a manifest has always said it

    def consumer(self) -> dict[str, dict[str, Any]]:
        """The consumer modes' figures as the shared rules read them (``_rules.consumer_low``, ``modes_text``)."""
        return {str(m): f.model_dump(mode="json", exclude_none=True) for m, f in (self.modes or {}).items()}

    def to_json(self) -> dict[str, Any]:
        """Its stored form: every figure that applies (None left out)."""
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def read(cls, data: object) -> Figures | None:
        """Its figures read back from a mapping that holds them among other keys (a stored final round, a winner
        handed between a flow's steps); None where it holds none or they are not valid figures (never trusted)."""
        if not isinstance(data, dict):
            return None
        given = {k: data[k] for k in cls.model_fields if data.get(k) is not None}
        try:
            return cls.model_validate(given)
        except ValidationError:
            return None


@dataclass(frozen=True)
class Winner:
    """What a search publishes: the winning trial's config, its evidence, where it was proven (None: nowhere a
    publish accepts, ``unproven`` says why), and its figures (the final round's, where it ran)."""

    number: int
    config: dict[str, Any]
    evidence: Evidence
    figures: Figures
    study: str | None = None
    proof: Proof | None = None
    unproven: str = ""
    #: the rendered source the proof is of ("": not recorded): a publish of another rendering is refused
    sha256: str = ""

    def proven_also(self, proof: Proof) -> Winner:
        """This winner, verified at further shapes too (a nightly job's extra shapes)."""
        return replace(self, proof=self.proof.also(proof) if self.proof is not None else proof)

    def to_json(self) -> dict[str, Any]:
        """As a flow's tune step hands it to the publish step (its figures beside its other fields)."""
        return {"number": self.number, "config": dict(self.config), "evidence": self.evidence.value,
                "study": self.study, "proof": self.proof.to_json() if self.proof is not None else None,
                "unproven": self.unproven, "sha256": self.sha256, **self.figures.to_json()}

    @classmethod
    def from_json(cls, data: Any) -> Winner:
        """A winner read back; anything malformed is a ``ValueError``."""
        if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
            raise ValueError("not a winner")
        figures = Figures.read(data)
        if figures is None:
            raise ValueError("not a winner: no valid figures")
        number = data.get("number")
        return cls(number if isinstance(number, int) else -1, dict(data["config"]), Evidence(data.get("evidence")),
                   figures, data.get("study") if isinstance(data.get("study"), str) else None,
                   Proof.from_json(data["proof"]) if data.get("proof") is not None else None,
                   str(data.get("unproven") or ""),
                   str(data["sha256"]) if isinstance(data.get("sha256"), str) else "")


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _finite(v: object) -> float:
    number = _number(v)
    if number is None or not math.isfinite(number):
        raise ValueError(f"not a finite number: {v!r}")
    return number


def _finite_or_none(v: object) -> float | None:
    return None if v is None else _finite(v)

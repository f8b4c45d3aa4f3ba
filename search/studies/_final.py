"""The final round of a study as typed data: which leader wins, how it was proven, and what it gains.

A search ends with a final round over its leaders (``Objective.finalize``): measured back-ends re-time the
finalists interleaved with the baseline op (``finalists``, ``speedup`` and its range, ``lead_exceeds_noise``);
the model back-end proves them on the CPU interpreter (``checks``). The round is stored on the study (user
attribute ``final``) and printed by ``tune --json``: :meth:`FinalRound.to_dict` writes the form those have
always had, and :meth:`FinalRound.from_dict` reads it back from a storage it does not trust.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._records import Figures, FinalTimings, ModeFigures, Versus
from .._rules import beats_op, consumer_low
from .._vocabulary import CONSUMER_MODES, Memcheck, Verifier
from ..backends._memcheck import MemcheckResult

if TYPE_CHECKING:
    from ._trial import Trial

__all__ = ["BoundsChecks", "FinalRound", "FinalistCheck", "FinalistTime", "Figures", "ModeFigures", "judge"]


@dataclass(frozen=True)
class BoundsChecks:
    """The out-of-bounds checks a winner passed before it may be published, and where each ran (``docs/msl-subset.md``,
    "Modes and diagnostics"; a publish line says exactly these: :meth:`text`).

    ``device``: its runs on the GPU (the tuned shape and a ragged one) had a poisoned guard zone after every output
    that stayed untouched. ``interpreter``: the target of the template the CPU interpreter ran at a ragged shape in
    check mode, threadgroups reversed, guard zones, and in the sanitizer build (the kernel's own ``metal``, or the
    Metal twin of a ``cuda`` kernel); None: it did not run, ``why_not`` says why. ``memcheck``: a CUDA kernel's own
    verification launches under NVIDIA's memcheck (reads and writes outside any allocation: ``backends._memcheck``),
    clean, or why there is no verdict (None: not asked, a Metal kernel or a record from before). The GPU allows no
    chosen threadgroup order, so a CUDA kernel's is checked only as far as its Metal twin's is."""

    device: bool = False
    interpreter: str | None = None
    target: str = ""  # the published kernel's target
    why_not: str = ""
    memcheck: MemcheckResult | None = None

    def text(self) -> str:
        checks = "sanitizer build, guard zones, reversed threadgroups"
        if not self.device:  # proven on the interpreter alone (a modeled winner)
            return f"checked ({checks})" if self.interpreter else f"not checked ({self.why_not or 'no record'})"
        if self.interpreter and self.interpreter == self.target:
            said = f"; {self.memcheck.text()}" if self.memcheck is not None else ""
            return f"checked (guard zones on the device; {checks} on the interpreter{said})"
        gpu = self._device_text()
        if self.interpreter:
            return f"{gpu}; its {self.interpreter} twin checked on the interpreter ({checks})"
        return f"{gpu}; the interpreter's checks did not run ({self.why_not or 'no record'})"

    def _device_text(self) -> str:
        """What the device checked of a kernel the interpreter did not run itself (a CUDA kernel)."""
        mem, kernel = self.memcheck, f"this {self.target} kernel"
        if mem is not None and mem.state == Memcheck.CLEAN:
            return f"guard zones checked on the device; {mem.text()} (out-of-bounds reads and writes of {kernel}); " \
                   f"threadgroup order of {kernel}: not checked (the GPU allows no chosen order)"
        said = f"; {mem.text()}" if mem is not None else ""
        return f"guard zones checked on the device{said}; out-of-bounds reads and threadgroup order of {kernel}: not " \
               "checked (the GPU allows neither)"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"device": self.device, "interpreter": self.interpreter, "target": self.target,
                             "why_not": self.why_not}
        return d if self.memcheck is None else {**d, "memcheck": self.memcheck.to_dict()}

    @classmethod
    def from_dict(cls, data: object) -> BoundsChecks | None:
        """None when ``data`` is not a record of checks (fields of the wrong type are dropped)."""
        if not isinstance(data, dict):
            return None
        return cls(_flag(data.get("device")) or False, _text(data.get("interpreter")),
                   (_text(data.get("target")) or "")[:40], (_text(data.get("why_not")) or "")[:300],
                   MemcheckResult.from_dict(data.get("memcheck")))


@dataclass(frozen=True)
class FinalistCheck:
    """A finalist checked in the final round (on the CPU interpreter, or on the device at a ragged shape):
    passed (its error, and for the winner the further shapes it passed before it may be published) or
    refused (why)."""

    ok: bool
    max_abs_err: float | None = None
    shape: tuple[int, ...] = ()
    also: tuple[str, ...] | None = None  # the winner's further shapes (tuned, ragged); None: not checked further
    threadgroups_checked: int | None = None  # of the tuned shape, when only a sample of its grid was checked
    reason: str | None = None
    detail: str | None = None
    sha256: str = ""  # the rendered source the check ran (a proof is of that exact kernel)
    bounds: BoundsChecks | None = None  # the winner's out-of-bounds checks (None: none recorded)

    def to_dict(self) -> dict[str, Any]:
        if not self.ok:
            return {"ok": False, "reason": self.reason, "detail": self.detail,
                    **({"shape": list(self.shape)} if self.shape else {})}
        d: dict[str, Any] = {"ok": True, "max_abs_err": self.max_abs_err, "shape": list(self.shape)}
        if self.sha256:
            d["sha256"] = self.sha256
        if self.also is not None:
            d.update(also=list(self.also), threadgroups_checked=self.threadgroups_checked)
        if self.bounds is not None:
            d["bounds"] = self.bounds.to_dict()
        return d

    @classmethod
    def from_dict(cls, data: object) -> FinalistCheck | None:
        """None when ``data`` is not a check (a passed one needs its error)."""
        if not isinstance(data, dict) or not isinstance(data.get("ok"), bool):
            return None
        if not data["ok"]:
            return cls(False, shape=_ints(data.get("shape")), reason=_text(data.get("reason")) or "?",
                       detail=_text(data.get("detail")) or "")
        err = _number(data.get("max_abs_err"))
        if err is None:
            return None
        also = data.get("also")
        return cls(True, err, _ints(data.get("shape")),
                   tuple(str(s) for s in also) if isinstance(also, list) else None,
                   _int(data.get("threadgroups_checked")), sha256=_text(data.get("sha256")) or "",
                   bounds=BoundsChecks.from_dict(data.get("bounds")))


@dataclass(frozen=True)
class FinalistTime:
    """A finalist re-timed in the final round (``spread``: None where the round does not say, e.g. replayed)."""

    median_ms: float
    spread: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"median_ms": self.median_ms} if self.spread is None else \
            {"median_ms": self.median_ms, "spread": self.spread}


#: The figures of the winner's own time: stored once, as its finalist time (``finalists``).
_OWN = ("median_ms", "spread")


@dataclass(frozen=True)
class FinalRound:
    """What the final round decided. ``winner`` None: no finalist is correct (or the round was interrupted).

    Measured: ``finalists`` re-timed; ``figures`` the winner's (its speedup over the baseline op with its range
    when the op was timed, each consumer mode's); ``lead_exceeds_noise`` whether the winner's lead over
    the runner-up exceeds the noise, ``beats_baseline`` whether its lead over the baseline does (where the consumer
    modes were timed: whether their lower bound clears the margin, ``_rules.beats_op``).
    Modeled: ``verified_on`` is ``"interpreter"``, ``checks`` per finalist at ``verify_shape``. Measured:
    ``verified_on`` is ``"device"``, ``verify_shape`` the tuned shape, and ``checks`` the finalists also run on the
    device at a ragged shape (``also``), fastest first, up to the first that passes.
    """

    winner: int | None
    verified_on: str | None = None
    verify_shape: tuple[int, ...] | None = None
    checks: dict[int, FinalistCheck] = field(default_factory=dict)
    finalists: dict[int, FinalistTime] = field(default_factory=dict)
    lead_exceeds_noise: bool | None = None
    beats_baseline: bool | None = None
    baseline_error: str | None = None
    note: str | None = None
    #: The winner's figures as the round timed it against the op (None: the round timed no figures); its
    #: ``speedup_low`` is the smallest lower bound of the consumer modes the family is judged in.
    figures: Figures | None = None

    def verdict(self, number: int) -> str | None:
        """Where trial ``number`` was proven in this round (``interpreter``, ``device``), ``FAIL (reason)``, or
        None when the round did not check it."""
        check = self.checks.get(number)
        if check is None:
            return None
        return (self.verified_on or Verifier.INTERPRETER.value) if check.ok else f"FAIL ({check.reason})"

    def to_dict(self) -> dict[str, Any]:
        """The stored form (study attribute ``final``, ``tune --json``): trial numbers as string keys, figures
        that do not apply left out."""
        d: dict[str, Any] = {"winner": self.winner}
        if self.verified_on is not None:
            d.update(verified_on=self.verified_on, verify_shape=list(self.verify_shape or ()),
                     checks={str(n): c.to_dict() for n, c in self.checks.items()})
            if self.verified_on == Verifier.INTERPRETER:  # as the interpreter's round was always stored (no baseline)
                d["baseline"] = None
        elif self.checks:
            d["checks"] = {str(n): c.to_dict() for n, c in self.checks.items()}
        if self.finalists:
            d["finalists"] = {str(n): t.to_dict() for n, t in self.finalists.items()}
        if self.lead_exceeds_noise is not None:
            d["lead_exceeds_noise"] = self.lead_exceeds_noise
        if self.figures is not None:  # beside the round's fields, as they have always been stored; the winner's own
            d.update({k: v for k, v in self.figures.to_json().items() if k not in _OWN})  # time is its finalist's
        for name in ("beats_baseline", "baseline_error", "note"):
            if getattr(self, name) is not None:
                d[name] = getattr(self, name)
        return d

    @classmethod
    def from_dict(cls, data: object) -> FinalRound | None:
        """A stored round read back; None when there is none (or it is not a mapping). Fields of the wrong
        type are dropped, never trusted."""
        if not isinstance(data, dict) or not data:
            return None
        checks: dict[int, FinalistCheck] = {}
        for key, raw in _mapping(data.get("checks")).items():
            number, check = _trial_number(key), FinalistCheck.from_dict(raw)
            if number is not None and check is not None:
                checks[number] = check
        finalists: dict[int, FinalistTime] = {}
        for key, raw in _mapping(data.get("finalists")).items():
            number, median = _trial_number(key), _number(raw.get("median_ms")) if isinstance(raw, dict) else None
            if number is not None and median is not None:
                finalists[number] = FinalistTime(median, _number(raw.get("spread")))
        shape = data.get("verify_shape")
        winner = _int(data.get("winner"))
        return cls(winner, _text(data.get("verified_on")),
                   _ints(shape) if isinstance(shape, list) else None, checks, finalists,
                   lead_exceeds_noise=_flag(data.get("lead_exceeds_noise")),
                   beats_baseline=_flag(data.get("beats_baseline")), baseline_error=_text(data.get("baseline_error")),
                   note=_text(data.get("note")), figures=_figures(data, finalists.get(winner) if winner is not None
                                                                  else None))


def judge(top: Sequence[Trial], timings: FinalTimings, judged: tuple[str, ...] = CONSUMER_MODES,
          current: str | None = None) -> FinalRound:
    """The winner of the re-timed finalists (``timings``: ``top``'s in order; ranked in graph mode, as consumers
    mostly call) and its speedup over the baseline in every consumer mode, with its per-round ratios (the paired
    rounds' where it had them); ``speedup_low`` is the smallest lower bound over the modes the family is ``judged``
    in (``_rules.consumer_low``: the interval of the median ratio; every mode is recorded). Where the winner was also
    timed against the key's ``current`` version, its ratios are its ``versus`` figures."""
    import numpy as np

    from ..evaluation._measure import lead_exceeds_noise, speedup, spread

    samples, base = [list(x) for x in timings.finalists], timings.baseline
    medians = [float(np.median(x)) for x in samples]
    order = sorted(range(len(top)), key=lambda i: medians[i])
    first = order[0]
    decisive = len(order) < 2 or lead_exceeds_noise(samples[first], samples[order[1]])
    times = {top[i].number: FinalistTime(medians[i], spread(samples[i])) for i in range(len(top))}
    error = timings.baseline_error or None
    own = {"median_ms": medians[first], "spread": spread(samples[first])}
    if not base:
        return FinalRound(top[first].number, finalists=times, lead_exceeds_noise=decisive, baseline_error=error,
                          figures=Figures.model_validate(own))
    s = speedup(samples[first], list(base))
    modes: dict[str, ModeFigures] = {}
    ratios = timings.ratios(first)
    for mode, by in timings.modes.items():
        if by.baseline:
            ms = speedup(list(by.finalists[first]), list(by.baseline))
            modes[mode] = ModeFigures(median_ms=float(np.median(by.finalists[first])),
                                      baseline_median_ms=float(np.median(by.baseline)), speedup=ms.median, low=ms.low,
                                      high=ms.high, ratios=tuple(ratios.get(mode, ())) or None)
    bound = consumer_low({m: f.model_dump(exclude_none=True) for m, f in modes.items()}, judged) if modes else None
    figures = Figures.model_validate({**own, "baseline_median_ms": float(np.median(base)),
                                      "baseline_spread": spread(list(base)), "speedup": s.median,
                                      "speedup_low": s.low if bound is None else bound, "speedup_high": s.high,
                                      "modes": modes, "weight_sets": timings.weight_sets,
                                      "versus": _versus_figures(current, timings.against_current_of(first))})
    return FinalRound(top[first].number, finalists=times, lead_exceeds_noise=decisive,
                      beats_baseline=beats_op(bound) if bound is not None else lead_exceeds_noise(samples[first],
                                                                                                  list(base)),
                      baseline_error=error, figures=figures)


def _versus_figures(current: str | None, ratios: dict[str, tuple[float, ...]]) -> Versus | None:
    """The winner's ratios against the current version, where it was timed against one."""
    return Versus(version=current, modes=ratios) if current is not None and ratios else None


def _figures(data: dict[str, Any], timed: FinalistTime | None) -> Figures | None:
    """A stored round's winner figures: its own time is its finalist time, the others stored beside the round's
    fields (None: no winner timed, or figures that are not valid ones: never trusted)."""
    if timed is None:
        return None
    return Figures.read({**data, "median_ms": timed.median_ms, "spread": timed.spread or 0.0})


def _mapping(v: object) -> dict[Any, Any]:
    return v if isinstance(v, dict) else {}


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _flag(v: object) -> bool | None:
    return v if isinstance(v, bool) else None


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _text(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _ints(v: object) -> tuple[int, ...]:
    return tuple(x for x in v if _int(x) is not None) if isinstance(v, list) else ()


def _trial_number(key: object) -> int | None:
    """A trial number as stored (a string key in JSON)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    return int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else None

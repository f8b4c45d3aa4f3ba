"""Beating the op, a shared rule (``_rules``): whether a measured result beats the MLX op (:func:`beats_op`, the
margin, the consumer modes' lower bound), the statistic that bound is (:func:`decide`: an interval of the median
per-round ratio that narrows with rounds), and how a manifest's figures read and are written out.

Standard library only, Python >= 3.9 (shipped verbatim in every exported package, beside ``_rules.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ._vocabulary import CONSUMER_MODES, ConsumerMode, Verdict

#: A kernel is dispatched only if the lower bound of its measured speedup over the MLX op exceeds 1 + margin. The
#: bound is that of :func:`ratio_interval` over the per-round ratios (op time / kernel time, timed back to back in
#: each round) where a result records them; a result recorded without them (before paired rounds) is judged by the
#: bound it recorded: baseline p10 / kernel p90 of one interleaved run.
DEFAULT_MARGIN = 0.03
#: Two-sided confidence of the interval of the median per-round ratio (each bound holds at 99.5 %): with the few
#: looks of :data:`LOOKS`, a kernel no faster than the op is published in well under 1 % of final rounds, one 3 %
#: slower never (``tests/test_decision.py``, noise drawn from the committed GPU samples).
CONFIDENCE = 0.99
#: The rounds after which the final round asks whether the interval decides (about 1.5x apart: checking after every
#: round would inflate the error of a fixed-confidence interval), and the most rounds it adds.
FIRST_LOOK = 10
LOOK_GROWTH = 1.5
MAX_ROUNDS = 200


def looks(most: int = MAX_ROUNDS) -> Tuple[int, ...]:
    """The round counts at which a sequential final round checks :func:`decide` (10, 15, 22, 33, ..., ``most``)."""
    out: List[int] = []
    n = FIRST_LOOK
    while n < most:
        out.append(n)
        n = max(n + 1, int(n * LOOK_GROWTH))
    return tuple(out) + (most,)


_RANKS: Dict[Tuple[int, float], int] = {}


def median_rank(n: int, confidence: float = CONFIDENCE) -> int:
    """The order statistic (1-based; 0: none) whose value bounds the median of ``n`` ratios from below at
    ``confidence`` (two-sided): the largest k with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2. Distribution-free:
    it holds whatever the noise, heavy tails included, as long as rounds are independent."""
    key = (n, confidence)
    if key not in _RANKS:
        tail, total, k = (1.0 - confidence) / 2, 2 ** n, 0
        below = 0
        for i in range(n + 1):
            below += math.comb(n, i)
            if below / total > tail:
                break
            k = i + 1
        _RANKS[key] = k
    return _RANKS[key]


@dataclass(frozen=True)
class Interval:
    """The median per-round speedup over the op and its interval (:data:`CONFIDENCE`), over ``rounds`` rounds."""

    median: float
    low: float
    high: float
    rounds: int

    def verdict(self, margin: float = DEFAULT_MARGIN) -> Verdict:
        """``faster`` (publish), ``slower`` (keep the op) or ``undecided``."""
        if self.low > 1.0 + margin:
            return Verdict.FASTER
        if self.high < 1.0:
            return Verdict.SLOWER
        return Verdict.UNDECIDED


def valid_ratios(values: Any) -> Optional[List[float]]:
    """``values`` as per-round ratios (positive finite numbers), or None where it is not such a list."""
    if not isinstance(values, (list, tuple)) or not values:
        return None
    out: List[float] = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            return None
        out.append(float(v))
    return out


def ratio_interval(ratios: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The distribution-free interval of the median of per-round ratios: the k-th smallest and k-th largest ratio
    (:func:`median_rank`); with too few rounds for any bound, 0 to infinity (it decides nothing)."""
    xs = sorted(ratios)
    n = len(xs)
    if n == 0:
        return Interval(math.nan, 0.0, math.inf, 0)
    mid = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
    k = median_rank(n, confidence)
    if k == 0:
        return Interval(mid, 0.0, math.inf, n)
    return Interval(mid, xs[k - 1], xs[n - k], n)


def decide(ratios_by_mode: Mapping[str, Sequence[float]], modes: Sequence[str] = CONSUMER_MODES,
           margin: float = DEFAULT_MARGIN) -> Verdict:
    """The verdict over the consumer modes a family is judged in: ``faster`` when every mode's interval is above
    the margin, ``slower`` when any mode's is below 1, else ``undecided`` (a mode not timed decides nothing)."""
    verdicts = [ratio_interval(ratios_by_mode.get(m) or ()).verdict(margin) for m in modes]
    if any(v == Verdict.SLOWER for v in verdicts):
        return Verdict.SLOWER
    if verdicts and all(v == Verdict.FASTER for v in verdicts):
        return Verdict.FASTER
    return Verdict.UNDECIDED


def beats_op(speedup_low: Optional[float], margin: float = DEFAULT_MARGIN) -> bool:
    """The rule of the gate and of dispatch: the measured speedup's lower bound exceeds 1 + margin."""
    return speedup_low is not None and math.isfinite(speedup_low) and speedup_low > 1.0 + margin


def speedup_text(speedup: Optional[float], low: Optional[float], high: Optional[float]) -> str:
    """``0.26x (range 0.25-0.27)`` or ``no measured speedup``."""
    if speedup is None:
        return "no measured speedup"
    rng = f" (range {low:.2f}-{high:.2f})" if low is not None and high is not None else ""
    return f"{speedup:.2f}x{rng}"


def mode_interval(figures: Any) -> Optional[Interval]:
    """The interval of one mode's recorded per-round ratios (``{"ratios": [...]}``), None where it has none."""
    ratios = valid_ratios(figures.get("ratios")) if isinstance(figures, dict) else None
    return ratio_interval(ratios) if ratios is not None else None


def consumer_low(figures: Optional[Dict[str, Any]], modes: Sequence[str] = CONSUMER_MODES) -> Optional[float]:
    """The smallest lower bound of a measured speedup over ``modes`` (``{"graph": {"ratios": [...], "low": ...},
    ...}``): a mode's :func:`ratio_interval` where it recorded per-round ratios, else its recorded ``low`` (a result
    judged before paired rounds); None where a mode was not timed (a result judged otherwise, e.g. by separate
    launches)."""
    lows: List[float] = []
    for m in modes:
        f = (figures or {}).get(m)
        interval = mode_interval(f)
        if interval is not None:
            lows.append(interval.low)
            continue
        low = f.get("low") if isinstance(f, dict) else None
        if not isinstance(low, (int, float)) or isinstance(low, bool):
            return None
        lows.append(float(low))
    return min(lows) if lows else None


def consumer_verdict(figures: Optional[Dict[str, Any]], modes: Sequence[str] = CONSUMER_MODES,
                     margin: float = DEFAULT_MARGIN) -> Verdict:
    """What a measured result's consumer figures say: ``faster`` when :func:`consumer_low` clears the margin,
    ``slower`` when a mode's upper bound (its interval's, else its recorded ``high``) is below 1, else
    ``undecided`` (what the gate, ``rejudge``, the report and ``explain`` say of a result that is not dispatched)."""
    if beats_op(consumer_low(figures, modes), margin):
        return Verdict.FASTER
    for m in modes:
        f = (figures or {}).get(m)
        interval = mode_interval(f)
        high = interval.high if interval is not None else (f.get("high") if isinstance(f, dict) else None)
        if isinstance(high, (int, float)) and not isinstance(high, bool) and high < 1.0:
            return Verdict.SLOWER
    return Verdict.UNDECIDED


def consumer_figures(measurements: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """A manifest's consumer-mode figures (its ``measurements``' ``modes``) as they read today. ``graph`` is a
    chain of dependent calls only where the manifest records the chain's length (``chain_calls``); before chains,
    ``graph`` timed independent calls in one evaluation, so such figures read as ``batch`` (never as a chain's)."""
    modes = (measurements or {}).get("modes")
    if not isinstance(modes, dict):
        return None
    if (measurements or {}).get("chain_calls") is None and ConsumerMode.GRAPH in modes:
        modes = {(ConsumerMode.BATCH.value if m == ConsumerMode.GRAPH else m): f for m, f in modes.items()
                 if m != ConsumerMode.BATCH}
    return modes


#: What of a manifest's ``measurements`` a dispatch record does not carry: the raw samples (its figures sum them up),
#: the chain's length (by which :func:`consumer_figures` reads its modes) and the rounds against the version it
#: replaced (``versus``: the gate's evidence; the dispatcher acts on the figures against the op).
NOT_DISPATCHED = ("samples_ms", "chain_calls", "versus")


def dispatch_figures(measurements: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """A manifest's figures as its dispatch record carries them (``decision_fields``): every figure its
    ``measurements`` hold (kernsearch's one ``Figures`` record, validated by the store), the consumer modes as they
    read today. Not a list of names: a figure added to the record is carried, and checked before first use."""
    meas = measurements or {}
    return {**{k: v for k, v in meas.items() if k not in NOT_DISPATCHED}, "modes": consumer_figures(meas)}


def modes_text(figures: Optional[Dict[str, Any]], modes: Sequence[str] = CONSUMER_MODES) -> str:
    """``1.45x (range 1.30-1.60; paired rounds 1.44x, 99% interval 1.38-1.52 over 22 rounds) graph, 1.20x (range
    1.10-1.30) eager``: the final round's ratio of medians with its p10/p90 range, then, where the mode has paired
    rounds, the median of their per-round ratios and its interval, which decide. The two come from different
    rounds and may disagree; both are said, so that a headline outside the interval is not read as the bound's."""
    parts = []
    for m in modes:
        f = (figures or {}).get(m)
        if isinstance(f, dict):
            text = speedup_text(f.get("speedup"), f.get("low"), f.get("high"))
            interval = mode_interval(f)
            if interval is not None:
                paired = f"paired rounds {interval.median:.2f}x, {interval_text(interval)}"
                text = f"{text[:-1] if text.endswith(')') else text + ' ('}; {paired})"
            parts.append(f"{text} {m}")
    return ", ".join(parts) or "no consumer timing"


def interval_text(interval: Interval) -> str:
    """``99% interval 1.38-1.52 over 22 rounds``."""
    return (f"{CONFIDENCE:.0%} interval {interval.low:.2f}-{interval.high:.2f} over {interval.rounds} rounds"
            if math.isfinite(interval.high) else f"no interval from {interval.rounds} rounds")

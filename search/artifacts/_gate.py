"""The regression gate: whether a correct candidate may become a key's current version, and whether a
measured result beats the MLX op it replaces.

A candidate that failed verification is refused (by the store, before the gate); a lower evidence kind never
replaces a higher one (modeled never replaces measured); otherwise a candidate becomes current if there is no
current version, the current one is invalidated (explicitly, unreadable, or measured with a different compile
toolchain or on a different device), or it is faster by more than the measured noise. Pure functions of the
draft manifest (:class:`~kernsearch.artifacts._candidate.Draft`) and the current one: the store
(:mod:`kernsearch.artifacts._artifacts`) reads, locks and writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._rules import (
    DEFAULT_MARGIN,
    beats_op,
    consumer_low,
    consumer_verdict,
    decide,
    identity_changes,
    interval_text,
    mode_interval,
    modes_text,
    ratio_interval,
)
from .._vocabulary import CONSUMER_MODES, EVIDENCE_RANK, ConsumerMode, Evidence, Verdict
from ._manifest import MODELED_POLICY, Manifest, Measurements

if TYPE_CHECKING:
    from ._candidate import Draft


def loses_to_baseline(evidence: str, measurements: Measurements | None, op: str, margin: float = DEFAULT_MARGIN,
                      version: str | None = None, modes: Sequence[str] = CONSUMER_MODES) -> str:
    """Why a result may not be dispatched ('' when it beats the op by more than the margin, or is not measured:
    modeled and interpreted results are never dispatched by default anyway, docs/artifacts.md)."""
    if evidence != Evidence.MEASURED:
        return ""
    m = measurements
    what = f"{version} " if version else ""
    if m is None or not m.baseline_median_ms or m.speedup_low is None:
        return f"{what}has no measured speedup over {op} (the baseline was not timed in the same run)"
    figures: dict[str, Any] | None = {str(mode): t.model_dump() for mode, t in m.modes.items()} if m.modes else None
    low = consumer_low(figures, tuple(modes))
    if low is None and figures:
        return (f"{what}has no {' and '.join(modes)} figures ({modes_text(figures, sorted(figures))}: timed before "
                "chains, graph read as batch): never dispatched until re-timed in the chain")
    if low is None:
        return (f"{what}was not timed as consumers call it (no {' and '.join(modes)} figures through the "
                f"package's call path): never dispatched")
    if beats_op(low, margin):
        return ""
    said = {Verdict.SLOWER: "slower than the op; ", Verdict.UNDECIDED: "not decided; "}.get(
        consumer_verdict(figures, tuple(modes), margin), "")
    return (f"{what}{modes_text(figures, tuple(modes))} of {op} (measured as consumers call it; {said}needs a lower "
            f"bound above {1 + margin:.2f}x)")


def gate(draft: Draft, current: Manifest | None, invalid: str | None, min_gain: float = 0.0,
         modes: Sequence[str] = CONSUMER_MODES) -> tuple[bool, str]:
    """Decide whether a (correct) candidate replaces the current version; returns (publish, reason). ``modes``: the
    consumer modes the family is judged in. A modeled candidate that becomes current says what that means
    (:data:`MODELED_POLICY`)."""
    publish, reason = _gate(draft, current, invalid, min_gain, modes)
    if publish and draft.evidence == Evidence.MODELED:
        reason += f"; {MODELED_POLICY}"
    return publish, reason


def _gate(draft: Draft, current: Manifest | None, invalid: str | None, min_gain: float,
          modes: Sequence[str]) -> tuple[bool, str]:
    evidence = draft.evidence
    if current is None:
        return True, f"{invalid}; replaced by a correct {evidence} result" if invalid else \
            f"first version for this key ({evidence})"
    if invalid:
        return True, f"{invalid}; replaced by a correct {evidence} result"
    old_rank, new_rank = EVIDENCE_RANK[current.evidence], EVIDENCE_RANK[evidence]
    if new_rank < old_rank:
        return False, (f"{evidence} results never replace {current.evidence} ones "
                       f"(current {current.version} is {current.evidence})")
    if current.evidence == Evidence.MEASURED:
        replaces = _measured_anew(draft, current)
        if replaces:
            return True, replaces
    if new_rank > old_rank:
        return True, f"{evidence} result replaces {current.evidence} {current.version}"
    return _faster(draft, current, min_gain, modes)


def _measured_anew(draft: Draft, current: Manifest) -> str:
    """Why a measured current version gives way whatever the timings say (its toolchain changed; it was timed by
    separate launches, or before chains, where the draft was judged as consumers call it in the chain), or ''."""
    new = draft.measurements
    changed = _identity_changes(current, draft)
    if changed:
        return f"current {current.version} invalidated: {changed}"
    if new is None or not new.modes:
        return ""
    old_modes = current.measurements.modes if current.measurements else None
    if not old_modes:
        return f"judged as consumers call it; replaces {current.version}, which was timed by separate launches only"
    if ConsumerMode.GRAPH in new.modes and ConsumerMode.GRAPH not in old_modes:
        return (f"judged in the chain (graph mode: dependent calls); replaces {current.version}, whose consumer "
                "figures predate chains")
    return ""


def _faster(draft: Draft, current: Manifest, min_gain: float, modes: Sequence[str]) -> tuple[bool, str]:
    """Two results of one evidence kind. Where the new one was timed against the current version itself, in paired
    rounds of its final round (``Figures.versus``), those decide alone (:func:`_versus`). Else the new one replaces the
    current when, as consumers call it, its interval of the speedup over the op lies above the current's (each
    measured against the op in its own run: the ratio carries across runs where absolute times do not); else only
    beyond the measured noise of the two medians."""
    new, old = draft.measurements, current.measurements
    if new is None or old is None:
        return False, (f"no timing to compare ({draft.evidence} evidence is correctness only); "
                       f"current {current.version} stays")
    paired = _versus(new, current.version, min_gain, modes)
    if paired is not None:
        return paired
    above = _interval_above(new, old) if min_gain == 0 else ""
    if above:
        return True, (f"faster than {current.version} as consumers call it: its speedup over the op lies above "
                      f"{current.version}'s ({above})")
    gain = (old.median_ms - new.median_ms) / old.median_ms
    noise = max(new.spread, old.spread)
    needed = noise + min_gain
    figures = (f"{new.median_ms:.4g} ms vs {current.version}'s {old.median_ms:.4g} ms "
               f"({gain:+.1%}; noise {noise:.1%}{f', required gain {min_gain:.1%}' if min_gain else ''})")
    if gain > needed:
        return True, f"faster than {current.version} beyond the noise: {figures}"
    return False, f"not faster than {current.version} beyond the noise: {figures}"


def _versus(new: Measurements, version: str, min_gain: float, modes: Sequence[str]) -> tuple[bool, str] | None:
    """The decision of the new result's paired rounds against ``version`` (the current one), where it was timed
    against that very version: faster when, in every mode the family is judged in (``modes``, as its win over the op
    is judged and its final round stopped), the interval of the median ratio (current / new) lies above 1 + the
    margin (``min_gain`` where larger), as ``_rules.decide`` judges a kernel against the op; None where it was not
    timed against it (another version, or none). Every mode timed is said."""
    vs = new.versus
    if vs is None or vs.version != version:
        return None
    ratios = {str(m): r for m, r in vs.modes.items()}
    margin = max(DEFAULT_MARGIN, min_gain)
    intervals = {m: ratio_interval(r) for m, r in sorted(ratios.items())}
    said = "; ".join(f"{m} {interval_text(i)} (median {i.median:.2f}x)" for m, i in intervals.items())
    if decide(ratios, tuple(modes), margin) == Verdict.FASTER:
        return True, f"faster than {version} in paired rounds of one run, as consumers call them: {said}"
    return False, (f"not faster than {version} by more than {margin:.0%} in paired rounds of one run, as consumers "
                   f"call them: {said}")


def _interval_above(new: Measurements, old: Measurements) -> str:
    """The figures, where in every consumer mode both timed with paired rounds the new interval's lower bound is above
    the old interval's upper bound; '' otherwise (a mode without per-round ratios, or intervals that overlap)."""
    said = []
    for mode in sorted(set(new.modes or {}) & set(old.modes or {})):
        a, b = mode_interval((new.modes or {})[mode].model_dump()), mode_interval((old.modes or {})[mode].model_dump())
        if a is None or b is None or not a.low > b.high:
            return ""
        said.append(f"{mode} {a.low:.2f}-{a.high:.2f}x vs {b.low:.2f}-{b.high:.2f}x")
    return "; ".join(said)


def _identity_changes(current: Manifest, draft: Draft) -> str:
    """What changed since the current (measured) version was measured: toolchain or device."""
    changes = identity_changes(current.toolchain.timing_identity(), draft.toolchain.timing_identity(),
                               known_only=False, arrow="→")
    old_dev, new_dev = current.chip.detected, draft.chip.detected
    for k in ("architecture", "device_name"):
        if new_dev and old_dev.get(k) != new_dev.get(k):
            changes.append(f"device {k} {old_dev.get(k)} → {new_dev.get(k)}")
    return ("toolchain changed (" if changes else "") + ", ".join(changes) + (")" if changes else "")

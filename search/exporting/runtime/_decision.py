"""Choosing what a call runs: :class:`Decision` (what and why), the fallback chain's :data:`LEVELS` and
:class:`Chooser`, the dispatcher's half that applies the dispatch rules of docs/artifacts.md. Part of the
run-time dispatcher, copied verbatim into every exported package."""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

try:  # an exported package: the shared modules sit beside this file
    from ._rules import (  # type: ignore[import-not-found,unused-ignore]
        beats_op,
        consumer_low,
        cuda_driver_version,
        evaluate,
        identity_changes,
        lineage,
        modes_text,
        nvrtc_version,
        source_sha256,
        speedup_text,
        timing_identity,
    )
    from ._vocabulary import CONSUMER_MODES, Evidence  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # kernsearch itself: the same modules, at the bottom of its package
    from ..._rules import (
        beats_op,
        consumer_low,
        cuda_driver_version,
        evaluate,
        identity_changes,
        lineage,
        modes_text,
        nvrtc_version,
        source_sha256,
        speedup_text,
        timing_identity,
    )
    from ..._vocabulary import CONSUMER_MODES, Evidence

from ._checks import _bind_dims, _context, _files, _read_inside, artifact_mismatch, violation
from ._fronts import DISABLE_VAR, MAX_DECISIONS

LEVELS = ("exact chip", "same generation and die", "same generation", "family default", "mlx op")
# Dispatch rules (docs/artifacts.md): a level uses an artifact only with measured evidence, on that chip, that
# it beats the MLX op by more than the margin (modeled ones only when the consumer opts in; interpreted ones
# never); other chips' artifacts only for families that allow the transfer; a kernel only at a shape it was judged
# at (timed against the op as consumers call it); the family default only where a measured artifact shows the
# default config beating the op on this chip at this shape; a measured artifact is void when the toolchain that
# timed it changed.


@dataclass(frozen=True)
class _Ask:
    """What a decision is asked for: the family's record, the call's dimensions and shape, the running chip's record,
    the dtype, the target, the op's name (for the reasons) and the consumer's opt-in to modeled artifacts."""

    fam: Dict[str, Any]
    dims: Dict[str, int]
    shape: Tuple[int, ...]
    chip: Dict[str, Any]
    dtype: str
    target: str
    op: str
    modeled: bool


@dataclass
class Decision:
    """Which kernel (or fallback) a call uses, and why."""

    family: str
    level: str
    chip: str
    shape: Tuple[int, ...]
    dtype: str
    entry: Optional[Dict[str, Any]] = None  # the artifact or default kernel chosen (None: the MLX op)
    why: List[str] = field(default_factory=list)

    @property
    def artifact(self) -> Optional[str]:
        """``key/version`` of the chosen artifact, None for the default config or the MLX op."""
        if self.entry and "key" in self.entry:
            return f"{self.entry['key']}/{self.entry['version']}"
        return None

    @property
    def config(self) -> Optional[Dict[str, Any]]:
        return dict(self.entry["config"]) if self.entry else None

    def judged_low(self, mode: str) -> Optional[float]:
        """The lower bound of the ``mode`` figure the chosen artifact was published on (its gate's paired rounds);
        None for the default config or the MLX op (no artifact of its own)."""
        return consumer_low(self.entry.get("modes"), (mode,)) if self.entry and self.artifact else None

    def __str__(self) -> str:
        what = self.artifact or ("default config" if self.entry else "plain MLX op")
        lines = [f"{self.family} {'x'.join(map(str, self.shape))} {self.dtype} on {self.chip}: "
                 f"{self.level} -> {what}"]
        return "\n".join(lines + [f"  - {w}" for w in self.why])


def _reachable(a: Dict[str, Any], fam: Dict[str, Any], chip: Dict[str, Any]) -> bool:
    """Whether a level of the chain could take artifact ``a`` on ``chip`` at all: its own chip's, or, where the
    family allows transferring a kernel, one of the same generation (the default config's proof is this chip's)."""
    if a["chip"] == chip["name"]:
        return True
    running, theirs = lineage(chip), tuple(a["lineage"])
    return bool(fam.get("transfer")) and any(r is not None and r == t for r, t in zip(running[:2], theirs[:2]))


_TOOLCHAIN: Dict[str, Optional[str]] = {}


def _running_toolchain() -> Dict[str, Optional[str]]:
    """This process's timing identity, detected once (MLX, OS, macOS, CUDA driver, NVRTC)."""
    if not _TOOLCHAIN:
        import platform

        try:
            import mlx.core as mx

            mlx_version: Optional[str] = str(getattr(mx, "__version__", "unknown"))
        except ImportError:
            mlx_version = None
        macos = platform.mac_ver()[0] or None
        nvidia = platform.system() == "Linux"
        _TOOLCHAIN.update(timing_identity(mlx_version, platform.system(), macos,
                                          cuda_driver_version() if nvidia else None,
                                          nvrtc_version() if nvidia else None))
    return _TOOLCHAIN


class Chooser:
    """The choosing half of :class:`~._runtime.Dispatcher` (its base class): which kernel, default config or op a
    call runs on a chip, by the fallback chain and the rules above, with every artifact's integrity and kernel
    files checked before it is taken. The state it reads is the dispatcher's (set in its ``__init__``)."""

    root: Path
    table: Dict[str, Any]
    margin: float
    toolchain: Optional[Dict[str, Optional[str]]]
    _decisions: Dict[Any, Decision]
    _sources: Dict[Tuple[str, str, str], Optional[Dict[str, Any]]]
    _refused: Dict[Tuple[str, str, str], str]
    _verdicts: Dict[int, Tuple[Dict[str, Any], str]]

    def running_chip(self, chip: Any = None) -> Tuple[Dict[str, Any], str]:
        """(chip record, target) of the chip a call runs on: the dispatcher's."""
        raise NotImplementedError

    def _family(self, family: str) -> Dict[str, Any]:
        try:
            entry: Dict[str, Any] = self.table["families"][family]
            return entry
        except KeyError:
            raise ValueError(f"unknown family {family!r} (this package has: "
                             f"{', '.join(self.table['families'])})") from None

    # -- choosing --------------------------------------------------------------------------------------
    def decide(self, family: str, shapes: Sequence[Sequence[int]], dtype: str, chip: Any = None,
               modeled: bool = False) -> Decision:
        """``modeled``: also use modeled (never measured) artifacts, as ``KERNSEARCH_KERNELS=modeled`` does."""
        fam = self._family(family)
        record, target = self.running_chip(chip)
        modeled = modeled or os.environ.get(DISABLE_VAR, "").lower() == Evidence.MODELED
        if os.environ.get(DISABLE_VAR, "").lower() in ("0", "off", "no", "false"):
            dims, _ = _bind_dims(fam, shapes)
            decision = Decision(family, LEVELS[4], record["name"], tuple((dims or {}).values()), dtype)
            decision.why.append(f"tuned kernels switched off ({DISABLE_VAR}={os.environ[DISABLE_VAR]})")
            return decision
        cache_key = (family, tuple(tuple(s) for s in shapes), dtype, record["name"], target, modeled)
        if cache_key in self._decisions:
            return self._decisions[cache_key]
        decision = self._decide(fam, family, shapes, dtype, record, target, modeled)
        if len(self._decisions) >= MAX_DECISIONS:  # many distinct shapes: start over rather than grow
            self._decisions.clear()
        self._decisions[cache_key] = decision
        return decision

    def _decide(self, fam: Dict[str, Any], family: str, shapes: Sequence[Sequence[int]], dtype: str,
                chip: Dict[str, Any], target: str, modeled: bool = False) -> Decision:
        """The fallback chain (:data:`LEVELS`): an artifact of this chip, of its die, of its generation
        (:meth:`_take_tuned`), the family default (:meth:`_take_default`), else the op; each step's why recorded."""
        dims, problem = _bind_dims(fam, shapes)
        shape = tuple(dims[d] for d in fam["dims"]) if dims else tuple()
        decision = Decision(family, LEVELS[4], chip["name"], shape, dtype)
        if dims is None:
            decision.why.append(f"inputs do not match the family's inputs ({problem})")
        elif dtype not in fam["dtypes"]:
            decision.why.append(f"dtype {dtype} is not one the family supports ({', '.join(fam['dtypes'])})")
        elif not target:
            decision.why.append(f"no GPU back-end here (chip {chip['name']}): custom kernels need Metal or CUDA")
        else:
            ask = _Ask(fam, dims, shape, chip, dtype, target, fam.get("baseline_name", "the MLX op"), modeled)
            pool = [a for a in fam["artifacts"] if a["dtype"] == dtype and a["target"] == target]
            if self._take_tuned(decision, ask, pool) or self._take_default(decision, ask, pool):
                self._layout_note(decision, fam, dims, chip)
            else:
                decision.why.append(f"mlx op: {ask.op}")
        return decision

    def _take_tuned(self, decision: Decision, ask: _Ask, pool: List[Dict[str, Any]]) -> bool:
        """The first of the three artifact levels with a usable artifact (the fastest there) taken into
        ``decision``; True if one was."""
        running = lineage(ask.chip)
        tests: Tuple[Callable[[Dict[str, Any]], bool], ...] = (
            lambda a: bool(a["chip"] == ask.chip["name"]),
            lambda a: running[1] is not None and tuple(a["lineage"])[1] == running[1],
            lambda a: running[0] is not None and tuple(a["lineage"])[0] == running[0])
        seen: Set[int] = set()
        for level, matches in zip(LEVELS[:3], tests):
            here = [a for a in pool if matches(a) and id(a) not in seen]
            seen.update(id(a) for a in here)
            if not here:
                decision.why.append(f"{level}: no {ask.target} {ask.dtype} artifact")
            elif level != LEVELS[0] and not ask.fam.get("transfer"):
                decision.why.append(f"{level}: {len(here)} artifact(s) of other chips skipped: the family does not "
                                    "allow transferring a kernel between chips")
            elif self._take_level(decision, ask, level, here):
                return True
        return False

    def _take_level(self, decision: Decision, ask: _Ask, level: str, here: List[Dict[str, Any]]) -> bool:
        """The fastest usable artifact of ``here`` taken at ``level``; True if one was (else why none was)."""
        valid, reasons = [], []
        for a in here:
            bad = self._unusable(a, ask.fam, ask.dims, ask.shape, ask.chip, ask.dtype, ask.op, ask.modeled)
            (reasons.append(f"{a['key']}/{a['version']} skipped: {bad}") if bad else valid.append(a))
        if not valid:
            decision.why.append(f"{level}: " + "; ".join(reasons))
            return False
        best = min(valid, key=lambda a: a.get("median_ms") or math.inf)
        decision.level, decision.entry = level, best
        decision.why.append(f"{level}: {best['key']}/{best['version']} taken: "
                            f"{self._evidence_text(best, ask.op, ask.fam)}, tuned for "
                            f"{'x'.join(map(str, best['shape']))}, nearest valid of {len(valid)}"
                            + (f"; passed over: {'; '.join(reasons)}" if reasons else ""))
        return True

    def _take_default(self, decision: Decision, ask: _Ask, pool: List[Dict[str, Any]]) -> bool:
        """The family's untuned default config taken into ``decision`` where a measured artifact shows it beating
        the op on this chip at this shape; True if it was (else why not)."""
        fam, chip, op, why = ask.fam, ask.chip, ask.op, decision.why
        default = fam["default"]["kernels"].get(f"{ask.target}:{ask.dtype}")
        proof = [a for a in pool if a["chip"] == chip["name"] and a["config"] == fam["default"]["config"]
                 and not self._unusable(a, fam, None, ask.shape, chip, ask.dtype, op, False)]  # at this shape
        if default is None:
            why.append(f"family default: no {ask.target} {ask.dtype} kernel in this package")
            return False
        if not proof:
            why.append(f"family default: skipped: no measured evidence that the default config beats {op} on "
                       f"{chip['name']}")
            return False
        bad = violation(fam, fam["default"]["config"], ask.dims, chip, ask.dtype) or self._refusal(default)
        if bad:
            why.append(f"family default: skipped: {bad}")
            return False
        decision.level, decision.entry = LEVELS[3], default
        why.append(f"family default: taken: {proof[0]['key']}/{proof[0]['version']} measured the default config at "
                   f"{self._evidence_text(proof[0], op, fam)}")
        return True

    @staticmethod
    def _layout_note(decision: Decision, fam: Dict[str, Any], dims: Optional[Dict[str, int]],
                     chip: Dict[str, Any]) -> None:
        """Which layout the chosen kernel expects: the inputs it takes pre-transposed (e.g. qmatvec's
        LAYOUT_Q=cols: packed words, scales and biases as [K*BITS/32, N]) and the packing applied to them."""
        if decision.entry is None or dims is None:
            return
        try:
            names = _context(fam, decision.entry["config"], dims, chip, decision.dtype)
            moved = [spec["name"] for spec in fam["inputs"]
                     if spec["transposed"] is not None and bool(evaluate(spec["transposed"], names))]
        except Exception:  # noqa: BLE001 - the note is informative; the launch re-evaluates and reports
            return
        layout = ", ".join(f"{k}={v}" for k, v in decision.entry["config"].items() if "LAYOUT" in k)
        if moved:
            decision.why.append(f"layout ({layout}): the kernel takes {', '.join(moved)} transposed (contiguous); "
                                "packing: mx.transpose of each, applied by this package on every call (pack once "
                                "and cache the result where the weights are constant)")
        elif layout:
            decision.why.append(f"layout ({layout}): inputs as given (MLX's own layout)")

    def _unusable(self, a: Dict[str, Any], fam: Dict[str, Any], dims: Optional[Dict[str, int]],
                  shape: Tuple[int, ...], chip: Dict[str, Any], dtype: str, op: str, modeled: bool) -> str:
        """'' if artifact ``a`` may run this call, else why not (the rules of docs/artifacts.md), in this order:
        invalidated, tampered, its evidence (:meth:`_evidence_refusal`), its shape and config here."""
        if a.get("invalidated"):  # declined before anything is read: its kernel files were never shipped
            return f"invalidated: {a['invalidated']}"
        tampered = self._integrity(a)
        if tampered:
            return f"refused: {tampered}"
        bad = self._evidence_refusal(a, fam, op, modeled)
        if bad:
            return bad
        if shape and tuple(a["shape"]) != tuple(shape):
            return (f"judged at {'x'.join(map(str, a['shape']))}, not at {'x'.join(map(str, shape))} (a kernel runs "
                    "only at a shape it was measured to win at)")
        if dims is not None:
            return violation(fam, a["config"], dims, chip, dtype) or self._refusal(a)
        return ""

    def _evidence_refusal(self, a: Dict[str, Any], fam: Dict[str, Any], op: str, modeled: bool) -> str:
        """'' where ``a``'s evidence lets it run (measured to beat the op as consumers call it, with this
        toolchain; modeled where the consumer opted in), else why not."""
        evidence = a.get("evidence")
        if evidence == Evidence.INTERPRETED:
            return "interpreted (correctness only): never dispatched"
        if evidence == Evidence.MODELED:
            return "" if modeled else \
                f"modeled, not measured: never shown to beat {op} (opt in with {DISABLE_VAR}=modeled)"
        if evidence != Evidence.MEASURED:
            return f"unknown evidence kind {evidence!r}"
        low = consumer_low(a.get("modes"), fam.get("modes") or CONSUMER_MODES)
        if low is None and a.get("modes"):
            judged = " and ".join(fam.get("modes") or CONSUMER_MODES)
            return (f"not timed in {judged} mode, which judges this family (it has "
                    f"{modes_text(a['modes'], sorted(a['modes']))}): re-time it (benchmarks/gpu_rejudge.py)")
        if low is None:
            old = speedup_text(a.get("speedup"), a.get("speedup_low"), a.get("speedup_high"))
            return (f"measured by separate launches, not as consumers call it ({old}): re-judge it "
                    "(kernsearch artifacts rejudge)")
        if not beats_op(low, self.margin):
            return self._evidence_text(a, op, fam)
        changed = self._toolchain_change(a.get("timing_identity") or {})
        return f"measured with another toolchain ({changed}): its timing no longer holds" if changed else ""

    @staticmethod
    def _evidence_text(a: Dict[str, Any], op: str, fam: Optional[Dict[str, Any]] = None) -> str:
        if a.get("evidence") == Evidence.MEASURED:
            modes = (fam or {}).get("modes") or CONSUMER_MODES
            return f"{modes_text(a.get('modes'), modes)} of {op} (measured as consumers call it)"
        return f"{a.get('evidence')} (opted in; not measured)"

    def _toolchain_change(self, recorded: Dict[str, Any]) -> str:
        """What differs between the toolchain an artifact was timed with and this process's ('' if nothing)."""
        here = self.toolchain if self.toolchain is not None else _running_toolchain()
        return ", ".join(identity_changes(recorded, here))

    def _integrity(self, a: Dict[str, Any]) -> str:
        """'' if artifact ``a`` is what the store recorded at publish (:func:`artifact_mismatch`), checked on its
        first use in this process; else why not (with a ``RuntimeWarning``): a forged record is never used."""
        seen = self._verdicts.get(id(a))
        if seen is None or seen[0] is not a:
            why = artifact_mismatch(self.root, a)
            if why:
                warnings.warn(f"artifact {str(a.get('key'))[:200]}/{str(a.get('version'))[:20]}: {why}; not used",
                              RuntimeWarning, stacklevel=5)
            seen = self._verdicts[id(a)] = (a, why)
        return seen[1]

    def _refusal(self, entry: Dict[str, Any]) -> str:
        """'' if the entry's kernel files are intact, else why it is refused."""
        return "" if self._source(entry) is not None else f"refused: {self._refused[_files(entry)]}"

    def _source(self, entry: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """The kernel's source record, read once per pair of files and hash-checked; None (with a
        warning) if tampered. The verdict belongs to the files: one tampered copy of a kernel never
        refuses an intact copy elsewhere, and a tampered copy is never shown usable."""
        sha = entry["sha256"]
        where = _files(entry)
        if where not in self._sources:
            record = None
            try:
                header = _read_inside(self.root, entry["header"])
                source = _read_inside(self.root, entry["source"])
                k = entry["kernel"]
                actual = source_sha256(header, source, k["template"], k["input_names"], k["output_names"])
                if actual != sha:
                    self._refused[where] = f"source hash mismatch ({actual[:12]}, expected {sha[:12]})"
                else:
                    record = {**k, "header": header, "source": source, "sha256": sha}
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                self._refused[where] = f"cannot read kernel files ({exc})"
            if record is None:
                warnings.warn(f"kernel {entry.get('key', 'default')} {sha[:12]}: {self._refused[where]}; "
                              "falling back", RuntimeWarning, stacklevel=4)
            self._sources[where] = record
        return self._sources[where]

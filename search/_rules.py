"""The rules kernsearch and its exported packages share: one file, imported by the core and shipped verbatim.

What is decided here is decided once, for the search, the store's gate and the exported dispatcher alike
(``export`` copies this file byte for byte into every package, beside ``_vocabulary.py``; ``tests/test_rules.py``
compares the bytes):

- the targets table (what each kind of kernel source is, which GPUs run it, how MLX builds it);
- whether a measured result beats the MLX op (:func:`beats_op`, the margin, the consumer modes' lower bound), and
  the statistic that bound is (:func:`decide`: an interval of the median per-round ratio that narrows with rounds);
- the timing identity (what, when it changes, voids a measured time);
- a chip's lineage, its identification from ``mx.device_info()``, its name, and which chip results are for
  (:func:`choose_chip`, the one chip rule);
- the hashes a kernel and a published version are known by;
- the array vocabulary of a baseline (the MLX meaning of each name);
- the expression-tree evaluator: spec expressions as small JSON trees, evaluated by a closed set of operators
  and functions (never Python's ``eval``). kernsearch parses a spec's expressions into these trees and evaluates
  them here, bounded by its :class:`Guard` (``family/_expr.py``: hostile specs); the exported package evaluates
  the trees of its dispatch table here too.

Standard library only, Python >= 3.9: the exported package runs on its consumer's Python with MLX alone.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, TypeVar

from ._vocabulary import CONSUMER_MODES, ConsumerMode, Target, Verdict

# -- targets ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetInfo:
    """One kind of kernel source: its row of the targets table."""

    name: str
    #: The GPU vendor whose chips run it (a chip of another vendor cannot).
    vendor: str
    #: File suffix of its sources (``gemm.cu.j2`` renders ``source.cu`` in an exported package).
    suffix: str
    #: The kernel factory, ``module:attribute.path`` (``mlx.core:fast.metal_kernel``): called with the source's
    #: ``name``, ``input_names``, ``output_names``, ``source``, ``header`` (and ``shared_memory`` where the row says
    #: so), it builds a kernel object. Imported only when a kernel is built (:func:`kernel_factory`).
    factory: str
    #: The CPU interpreter (``kernsearch.interp``) runs it: modeled winners can be verified without a GPU.
    interpreter: bool
    #: The language's name in sentences ("a modeled CUDA kernel").
    language: str
    #: The kernel object fixes its dynamic shared memory when made (``cuda_kernel(shared_memory=...)``).
    shared_memory_at_build: bool = False
    #: Sources reach the factory without comments, indentation and blank lines (:func:`kernel_text`: the factory
    #: re-reads the source on every call).
    compact: bool = False


#: One row per target. Adding a target (say, Metal with tensor operations) adds a row here, a member of
#: ``_vocabulary.Target`` and a back-end whose ``target`` names it; nothing else compares target or vendor names.
TARGETS: Dict[str, TargetInfo] = {t.name: t for t in (
    TargetInfo(Target.METAL.value, vendor="apple", suffix=Target.METAL.value, factory="mlx.core:fast.metal_kernel",
               interpreter=True, language="Metal"),
    TargetInfo(Target.CUDA.value, vendor="nvidia", suffix="cu", factory="mlx.core:fast.cuda_kernel", interpreter=False,
               language="CUDA", shared_memory_at_build=True, compact=True),
)}
#: Where a chip runs nothing of ours (the ``cpu`` pseudo-chip), commands render for this target.
DEFAULT_TARGET = Target.METAL.value
#: The target the CPU interpreter runs (its first row that says so): a CUDA kernel's twin is checked in it.
INTERPRETER_TARGET = next(t.name for t in TARGETS.values() if t.interpreter)
#: The target a vendor's GPUs run: its first row (a later row for the same vendor is an alternative, not the default).
VENDOR_TARGETS: Dict[str, str] = dict(reversed([(t.vendor, t.name) for t in TARGETS.values()]))
#: The targets whose kernel object fixes its shared memory when made.
SHARED_MEMORY_AT_BUILD = frozenset(t.name for t in TARGETS.values() if t.shared_memory_at_build)


def kernel_factory(target: str) -> Callable[..., Any]:
    """The callable its row names that builds ``target``'s kernel objects (``mx.fast.metal_kernel``...), imported
    now; an unknown target builds with the default target's (an older package's records name no target)."""
    row = TARGETS.get(target, TARGETS[DEFAULT_TARGET])
    module, _, path = row.factory.partition(":")
    found: Any = importlib.import_module(module)
    for attribute in path.split("."):
        found = getattr(found, attribute)
    return found  # type: ignore[no-any-return]


def compact(text: str) -> str:
    """Source text without its comments, indentation and blank lines. MLX's CUDA back-end rebuilds a custom kernel's
    whole source on every call and hashes it on every eval: on an H200 each KB costs ~0.5 us of host time a call
    (benchmarks/gpu_host_cost.py), as much as a small kernel's GPU time. A line holding a quote keeps its text after
    ``//`` (a string may hold one); preprocessor lines keep their own line."""
    lines = []
    for line in text.splitlines():
        kept = line.strip()
        if "//" in kept and '"' not in kept:
            kept = kept[:kept.index("//")].rstrip()
        if kept:
            lines.append(kept)
    return "\n".join(lines) + "\n"


def kernel_text(target: str, text: str) -> str:
    """A source (or header) as it is handed to its target's kernel factory: compact where the row says so. The
    store keeps the source as rendered (readable); the search's device runs and the package's runtime both build
    from this text, so what was proved is what runs."""
    row = TARGETS.get(target, TARGETS[DEFAULT_TARGET])
    return compact(text) if row.compact else text


def target_of(vendor: str) -> Optional[str]:
    """The target a vendor's GPUs run, None for a vendor with no GPU target (the ``cpu`` pseudo-chip)."""
    return VENDOR_TARGETS.get(vendor)


# -- beating the op --------------------------------------------------------------------------------------

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


#: What of a manifest's ``measurements`` a dispatch record does not carry: the raw samples (its figures sum them up)
#: and the chain's length (by which :func:`consumer_figures` reads its modes).
NOT_DISPATCHED = ("samples_ms", "chain_calls")


def dispatch_figures(measurements: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """A manifest's figures as its dispatch record carries them (``decision_fields``): every figure its
    ``measurements`` hold (kernsearch's one ``Figures`` record, validated by the store), the consumer modes as they
    read today. Not a list of names: a figure added to the record is carried, and checked before first use."""
    meas = measurements or {}
    return {**{k: v for k, v in meas.items() if k not in NOT_DISPATCHED}, "modes": consumer_figures(meas)}


def modes_text(figures: Optional[Dict[str, Any]], modes: Sequence[str] = CONSUMER_MODES) -> str:
    """``1.45x (range 1.30-1.60; 99% interval 1.38-1.52 over 22 rounds) graph, 1.20x (range 1.10-1.30) eager``."""
    parts = []
    for m in modes:
        f = (figures or {}).get(m)
        if isinstance(f, dict):
            text = speedup_text(f.get("speedup"), f.get("low"), f.get("high"))
            interval = mode_interval(f)
            if interval is not None:
                text = f"{text[:-1] if text.endswith(')') else text + ' ('}; {interval_text(interval)})"
            parts.append(f"{text} {m}")
    return ", ".join(parts) or "no consumer timing"


def interval_text(interval: Interval) -> str:
    """``99% interval 1.38-1.52 over 22 rounds``."""
    return (f"{CONFIDENCE:.0%} interval {interval.low:.2f}-{interval.high:.2f} over {interval.rounds} rounds"
            if math.isfinite(interval.high) else f"no interval from {interval.rounds} rounds")


# -- the timing identity ---------------------------------------------------------------------------------

#: What :func:`timing_identity` compares, in order.
IDENTITY_FIELDS = ("mlx", "os", "macos", "cuda_driver", "nvrtc")


def timing_identity(mlx_version: Optional[str], os_name: Optional[str], macos_version: Optional[str],
                    cuda_driver: Optional[str], nvrtc: Optional[str]) -> Dict[str, Optional[str]]:
    """What can move a measured kernel time when it changes (a measured result is void across a change): MLX minor
    version, OS, macOS major version (the Metal compiler ships with the OS), CUDA driver and NVRTC version."""
    def major_minor(v: Optional[str], parts: int) -> Optional[str]:
        return ".".join(v.split(".")[:parts]) if v else None

    return {"mlx": major_minor(mlx_version, 2), "os": os_name or None, "macos": major_minor(macos_version, 1),
            "cuda_driver": cuda_driver or None, "nvrtc": nvrtc or None}


def identity_changes(old: Dict[str, Any], new: Dict[str, Any], known_only: bool = True,
                     arrow: str = "->") -> List[str]:
    """``["mlx 0.29 -> 0.30", ...]``: the fields of two timing identities that differ (``known_only``: only
    where both know the field; the gate counts a field that became known or unknown as a change too)."""
    return [f"{k} {old.get(k)} {arrow} {new.get(k)}" for k in IDENTITY_FIELDS if old.get(k) != new.get(k)
            and (not known_only or (old.get(k) is not None and new.get(k) is not None))]


def cuda_driver_version() -> Optional[str]:
    """The NVIDIA kernel driver version (Linux), or None."""
    try:
        with open("/proc/driver/nvidia/version", "rb") as f:
            text = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return None
    m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9]+(?:\.[0-9]+)+)", text)
    return m.group(1) if m else None


def nvrtc_version() -> Optional[str]:
    """NVRTC's version (the compiler of ``mx.fast.cuda_kernel``), or None where there is no NVRTC."""
    import ctypes
    import ctypes.util

    names = [n for n in (ctypes.util.find_library("nvrtc"),) if n] + [f"libnvrtc.so.{v}" for v in (13, 12, 11)]
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        major, minor = ctypes.c_int(), ctypes.c_int()
        if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) == 0:
            return f"{major.value}.{minor.value}"
    return None


# -- chips -----------------------------------------------------------------------------------------------

#: Threadgroup (shared) memory assumed for an unknown NVIDIA GPU: what every kernel may use without an opt-in.
UNKNOWN_NVIDIA_SHARED_MEMORY = 49152


def lineage(chip: Dict[str, Any]) -> Tuple[Optional[str], Optional[str]]:
    """(generation key, generation+die key) of a chip record: what the export fallback chain matches on."""
    if chip.get("vendor") == "apple" and chip.get("generation") is not None:
        return f"apple-g{chip['generation']}", f"apple-g{chip['generation']}{chip.get('die') or ''}"
    if chip.get("architecture"):
        return chip["architecture"], chip["architecture"]
    return None, None


def identify(info: Dict[str, Any], registry: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The chip record for ``mx.device_info()`` output; for a GPU the registry does not know, a conservative
    stand-in: the smallest known chip of its vendor (of its generation if known), named as the device, ``known``
    False, ``stand_in_for`` the name of the chip it copies. No GPU: the registry's ``cpu`` record.

    On Metal the ``architecture`` string (``applegpu_g14c``: generation 14, die ``c``) with the ``device_name`` for
    the tier (one die letter is reported for more than one tier); on CUDA the ``architecture`` (``sm_90``) and a
    registry chip's ``device_match`` in the ``device_name``."""
    arch, device = str(info.get("architecture", "")), str(info.get("device_name", ""))
    apple = re.fullmatch(r"applegpu_g(\d+)([a-z])", arch)
    if apple:
        gen, die = int(apple.group(1)), apple.group(2)
        for chip in sorted(registry, key=lambda c: -len(str(c.get("name", "")))):
            if chip.get("vendor") == "apple" and chip.get("generation") == gen and re.search(
                    rf"(?<!\w){re.escape(str(chip.get('name', '')))}(?!\w)", device, re.IGNORECASE):
                return dict(chip)
        for chip in registry:
            if chip.get("generation") == gen and chip.get("die") == die:
                return dict(chip)
        return _stand_in(registry, "apple", device or arch, generation=gen, die=die)
    if arch.startswith("sm_"):
        for chip in registry:
            if chip.get("architecture") == arch and chip.get("device_match") and chip["device_match"] in device:
                return dict(chip)
        return _stand_in(registry, "nvidia", device or arch, architecture=arch)
    cpu = next((c for c in registry if c.get("vendor") == "cpu"), {"name": "cpu", "vendor": "cpu"})
    return dict(cpu)


def _stand_in(registry: List[Dict[str, Any]], vendor: str, name: str, **identity: Any) -> Dict[str, Any]:
    same = [c for c in registry if c.get("vendor") == vendor] or [{"vendor": vendor}]
    gen = [c for c in same if identity.get("generation") in (None, c.get("generation"))]
    smallest = min(gen or same, key=lambda c: c.get("gpu_cores", 0))
    record = {**smallest, "name": name, "known": False, "die": None, "generation": None, "architecture": None,
              "stand_in_for": smallest.get("name"), **identity}
    if vendor == "nvidia":
        record["threadgroup_memory_bytes"] = UNKNOWN_NVIDIA_SHARED_MEMORY
    return record


#: The longest chip name looked up: a longer one is no chip's, and is not echoed whole.
MAX_CHIP_NAME = 64

_Chip = TypeVar("_Chip")


class UnknownChip(ValueError):
    """A chip name no chip of the registry has (its message is one line: the name, bounded, and the known ones)."""


def chip_key(name: str) -> str:
    """A chip name as every caller compares it: case, white space, ``-``, ``_`` and a leading "apple" ignored
    (``M2 Max``, ``m2max``, ``Apple M2-Max`` name one chip)."""
    return re.sub(r"[\s_\-]+", "", name).lower().removeprefix("apple")


def named_chip(name: Any, registry: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The registry's record of the chip ``name`` names (:func:`chip_key`); :class:`UnknownChip` for any other name,
    one too long to be a chip's, or a value that is not a string."""
    fits = isinstance(name, str) and len(name) <= MAX_CHIP_NAME
    if fits:
        wanted = chip_key(name)
        for chip in registry:
            if chip_key(str(chip.get("name", ""))) == wanted:
                return dict(chip)
    shown = repr(name) if fits else repr(name)[:MAX_CHIP_NAME] + "..."
    raise UnknownChip(f"unknown chip {shown} (known: {', '.join(str(c.get('name')) for c in registry)})")


def choose_chip(named: Any, lookup: Callable[[Any], _Chip], here: Callable[[], _Chip], vendor: Callable[[_Chip], str],
                *, measures: bool = False, target: Optional[str] = None,
                default: Optional[Callable[[], _Chip]] = None) -> _Chip:
    """The one chip rule: the chip results are for, for kernsearch's commands, library and flows and for the exported
    package's calls alike (each passes its own registry's ``lookup``, detection ``here`` and records' ``vendor``).

    A back-end that ``measures`` gives results for the chip ``here``, whatever is named (a measurement belongs to the
    GPU it ran on). Otherwise the chip ``named`` (``lookup`` refuses an unknown name: never replaced by another
    chip). Otherwise the chip here; where a ``default`` is given, only if it is a GPU that runs ``target`` (None: any
    GPU's kernels), else ``default()`` (what a command works for with no such GPU here). ``here`` is called only
    where it is needed (detection imports MLX and may warn)."""
    if measures:
        return here()
    if named is not None:
        return lookup(named)
    chip = here()
    if default is None:
        return chip
    runs = target_of(vendor(chip))
    return chip if runs is not None and (target is None or runs == target) else default()


# -- hashes ----------------------------------------------------------------------------------------------

def source_sha256(header: str, source: str, template: Any = (), input_names: Any = (),
                  output_names: Any = ()) -> str:
    """The hash of everything a back-end compiles (a kernel's name carries its first 12 digits; artifacts and
    exported packages check it before a kernel is used)."""
    blob = json.dumps([header, source, [list(t) for t in template], list(input_names), list(output_names)])
    return hashlib.sha256(blob.encode()).hexdigest()


def content_sha256(manifest: str, header: str, source: str) -> str:
    """The content hash the store's index records when a version is published: the manifest's exact text (every
    field a decision rests on: config, geometry, chip, evidence, measurements, correctness, template hash) and
    both kernel files. The exported dispatcher checks the same before an artifact's first use."""
    blob = json.dumps({"format": 1, "manifest": manifest, "header": header, "source": source}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


# -- the array vocabulary of a baseline ------------------------------------------------------------------

#: Plain array functions (same name in NumPy and MLX).
PLAIN = ("matmul", "einsum", "transpose", "exp", "log", "sqrt", "tanh", "maximum", "minimum", "sum", "max",
         "min", "mean", "where", "abs", "square", "reshape", "concatenate")
#: Fused or composite ops, defined for both libraries (NumPy's in ``family/_vocab.py``).
FUSED = ("softmax", "rms_norm", "layer_norm", "silu", "sigmoid", "gelu", "split", "dequantize",
         "quantized_matmul", "rsqrt")
#: Every name a reference or baseline expression may call.
ARRAY_FUNCTIONS = PLAIN + FUSED


def mlx_namespace(mx: Any) -> Dict[str, Callable[..., Any]]:
    """The vocabulary as MLX ops (``mx`` is ``mlx.core``, imported by the caller): the op a kernel must beat."""
    ns: Dict[str, Callable[..., Any]] = {name: getattr(mx, name) for name in PLAIN if hasattr(mx, name)}
    ns.update(
        softmax=lambda x, axis=-1: mx.softmax(x, axis=axis, precise=True),
        rms_norm=lambda x, w, eps: mx.fast.rms_norm(x, w, float(eps)),
        layer_norm=lambda x, w, b, eps: mx.fast.layer_norm(x, w, b, float(eps)),
        sigmoid=mx.sigmoid,
        silu=lambda x: x * mx.sigmoid(x),  # what mlx.nn.silu computes
        gelu=lambda x: x * (1 + mx.erf(x / 2 ** 0.5)) / 2,  # mlx.nn.gelu
        split=lambda x, parts, axis=-1: mx.split(x, parts, axis=axis),
        dequantize=lambda w, scales, biases, group_size=64, bits=4: mx.dequantize(
            w, scales, biases, group_size=group_size, bits=bits),
        quantized_matmul=lambda x, w, scales, biases, transpose=True, group_size=64, bits=4: mx.quantized_matmul(
            x, w, scales, biases, transpose=transpose, group_size=group_size, bits=bits),
        rsqrt=mx.rsqrt,
    )
    return ns


# -- expressions -----------------------------------------------------------------------------------------

def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


#: Functions every spec expression may call (all total on numbers, none reaches the system).
FUNCTIONS: Dict[str, Callable[..., Any]] = {
    "ceil_div": ceil_div, "round_up": round_up, "is_pow2": is_pow2, "min": min, "max": max, "abs": abs,
    "int": int, "float": float, "len": len, "sqrt": math.sqrt, "log2": math.log2,
}
#: Keyword arguments a function may take (never ``out=``, which would write into an input).
KEYWORDS = frozenset({"axis", "axes", "keepdims", "group_size", "bits", "transpose"})
#: Attributes an expression may read from an array (NumPy or MLX): data, never methods.
ARRAY_ATTRIBUTES = frozenset({"T", "shape", "ndim", "dtype", "size"})
#: ``a ** b`` of integers is refused where the result would have more bits than this.
MAX_INT_BITS = 256
_CONSTANTS = (bool, int, float, str, type(None))

BINARY: Dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "//": operator.floordiv,
    "%": operator.mod, "**": operator.pow,
}
COMPARE: Dict[str, Callable[[Any, Any], Any]] = {
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "lteq": operator.le, "gt": operator.gt,
    "gteq": operator.ge, "in": lambda a, b: a in b, "notin": lambda a, b: a not in b,
}
UNARY: Dict[str, Callable[[Any], Any]] = {"not": operator.not_, "neg": operator.neg, "pos": operator.pos}


class ExpressionError(ValueError):
    """An expression could not be evaluated (a name is missing, an operator does not apply...)."""


class Guard:
    """Bounds on an evaluation, asked before and after the operations that could exhaust memory. This one bounds
    nothing: the exported package evaluates the trees of its own dispatch table. kernsearch's spec loader passes
    its own (``family/_expr.py``): a hostile spec's expression must never hang or exhaust memory."""

    def binary(self, op: str, left: Any, right: Any) -> None:
        """Before ``left op right`` (operands of a known kind, ``**`` of integers already bounded)."""

    def call(self, name: str, args: List[Any], kwargs: Dict[str, Any]) -> None:
        """Before calling the function ``name``."""

    def value(self, value: Any) -> Any:
        """A result (of an operator, a call, a subscript, ``~``), returned, or refused by raising."""
        return value


NO_GUARD = Guard()


def is_array(value: Any) -> bool:
    """A NumPy/MLX array or scalar (data with a shape and dtype), not a function."""
    kind = type(value)
    known = _ARRAY_TYPES.get(kind)
    if known is None:  # asked once per type: the exported op evaluates its expression on every call
        known = _ARRAY_TYPES[kind] = hasattr(kind, "shape") and hasattr(kind, "dtype") and not callable(value)
    return known


_ARRAY_TYPES: Dict[type, bool] = {}
#: The exact types of most operands, checked first (the isinstance checks after them admit the rest).
_OPERANDS = frozenset((int, float, bool, str, list, tuple))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float))


def evaluate(tree: Any, names: Dict[str, Any], functions: Optional[Dict[str, Callable[..., Any]]] = None,
             guard: Guard = NO_GUARD) -> Any:
    """Evaluate an expression tree: ``["const", v]``, ``["name", n]``, ``["bin", op, a, b]``, ... (:data:`NODES`).

    A call looks its function up in ``functions`` (default :data:`FUNCTIONS`), then among ``names``; a name that
    is a function must be called. ``guard`` bounds the evaluation (:class:`Guard`)."""
    return _Evaluation(names, FUNCTIONS if functions is None else functions, guard).of(tree)


class _Evaluation:
    """One evaluation's names, functions and guard; :meth:`of` evaluates a node by its kind (:data:`NODES`)."""

    __slots__ = ("names", "functions", "guard")

    def __init__(self, names: Dict[str, Any], functions: Dict[str, Callable[..., Any]], guard: Guard) -> None:
        self.names, self.functions, self.guard = names, functions, guard

    def of(self, tree: Any) -> Any:
        try:
            node = NODES[tree[0]]
        except (KeyError, TypeError, IndexError):
            raise ExpressionError(f"unknown expression node {str(tree)[:40]!r}") from None
        return node(self, tree)


def _const(e: _Evaluation, t: Any) -> Any:
    return t[1]


def _name(e: _Evaluation, t: Any) -> Any:
    if t[1] not in e.names:
        raise ExpressionError(f"unknown name {t[1]!r}")
    value = e.names[t[1]]
    if callable(value):
        raise ExpressionError(f"{t[1]!r} is a function; call it")
    return value


def _list(e: _Evaluation, t: Any) -> Any:
    return [e.of(item) for item in t[1]]


def _tuple(e: _Evaluation, t: Any) -> Any:
    return tuple(e.of(item) for item in t[1])


def _binary(e: _Evaluation, t: Any) -> Any:
    op, left, right = t[1], e.of(t[2]), e.of(t[3])
    if op == "**" and isinstance(left, int) and isinstance(right, int):
        _check_power(left, right)
    elif op == "%" and isinstance(left, str):
        raise ExpressionError("string formatting with % is not part of the expression language")
    for value in (left, right):
        _check_operand(value)
    if e.guard is NO_GUARD:  # the exported op's call: nothing to bound
        return BINARY[op](left, right)
    e.guard.binary(op, left, right)
    return e.guard.value(BINARY[op](left, right))


def _check_power(left: int, right: int) -> None:
    """An integer power is refused before it is computed where its result would be too large to hold."""
    if right > 0 and abs(left) > 1 and right * left.bit_length() > MAX_INT_BITS:
        raise ExpressionError(f"{left}**{right} is larger than 2**{MAX_INT_BITS}")
    if right < 0 and abs(right) > MAX_INT_BITS * 4:
        raise ExpressionError(f"exponent {right} is out of range")


def _check_operand(value: Any) -> None:
    if type(value) not in _OPERANDS and not (_number(value) or isinstance(value, (str, list, tuple))
                                             or is_array(value)):
        raise ExpressionError(f"cannot apply an operator to a {type(value).__name__}")


def _unary(e: _Evaluation, t: Any) -> Any:
    value = e.of(t[1])
    if t[0] != "not" and not (_number(value) or is_array(value)):
        raise ExpressionError(f"cannot negate a {type(value).__name__}")
    return UNARY[t[0]](value)


def _and(e: _Evaluation, t: Any) -> Any:
    return e.of(t[1]) and e.of(t[2])


def _or(e: _Evaluation, t: Any) -> Any:
    return e.of(t[1]) or e.of(t[2])


def _concat(e: _Evaluation, t: Any) -> Any:
    parts = [e.of(item) for item in t[1]]
    if not all(isinstance(p, (str, int, float, bool)) for p in parts):
        raise ExpressionError("~ joins numbers and strings only")
    return e.guard.value("".join(str(p) for p in parts))


def _compare(e: _Evaluation, t: Any) -> Any:
    """A chain ``a < b <= c``: false at the first comparison that fails (an array result is elementwise and
    does not stop the chain)."""
    left = e.of(t[1])
    result: Any = True
    for op, operand in t[2]:
        right = e.of(operand)
        result = COMPARE[op](left, right)
        if not is_array(result) and not result:
            return False
        left = right
    return result


def _if(e: _Evaluation, t: Any) -> Any:
    if e.of(t[1]):
        return e.of(t[2])
    return e.of(t[3]) if t[3] is not None else None


def _call(e: _Evaluation, t: Any) -> Any:
    name = t[1]
    fn = e.functions.get(name)
    if fn is None:
        fn = e.names.get(name)
        if fn is None or not callable(fn):
            raise ExpressionError(f"unknown function {name!r}")
    if t[3] and not KEYWORDS.issuperset(t[3]):
        bad = sorted(set(t[3]) - KEYWORDS)
        raise ExpressionError(f"keyword argument(s) {', '.join(bad)} not allowed (only {', '.join(sorted(KEYWORDS))})")
    args = [e.of(a) for a in t[2]]
    kwargs = {k: e.of(v) for k, v in t[3].items()} if t[3] else {}
    if e.guard is NO_GUARD:  # the exported op's call: nothing to bound
        return fn(*args, **kwargs)
    e.guard.call(name, args, kwargs)
    return e.guard.value(fn(*args, **kwargs))


def _attribute(e: _Evaluation, t: Any) -> Any:
    """``chip.simd_width``: a field of a record (a mapping or a pydantic model), never a method; of an array, only
    its data (:data:`ARRAY_ATTRIBUTES`)."""
    obj, attr = e.of(t[1]), t[2]
    if is_array(obj):
        if attr not in ARRAY_ATTRIBUTES:
            allowed = ", ".join(sorted(ARRAY_ATTRIBUTES))
            raise ExpressionError(f"array attribute {attr!r} is not allowed (only {allowed})")
        value = getattr(obj, attr)
        return tuple(value) if attr == "shape" else value
    if isinstance(obj, dict):
        if attr not in obj:
            raise ExpressionError(f"no field {attr!r}")
        value = obj[attr]
    else:
        fields = getattr(type(obj), "model_fields", None)
        if not isinstance(fields, dict) or attr not in fields:
            raise ExpressionError(f"{type(obj).__name__} has no field {attr!r}")
        value = getattr(obj, attr)
    if not isinstance(value, (*_CONSTANTS, tuple, list, dict)):
        raise ExpressionError(f"field {attr!r} is not plain data")
    return value


def _item(e: _Evaluation, t: Any) -> Any:
    obj, key = e.of(t[1]), e.of(t[2])
    if not (isinstance(obj, (list, tuple, str, dict)) or is_array(obj)):
        raise ExpressionError(f"cannot index a {type(obj).__name__}")
    return e.guard.value(obj[key])


def _slice(e: _Evaluation, t: Any) -> Any:
    return slice(*(None if part is None else e.of(part) for part in t[1:4]))


#: The evaluator, one function per node kind of the tree.
NODES: Dict[str, Callable[[_Evaluation, Any], Any]] = {
    "const": _const, "name": _name, "list": _list, "tuple": _tuple, "bin": _binary, "not": _unary, "neg": _unary,
    "pos": _unary, "and": _and, "or": _or, "concat": _concat, "cmp": _compare, "if": _if, "call": _call,
    "attr": _attribute, "item": _item, "slice": _slice,
}


def names_in(tree: Any) -> Set[str]:
    """The names an expression tree reads (function names of calls excluded). A node is a list that starts with
    its kind (a string); a list of nodes (a call's arguments, a list's items) is read from its first element."""
    if isinstance(tree, list) and tree:
        if tree[0] == "name" and len(tree) > 1 and isinstance(tree[1], str):
            return {tree[1]}
        parts = tree[1:] if isinstance(tree[0], str) else tree
        return set().union(*(names_in(t) for t in parts)) if parts else set()
    if isinstance(tree, dict):
        return set().union(*(names_in(t) for t in tree.values())) if tree else set()
    return set()

"""The ``model`` back-end: a per-chip analytic performance model. Its times are predictions (``modeled``).

It runs nothing. Without a GPU, a search ranks variants by these predictions for a named chip and proves
the winner on the CPU interpreter; a predicted time is never shown or stored as a measurement.

What the kernel does comes from the family spec's optional ``[model]`` table (data, not code):
threadgroups, FLOPs and bytes per threadgroup, threadgroup memory, registers, loads in flight... What the
chip can do comes from ``chips.toml``: each chip's figures and its vendor's per-core ones (``[cores.*]``). The model
(``docs/model.md`` says what it assumes):

* occupancy: threadgroups resident per core, limited by threadgroup memory, threads and registers;
* wave quantisation: threadgroups are dealt over ``chip.gpu_cores``; the busiest core sets the time, so a
  grid that leaves cores idle in its last wave pays for a whole wave;
* per core, each batch of co-resident threadgroups takes a roofline of compute (peak × inner-product
  efficiency × latency hiding) and cache traffic (operand re-reads per tile shape, at a bandwidth cut by
  too few bytes in flight: vector width, occupancy), overlapped more with more threadgroups and with
  double buffering, plus barrier stalls;
* a DRAM floor for the whole grid, and a launch overhead.

A family without ``[model]`` gets a plain roofline from its problem FLOPs and bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from operator import itemgetter
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .._errors import BackendError, ConfigError, SpecError
from .._records import Prediction
from .._vocabulary import Evidence
from ..family._expr import ExprError
from ..family._render import Geometry, KernelSource
from ..family._space import Config, Space
from ..hardware._chips import Chip, core_tables, get_chip
from ._base import BaseBackend, RunResult, Timing

if TYPE_CHECKING:
    from ..family._spec import Family

#: ``[model]`` keys the model reads; other keys are helpers that some of these must read.
REQUIRED = ("threadgroups", "flops", "cache_bytes")
OPTIONAL = {
    "threadgroup_threads": None,  # threads per threadgroup (default: the launch's threadgroup size)
    "threadgroup_memory": 0.0,  # bytes of threadgroup memory per threadgroup
    "registers": 0.0,  # 32-bit registers per thread (0: not a limit)
    "dram_bytes": None,  # DRAM bytes of the whole grid; may read `concurrent` (default: problem bytes)
    "load_bytes": None,  # bytes per load instruction (vector width × element size; default: dtype size)
    "loads_in_flight": 1.0,  # independent loads per thread that can be outstanding at once
    "buffers": 1.0,  # 2 with double buffering: loads of step k+1 overlap compute of step k
    "matrix": False,  # inner product on matrix units (simdgroup_matrix, tensor cores)
    "accelerator": False,  # inner product on the GPU cores' neural accelerators (Metal 4 tensor ops, M5)
    "fma_per_fetch": math.inf,  # FMA instructions per operand fetch into registers (register reuse)
    "device_fetch_fraction": 0.0,  # share of those fetches that go to device memory (unstaged operands)
    "bank_conflicts": 1.0,  # ways of threadgroup-memory bank conflict on operand fetches
    "barriers": 0.0,  # threadgroup barriers per threadgroup
    "copy_instructions": 0.0,  # lane instructions per threadgroup spent copying tiles (issue slots)
    "threadgroup_bytes": 0.0,  # bytes through threadgroup memory per threadgroup (bank-conflict passes included)
    "stream_bytes": 0.0,  # bytes per threadgroup streamed from DRAM once (no reuse): at DRAM, not cache, bandwidth
}
KNOWN = frozenset(REQUIRED) | frozenset(OPTIONAL)
#: Entries the occupancy is computed from (so they cannot read `concurrent`).
OCCUPANCY_INPUTS = ("threadgroups", "threadgroup_threads", "threadgroup_memory", "registers")
_MISSING = object()


@dataclass(frozen=True)
class CoreFigures:
    """What one GPU core (Apple core, NVIDIA SM) holds and how it behaves; rough public figures."""

    threadgroup_memory: int  # bytes of threadgroup (shared) memory per core
    max_threads: int  # resident threads per core
    max_threadgroups: int  # resident threadgroups per core
    registers: int  # 32-bit registers per core
    simdgroups_to_fill: int  # resident simdgroups a core needs to hide ALU latency
    latency_ns: float  # cache-level load latency (Little's law: bytes in flight needed)
    max_loads_in_flight: int  # outstanding loads per thread the hardware/compiler sustain
    cache_bandwidth_factor: float  # on-chip cache (L2 / system cache) bandwidth over DRAM bandwidth
    threadgroup_bytes_per_flop: float  # threadgroup-memory bytes per clock over FP32 FLOPs per clock
    matrix_fraction: float  # reachable share of peak with matrix units (simdgroup_matrix / mma.sync)
    accelerator_fraction: float  # reachable share of the neural accelerators' matrix peak (matmul2d)
    scalar_fraction: float  # reachable share of the FP32 peak with scalar FMAs
    device_fetch_cost: float  # an inner-loop device load relative to a threadgroup-memory load
    barrier_ns: float  # stall of one threadgroup barrier
    launch_us: float  # dispatch overhead of one kernel launch


def core_figures(vendor: str) -> CoreFigures:
    """The per-core figures of ``vendor``'s GPUs, from ``[cores.VENDOR]`` in chips.toml (the CPU pseudo-chip
    and unknown vendors borrow Apple's)."""
    return _cores().get(vendor) or _cores()["apple"]


@lru_cache(maxsize=1)
def _cores() -> dict[str, CoreFigures]:
    return {vendor: CoreFigures(**figures) for vendor, figures in core_tables().items()}


class ModelBackend(BaseBackend):
    """Predicts a variant's time on a chip; executes nothing. Every figure it gives is ``modeled``."""

    name: ClassVar[str] = "model"
    evidence: ClassVar[Evidence] = Evidence.MODELED
    target: ClassVar[str | None] = None
    predicts: ClassVar[bool] = True
    verified_by: ClassVar[str | None] = "cpu"  # the interpreter runs the Metal kernel the chip would run

    def __init__(self, chip: Chip | str | None = None) -> None:
        """``chip`` overrides the space's chip (the space's problem is predicted on it instead)."""
        self.chip = get_chip(chip) if isinstance(chip, str) else chip
        self._evaluators: dict[tuple[Any, ...], _Evaluator] = {}

    def run(self, kernel: KernelSource, geometry: Geometry, inputs: list[np.ndarray], dtype: str,
            init_value: float | None = float("nan"), **options: Any) -> RunResult:
        raise BackendError("the model back-end predicts times and runs no kernel: verify on the cpu back-end "
                           "(interpreter) or a GPU back-end")

    def time(self, kernel: KernelSource, geometry: Geometry, inputs: list[np.ndarray], dtype: str,
             **options: Any) -> Timing:
        raise BackendError("the model back-end times nothing: use predict_ms(space, config) for a modeled time")

    def predict_ms(self, space: Space, config: Config) -> float:
        """Predicted kernel time in milliseconds (a prediction, never a measurement)."""
        return self.predict(space, config).time_ms

    def predict(self, space: Space, config: Config) -> Prediction:
        """The predicted time and its tie-break (the busiest core's time; the whole time for a roofline)."""
        terms = self.breakdown(space, config)
        time_ms = float(terms["time_ms"])
        return Prediction(time_ms, float(terms.get("core_ms", time_ms)))

    def breakdown(self, space: Space, config: Config) -> dict[str, Any]:
        """The prediction and the terms it is made of, for ``kernsearch predict`` and debugging: a bag of named
        figures that differs between the roofline and the family's model (the search reads :meth:`predict`)."""
        ev = self._evaluator(space)
        inputs = ev.inputs(config)
        result = _predict(ev, inputs) if ev.family.model else _roofline(ev)
        return {"evidence": Evidence.MODELED.value, "chip": ev.chip.name, **result}

    def _evaluator(self, space: Space) -> _Evaluator:
        chip = self.chip or space.chip
        p = space.problem
        key = (id(p.family), p.shape, p.dtype, chip.name)
        ev = self._evaluators.get(key)
        if ev is None or ev.family is not p.family:
            target = space if chip is space.chip or chip == space.chip else Space(p, chip)
            ev = self._evaluators[key] = _Evaluator(target)
        return ev


# -- expression evaluation, memoised per expression on the values it reads -------------------------------

def _check_model_entries(fam: Family) -> None:
    """``[model]`` names only model inputs or entries another entry reads, and (if present) every required one."""
    unknown_read = {n for e in fam.model.values() for n in e.names}
    stray = [k for k in fam.model if k not in KNOWN and k not in unknown_read]
    if stray:
        raise SpecError(f"{fam.path}/family.toml: model.{stray[0]}: not a model input "
                        f"(known: {', '.join(sorted(KNOWN))}) and read by no other entry")
    missing = [k for k in REQUIRED if fam.model and k not in fam.model]
    if missing:
        raise SpecError(f"{fam.path}/family.toml: model: missing entry {missing[0]!r} "
                        f"(required: {', '.join(REQUIRED)})")


def _after_occupancy(fam: Family) -> set[str]:
    """The ``[model]`` entries that read ``concurrent`` (directly or through another entry): they wait for the
    occupancy, so none of them may set it."""
    late: set[str] = set()
    for name, expr in fam.model.items():
        if "concurrent" in expr.names or expr.names & late:
            late.add(name)
    circular = sorted(late & set(OCCUPANCY_INPUTS))
    if circular:
        raise SpecError(f"{fam.path}/family.toml: model.{circular[0]}: sets the occupancy, so it cannot "
                        "read `concurrent`")
    return late


class _Evaluator:
    """Evaluates derived values, constraints and ``[model]`` entries for one problem on one chip.

    Each expression reads a few names (``BM``, ``BN``...), so its value is cached on theirs: scoring a whole
    space costs dictionary look-ups, not tens of thousands of sandboxed evaluations.
    """

    def __init__(self, space: Space) -> None:
        self.space, self.family, self.chip, self.problem = space, space.family, space.chip, space.problem
        self.core = core_figures(self.chip.vendor)
        self.base: dict[str, Any] = dict(space.base)
        self.problem_flops, self.problem_bytes = self.problem.flops(), self.problem.bytes()
        fam = self.family
        _check_model_entries(fam)
        late = _after_occupancy(fam)
        steps = [(f"derived.{n}", n, e) for n, e in fam.derived.items()]
        self._derived = [self._step(*s) for s in steps]
        self._checks = [self._step(f"constraint {c.name}", c.name, c.expr) for c in fam.constraints]
        self._early = [self._step(f"model.{n}", n, e) for n, e in fam.model.items() if n not in late]
        self._late = [self._step(f"model.{n}", n, e) for n, e in fam.model.items() if n in late]
        self._threads_expr = fam.launch.threadgroup

    def _step(self, where: str, name: str, expr: Any) -> tuple[str, str, Any, Any, dict[Any, Any]]:
        varying = sorted(n for n in expr.names if n not in self.base)
        key_of = itemgetter(*varying) if varying else (lambda _ctx: ())
        return where, name, expr, key_of, {}

    def _run(self, steps: list[Any], ctx: dict[str, Any], store: bool = True) -> list[Any]:
        values = []
        for where, name, expr, key_of, memo in steps:
            key = key_of(ctx)
            try:
                value = memo.get(key, _MISSING)
            except TypeError:  # an unhashable value (a list): evaluate without the cache
                value = self._eval(where, expr, ctx)
            else:
                if value is _MISSING:
                    value = memo[key] = self._eval(where, expr, ctx)
            if store:
                ctx[name] = value
            values.append(value)
        return values

    def _eval(self, where: str, expr: Any, ctx: dict[str, Any]) -> Any:
        try:
            return expr(ctx)
        except ExprError as exc:
            raise SpecError(f"{self.family.path}/family.toml: {where}: {exc}") from None

    def inputs(self, config: Config) -> dict[str, Any]:
        """The context after derived values and the early model entries; ConfigError if invalid."""
        missing = [k for k in self.family.knobs if k not in config]
        if missing:
            raise ConfigError(f"config lacks knob(s) {', '.join(missing)}")
        ctx = {**self.base, **config}
        self._run(self._derived, ctx)
        failed = [step[1] for step, ok in zip(self._checks, self._run(self._checks, ctx, store=False)) if not ok]
        if failed:
            raise ConfigError(f"cannot predict an invalid config (violates {', '.join(failed)})")
        self._run(self._early, ctx)
        return ctx

    def late(self, ctx: dict[str, Any], concurrent: int) -> None:
        ctx["concurrent"] = concurrent
        self._run(self._late, ctx)

    def number(self, ctx: dict[str, Any], key: str, default: Any = None) -> Any:
        """A ``[model]`` entry as a non-negative float (``default`` when the family does not give it)."""
        if key not in self.family.model:
            return default
        value = ctx[key]
        if isinstance(value, bool):
            return float(value)
        if not isinstance(value, (int, float)) or math.isnan(value) or value < 0 \
                or (math.isinf(value) and key != "fma_per_fetch"):
            raise SpecError(f"{self.family.path}/family.toml: model.{key}: expected a non-negative number, "
                            f"got {value!r}")
        return float(value)

    def threads(self, ctx: dict[str, Any]) -> float:
        given = self.number(ctx, "threadgroup_threads")
        if given is not None:
            return float(given)
        return float(math.prod(self._eval("launch.threadgroup", self._threads_expr, ctx)))


# -- the model ------------------------------------------------------------------------------------------

def _roofline(ev: _Evaluator) -> dict[str, Any]:
    """No ``[model]`` table: the problem's FLOPs at peak, its bytes at DRAM bandwidth, plus launch."""
    chip, p = ev.chip, ev.problem
    compute = ev.problem_flops / (chip.peak_tflops(p.dtype) * 1e12)
    memory = ev.problem_bytes / (chip.memory_bandwidth_gbs * 1e9)
    launch = ev.core.launch_us * 1e-6
    total = launch + max(compute, memory)
    return {"model": "roofline", "time_ms": total * 1e3, "compute_ms": compute * 1e3, "memory_ms": memory * 1e3,
            "launch_ms": launch * 1e3, "bound": "compute" if compute >= memory else "memory",
            "predicted_tflops": ev.problem_flops / total / 1e12}


def _reachable_peak(chip: Chip, core: CoreFigures, dtype: str, matrix: bool, accelerator: bool) -> float:
    """TFLOP/s of the inner product in use: the accelerator's rate where it has one for ``dtype``; matrix work
    without one runs on the SIMD units; the rest at the scalar rate."""
    tensor_peak = chip.tensor_tflops(dtype)
    if accelerator and tensor_peak:
        return tensor_peak * core.accelerator_fraction
    if matrix or accelerator:  # no accelerated rate for this dtype: matrix work on the SIMD units
        return chip.simd_tflops(dtype) * core.matrix_fraction
    return chip.fp32_tflops * core.scalar_fraction


def _busiest_core(per_core: int, resident: int, batch: Callable[[int], dict[str, float]]
                  ) -> tuple[float, float, float, float, float, dict[str, float]]:
    """The busiest core's seconds (total, compute, memory, threadgroup memory, barrier stalls) over its full
    batches of ``resident`` threadgroups and the partial last one, and its first batch's figures."""
    full, rest = divmod(per_core, resident)
    parts = [(full, batch(resident))] if full else []
    if rest:
        parts.append((1, batch(rest)))
    core_time = sum(n * b["t"] for n, b in parts)
    compute_time = sum(n * b["tc"] for n, b in parts)
    memory_time = sum(n * b["tm"] for n, b in parts)
    tg_time = sum(n * b["tt"] for n, b in parts)
    stall_time = sum(n * b["stall"] for n, b in parts)
    return core_time, compute_time, memory_time, tg_time, stall_time, parts[0][1]


def _predict(ev: _Evaluator, ctx: dict[str, Any]) -> dict[str, Any]:
    chip, core, p = ev.chip, ev.core, ev.problem
    num = ev.number
    tgs = max(1, math.ceil(num(ctx, "threadgroups")))
    threads = max(1.0, ev.threads(ctx))
    simdgroups = math.ceil(threads / chip.simd_width)
    tg_mem = num(ctx, "threadgroup_memory", 0.0)
    regs = num(ctx, "registers", 0.0)

    # Occupancy: threadgroups resident per core, and what limits it.
    limits = {"threadgroups": core.max_threadgroups, "threads": core.max_threads // threads,
              "threadgroup memory": core.threadgroup_memory // tg_mem if tg_mem else math.inf,
              "registers": core.registers // (regs * threads) if regs else math.inf}
    limiter = min(limits, key=lambda k: limits[k])
    resident = int(max(1, min(limits.values())))
    cores = chip.gpu_cores
    concurrent = int(min(tgs, cores * resident))
    ev.late(ctx, concurrent)

    flops = num(ctx, "flops")
    cache_bytes = num(ctx, "cache_bytes")
    load_bytes = num(ctx, "load_bytes", None) or float(ctx.get("dtype_size", 4))
    in_flight = min(max(1.0, num(ctx, "loads_in_flight", 1.0)), core.max_loads_in_flight)
    buffers = max(1.0, num(ctx, "buffers", 1.0))
    matrix = bool(num(ctx, "matrix", 0.0))
    accelerator = bool(num(ctx, "accelerator", 0.0))
    reuse = num(ctx, "fma_per_fetch", math.inf)
    device_share = min(1.0, num(ctx, "device_fetch_fraction", 0.0))
    conflicts = max(1.0, num(ctx, "bank_conflicts", 1.0))
    barriers = num(ctx, "barriers", 0.0)
    copies = num(ctx, "copy_instructions", 0.0)
    tg_traffic = num(ctx, "threadgroup_bytes", 0.0)
    # Streamed bytes (read once, e.g. quantized weights) come at DRAM bandwidth, not the cache's: in cache-byte
    # terms they weigh the cache/DRAM bandwidth ratio, under the same bytes-in-flight efficiency.
    stream = num(ctx, "stream_bytes", 0.0)
    traffic = cache_bytes + stream * core.cache_bandwidth_factor

    # Compute: the peak of the inner product in use, cut by operand fetches per FMA.
    peak = _reachable_peak(chip, core, p.dtype, matrix, accelerator)
    fetch_cost = (1 - device_share) * conflicts + device_share * core.device_fetch_cost
    compute_eff = 1.0 if math.isinf(reuse) else reuse / (reuse + fetch_cost) if reuse > 0 else 0.0
    core_flops = peak * 1e12 / cores * max(compute_eff, 1e-6)
    core_ops = chip.fp32_tflops * 1e12 / 2 / cores  # lane instructions per second (an FMA is 2 FLOPs)
    work = flops / core_flops + copies / core_ops  # seconds of one threadgroup's issue, latency hidden
    core_bw = chip.memory_bandwidth_gbs * 1e9 * core.cache_bandwidth_factor / cores
    needed_in_flight = core.latency_ns * 1e-9 * core_bw
    core_tg_bw = chip.fp32_tflops * 1e12 / cores * core.threadgroup_bytes_per_flop

    def batch(k: int) -> dict[str, float]:
        """Seconds for k co-resident threadgroups on one core to finish."""
        hide = min(1.0, k * simdgroups / core.simdgroups_to_fill)
        mlp = min(1.0, k * threads * load_bytes * in_flight / needed_in_flight)
        tc = k * work / hide
        tt = k * tg_traffic / (core_tg_bw * hide)  # threadgroup memory: inside the core, like compute
        tm = k * traffic / (core_bw * mlp)
        inside = max(tc, tt)
        overlap = 1.0 - 1.0 / (k * buffers)
        stall = barriers * core.barrier_ns * 1e-9 / k
        return {"t": max(inside, tm) + (1 - overlap) * min(inside, tm) + stall, "tc": tc, "tt": tt, "tm": tm,
                "hide": hide, "mlp": mlp, "overlap": overlap, "stall": stall}

    per_core = math.ceil(tgs / cores)  # the busiest core: threadgroups are dealt round-robin
    core_time, compute_time, memory_time, tg_time, stall_time, main = _busiest_core(per_core, resident, batch)

    # DRAM floor: distinct bytes at least, every cache byte at most; a problem that fits in half the
    # system cache is read from DRAM once.
    unique = ev.problem_bytes
    dram = num(ctx, "dram_bytes", None)
    dram = unique if dram is None else min(max(dram, unique), tgs * (cache_bytes + stream))
    if unique <= chip.system_cache_mb * 2**20 / 2:
        dram = unique
    dram_time = dram / (chip.memory_bandwidth_gbs * 1e9)

    launch = core.launch_us * 1e-6
    total = launch + max(core_time, dram_time)
    waves = math.ceil(tgs / (cores * resident))
    if dram_time > core_time:
        bound = "dram"
    else:
        traffic_kind = "dram" if stream * core.cache_bandwidth_factor >= cache_bytes else "cache bandwidth"
        bound = max((compute_time, "compute"), (tg_time, "threadgroup memory"), (memory_time, traffic_kind))[1]
    return {
        "model": "occupancy roofline", "time_ms": total * 1e3, "bound": bound,
        "compute_ms": compute_time * 1e3, "threadgroup_ms": tg_time * 1e3, "memory_ms": memory_time * 1e3,
        "dram_ms": dram_time * 1e3,
        "barrier_ms": stall_time * 1e3, "launch_ms": launch * 1e3, "core_ms": core_time * 1e3,
        "threadgroups": int(tgs), "threads_per_threadgroup": int(threads),
        "resident_per_core": resident, "occupancy_limit": limiter, "concurrent": concurrent,
        "waves": waves, "wave_efficiency": tgs / (waves * cores * resident),
        "threadgroups_on_busiest_core": per_core,
        "peak_tflops": chip.peak_tflops(p.dtype),
        "reachable_peak_tflops": peak, "compute_efficiency": compute_eff, "latency_hiding": main["hide"],
        "bandwidth_efficiency": main["mlp"], "overlap": main["overlap"],
        "flops": tgs * flops, "cache_bytes": tgs * cache_bytes, "dram_bytes": dram,
        "predicted_tflops": ev.problem_flops / total / 1e12,
        **({"stream_bytes": tgs * stream} if "stream_bytes" in ev.family.model else {}),
    }

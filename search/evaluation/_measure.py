"""Honest timing of GPU work (the method is written down in ``docs/timing.md``).

The functions here know nothing about MLX: a back-end hands them ``launch(i)`` (enqueue one run on
input set ``i``, without waiting) and ``sync()`` (wait until all enqueued work is done, e.g.
``mx.synchronize``). The method:

1. warm up (the first launches compile and fault in caches and clocks);
2. pick a batch size so one batch of launches between two syncs lasts at least ``min_batch_ms``:
   launch overhead and the sync's own cost then stay small next to the kernel;
3. take samples (batch time / batch size) until the median is known to ``target_spread`` or the
   sample or time limit is reached; rotate among input sets so a working set that fits in the last-
   level cache is not measured hot when it would not be in real use; during a search, stop early a
   config that can no longer beat the incumbent (:mod:`._race`), and sample under :data:`SEARCH_PLAN`;
4. for the final ranking, :func:`interleaved` measures finalists and the baseline round-robin in one
   process, so drifting clocks and temperature hit every candidate alike, and :func:`lead_exceeds_noise`
   decides whether a lead is real.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..backends._base import BaseBackend
    from ..family._render import Geometry, KernelSource
    from ..family._space import Problem, Space
    from ..family._spec import Family
    from ._race import Race

Launch = Callable[[int], object]
Sync = Callable[[], None]


@dataclass(frozen=True)
class TimingPlan:
    """Knobs of the method; the defaults suit kernels from microseconds to a few hundred ms."""

    warmup: int = 3
    min_batch_ms: float = 20.0
    max_batch: int = 1000
    min_samples: int = 10
    max_samples: int = 100
    target_spread: float = 0.02  # relative (p90 - p10) / median at which sampling may stop
    max_seconds: float = 5.0


#: The per-config budget during a search (the final round re-times the finalists under the full plan,
#: interleaved): batches of 5 ms, 6 to 30 samples, until a 3 % spread or 1 s. With racing, most configs
#: stop after 4 samples; the few that can still win are timed to this plan.
SEARCH_PLAN = TimingPlan(warmup=3, min_batch_ms=5.0, min_samples=6, max_samples=30, target_spread=0.03,
                         max_seconds=1.0)


@dataclass(frozen=True)
class Sampled:
    """The samples of one timing (ms per launch) and whether it stopped because it could not win."""

    samples: list[float]
    not_winning: bool = False


def input_sets_needed(working_set_bytes: float, cache_bytes: float, memory_budget_bytes: float = 2e9) -> int:
    """How many input sets to rotate so consecutive launches do not find their inputs in cache."""
    if working_set_bytes <= 0 or working_set_bytes >= cache_bytes:
        return 1
    sets = int(np.ceil(2 * cache_bytes / working_set_bytes)) + 1
    return max(1, min(sets, int(memory_budget_bytes // max(working_set_bytes, 1)), 64))


def spread(samples: list[float]) -> float:
    """Relative spread (p90 - p10) / median; 0 for fewer than two samples."""
    if len(samples) < 2:
        return 0.0
    lo, med, hi = np.percentile(samples, [10, 50, 90])
    return float((hi - lo) / med) if med > 0 else 0.0


def _batch_ms(launch: Launch, sync: Sync, n: int, first_set: int, n_sets: int,
              clock: Callable[[], float]) -> float:
    sync()
    start = clock()
    for i in range(n):
        launch((first_set + i) % n_sets)
    sync()
    return (clock() - start) * 1e3


def _calibrate(launch: Launch, sync: Sync, input_sets: int, plan: TimingPlan, clock: Callable[[], float]) -> int:
    """Warm up, then grow the batch until it lasts ``min_batch_ms`` (or reaches ``max_batch``)."""
    for i in range(plan.warmup):
        launch(i % input_sets)
        sync()
    batch = 1
    while True:
        ms = _batch_ms(launch, sync, batch, 0, input_sets, clock)
        if ms >= plan.min_batch_ms or batch >= plan.max_batch:
            return batch
        batch = min(plan.max_batch, max(batch * 2, int(batch * plan.min_batch_ms / max(ms, 1e-3)) + 1))


def measure(launch: Launch, sync: Sync, *, input_sets: int = 1, plan: TimingPlan = TimingPlan(),
            clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Per-launch times in ms (one sample per batch), following the method above."""
    return measure_raced(launch, sync, None, input_sets=input_sets, plan=plan, clock=clock).samples


def measure_raced(launch: Launch, sync: Sync, race: Race | None, *, input_sets: int = 1,
                  plan: TimingPlan = TimingPlan(), clock: Callable[[], float] = time.perf_counter) -> Sampled:
    """:func:`measure`, stopped as soon as ``race`` is lost (``not_winning``: the samples so far)."""
    batch = _calibrate(launch, sync, input_sets, plan, clock)
    samples: list[float] = []
    deadline = clock() + plan.max_seconds
    k = 0
    while len(samples) < plan.max_samples:
        samples.append(_batch_ms(launch, sync, batch, k, input_sets, clock) / batch)
        k += batch
        if race is not None and race.lost(samples):
            return Sampled(samples, not_winning=True)
        if len(samples) >= plan.min_samples and (spread(samples) <= plan.target_spread or clock() > deadline):
            break
    return Sampled(samples)


def interleaved(candidates: dict[str, tuple[Launch, Sync]], *, rounds: int = 15, input_sets: int = 1,
                plan: TimingPlan = TimingPlan(), clock: Callable[[], float] = time.perf_counter
                ) -> dict[str, list[float]]:
    """Round-robin samples of several candidates (finalists and the baseline), in one process."""
    batches: dict[str, int] = {}
    for name, (launch, sync) in candidates.items():
        batches[name] = _calibrate(launch, sync, input_sets, plan, clock)
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for r in range(rounds):
        order = list(candidates) if r % 2 == 0 else list(reversed(candidates))  # no fixed position
        for name in order:
            launch, sync = candidates[name]
            samples[name].append(_batch_ms(launch, sync, batches[name], r, input_sets, clock) / batches[name])
    return samples


def lead_exceeds_noise(fast: list[float], slow: list[float]) -> bool:
    """True when ``fast`` beats ``slow`` by more than their noise: fast's p90 is below slow's p10."""
    return float(np.percentile(fast, 90)) < float(np.percentile(slow, 10))


@dataclass(frozen=True)
class Speedup:
    """Baseline median / candidate median, with the range from the samples' p10/p90."""

    median: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.median:.2f}x (range {self.low:.2f}-{self.high:.2f})"


def speedup(candidate: list[float], baseline: list[float]) -> Speedup:
    c10, c50, c90 = np.percentile(candidate, [10, 50, 90])
    b10, b50, b90 = np.percentile(baseline, [10, 50, 90])
    return Speedup(float(b50 / c50), float(b10 / c90), float(b90 / c10))


# -- tasks that run inside an isolated worker (see _worker.py) ------------------------------------------

@dataclass(frozen=True)
class VariantTask:
    """Everything a worker needs to rebuild one variant (picklable: paths and names, no live objects)."""

    family: str  # family folder
    shape: tuple[int, ...]
    dtype: str
    chip: str
    backend: str
    config: dict[str, Any]
    seed: int = 0
    backend_options: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # passed to backend.run (e.g. interpreter mode, timeout)
    finalists: list[dict[str, Any]] = field(default_factory=list)
    plan: TimingPlan | None = None  # the timing plan of a search trial (None: the back-end's, the full one)
    race: Race | None = None  # the incumbent this trial's timing races against (None: timed to the end)


_Setup = tuple["Family", "Problem", "Space", "BaseBackend"]
_CACHE: dict[tuple[Any, ...], _Setup] = {}


def _setup(task: VariantTask, config: dict[str, Any] | None = None
           ) -> tuple[Family, Problem, Space, BaseBackend, KernelSource, Geometry]:
    """Family, problem, space, kernel, geometry and back-end for ``task`` (cached per worker)."""
    from ..backends import get_backend
    from ..family._render import geometry, render
    from ..family._space import Space, make_problem
    from ..family._spec import load_family
    from ..hardware._chips import get_chip
    from ..hardware._targets import DEFAULT_TARGET

    key = (task.family, task.shape, task.dtype, task.chip, task.backend, tuple(sorted(task.backend_options.items())))
    if key not in _CACHE:
        fam = load_family(task.family)
        chip = get_chip(task.chip)
        problem = make_problem(fam, task.shape, task.dtype, chip)
        impl = get_backend(task.backend, **task.backend_options)
        impl.check_available()
        _CACHE.clear()
        _CACHE[key] = (fam, problem, Space(problem, chip), impl)
    fam, problem, space, impl = _CACHE[key]
    cfg = config if config is not None else task.config
    if not space.is_valid(cfg):
        from .._errors import VariantFailure

        raise VariantFailure("invalid", f"not valid for shape {problem.shape_text}: "
                             + "; ".join(map(str, space.violations(cfg))))
    return fam, problem, space, impl, render(fam, cfg, task.dtype, impl.target or DEFAULT_TARGET), geometry(space, cfg)


#: Per worker process and problem: (logical inputs, float64 reference) by seed, and the kernel's input
#: arrays by (seed, transposed inputs). Building them costs seconds at 4096^3; the problem is the same
#: for every trial of a study, so a worker builds them once (they go with ``_CACHE``'s problem).
_DATA: dict[Any, Any] = {}


def _problem_data(problem: Any, seed: int, with_reference: bool = True) -> tuple[dict[str, Any], list[Any] | None]:
    from ._verify import make_inputs, reference

    key = (problem.family.name, problem.shape_text, problem.dtype, seed)
    if _DATA.get("problem") != (problem.family.name, problem.shape_text, problem.dtype):
        _DATA.clear()
        _DATA["problem"] = (problem.family.name, problem.shape_text, problem.dtype)
    if key not in _DATA:
        _DATA[key] = [make_inputs(problem, seed), None]
    if with_reference and _DATA[key][1] is None:
        _DATA[key][1] = reference(problem, _DATA[key][0])
    return _DATA[key][0], _DATA[key][1]


def _timing_inputs(problem: Any, seed: int, geo: Any) -> list[Any]:
    """The kernel's inputs for timing, the same array objects for every variant with the same layout
    (a back-end may keep its device copies of them across variants)."""
    from ._verify import kernel_inputs

    logical, _ = _problem_data(problem, seed, with_reference=False)
    key = ("kernel", seed, tuple(sorted(geo.transposed_inputs)))
    if key not in _DATA:
        _DATA[key] = kernel_inputs(problem, logical, geo)
    inputs: list[Any] = _DATA[key]
    return inputs


def _check(impl: BaseBackend, kernel: KernelSource, geo: Geometry, problem: Problem, seed: int,
           options: dict[str, Any]) -> dict[str, Any]:
    from .._errors import VariantFailure
    from ._verify import verify_kernel

    check, diagnostics = verify_kernel(impl, kernel, geo, problem, seed, data=_problem_data(problem, seed),
                                       **options)
    if not check.ok:
        raise VariantFailure(check.reason or "wrong", check.detail or check.summary())
    errors = [d for d in diagnostics if getattr(d, "severity", "error") == "error"]
    if errors:
        raise VariantFailure(getattr(errors[0], "kind", "diagnostic"), str(errors[0]))
    return {"max_abs_err": check.max_abs_err, "max_rel_err": check.max_rel_err, "shape": list(problem.shape),
            "warnings": [str(d) for d in diagnostics]}


def verify_variant(task: VariantTask) -> dict[str, Any]:
    """Run once with fresh random inputs (outputs pre-filled with NaN) and compare with the reference."""
    fam, problem, space, impl, kernel, geo = _setup(task)
    options = {**task.options, **({"chip": space.chip} if impl.interprets else {})}
    if impl.interprets and "lines" not in options:  # failures name the template file:line
        from ..interp import template_lines

        options["lines"] = template_lines(fam, task.config, task.dtype, kernel.target)
    sample = options.pop("sample_threadgroups", None)
    if sample:  # a big problem on the interpreter: a sample of its threadgroups, checked against the reference
        from ._verify import sample_threadgroups

        options["threadgroups"] = sample_threadgroups(geo, int(sample), task.seed)
    out = _check(impl, kernel, geo, problem, task.seed, options)
    if sample:
        out["threadgroups_checked"] = len(options["threadgroups"])
    return out


def measure_variant(task: VariantTask) -> dict[str, Any]:
    """Build, verify (NaN-prefilled outputs against the float64 reference), then time one variant on a
    real GPU. Inputs and the reference are built once per worker and problem, not per variant.

    A back-end that calls kernels as consumers do (``consumer_kernel``) times the variant that way, in graph use
    with cold weights (10 rounds of 8 calls): a kernel of a few microseconds timed by separate launches is mostly
    launch overhead, and the search would rank noise. The final round then times the finalists in every mode."""
    fam, problem, space, impl, kernel, geo = _setup(task)
    check = _check(impl, kernel, geo, problem, task.seed, task.options)
    if hasattr(impl, "consumer_kernel"):
        from ._consumer import ConsumerPlan, consumer_samples, weight_sets
        from ._verify import make_inputs

        key = ("consumer sets", task.seed)
        if key not in _DATA:
            _DATA[key] = _weight_sets(task, fam, problem, space, impl, make_inputs, weight_sets)
        call = impl.consumer_kernel(kernel, geo, fam, problem, _DATA[key])
        clock = getattr(impl, "clock", time.perf_counter)
        rounds = task.race.after if task.race is not None else 10
        samples = consumer_samples({"k": call}, impl.evaluate, impl.sync,  # type: ignore[attr-defined]
                                   ConsumerPlan(rounds=rounds, modes=("graph",)), clock=clock)["graph"]["k"]
        lost = task.race is not None and task.race.lost(samples)  # racing: the same rule on graph samples
        if task.race is not None and not lost:
            samples += consumer_samples({"k": call}, impl.evaluate, impl.sync,  # type: ignore[attr-defined]
                                        ConsumerPlan(rounds=10 - rounds, modes=("graph",), warmup=0),
                                        clock=clock)["graph"]["k"]
        return {**check, "samples_ms": samples, "median_ms": float(np.median(samples)), "spread": spread(samples),
                "compile_seconds": getattr(impl, "compile_seconds", {}).get(kernel.sha256, 0.0),
                "not_winning": True if lost else None}
    inputs = _timing_inputs(problem, task.seed + 1, geo)
    extra = {k: v for k, v in (("plan", task.plan), ("race", task.race)) if v is not None}
    timing = impl.time(kernel, geo, inputs, problem.dtype, **task.options, **extra)
    return {**check, "samples_ms": list(timing.samples_ms), "median_ms": timing.median_ms,
            "spread": timing.spread, "compile_seconds": timing.compile_seconds, "not_winning": timing.not_winning}


def prepare_variant(task: VariantTask) -> dict[str, Any]:
    """Render and compile one variant ahead of its timing, in a compile worker (not the timing process).

    The back-end's ``precompile`` does what can truly run in another process: MLX's CUDA back-end keeps
    NVRTC's output on disk by kernel name (``MLX_PTX_CACHE_DIR``), so compiling here makes the timing
    process's first launch a load; on Metal it is a compile check only. A render or compile error fails
    the variant here, without the timing process.
    """
    _, problem, _, impl, kernel, geo = _setup(task)
    start = time.perf_counter()
    precompile = getattr(impl, "precompile", None)
    shapes = [tuple(x.shape) for x in _timing_inputs(problem, task.seed + 1, geo)]
    done = bool(precompile(kernel, geo, shapes, problem.dtype)) if precompile is not None else False
    return {"compiled": done, "seconds": time.perf_counter() - start}


def final_round(task: VariantTask) -> dict[str, Any]:
    """Re-time the finalists interleaved with the family's baseline op as consumers call them (a fresh worker
    runs this): through the exported package's own planned calls, in graph and eager use, with cold weights
    (:mod:`kernsearch.evaluation._consumer`).

    The back-end provides ``consumer_kernel(kernel, geometry, family, problem, sets)`` and
    ``consumer_op(family, problem, sets)`` (each a ``call(i)``), ``evaluate(outputs)`` and ``sync()``. One
    without them (a simulation timing launches) has its finalists timed by separate launches: a result without
    consumer modes, which the gate records but never ships as a win (docs/artifacts.md).
    """
    from ._consumer import ConsumerPlan, consumer_samples, weight_sets
    from ._verify import make_inputs

    fam, problem, space, impl, _, _ = _setup(task)
    if not hasattr(impl, "consumer_kernel"):
        return _final_round_by_launches(task, fam, problem, impl, make_inputs(problem, task.seed + 2))
    sets = _weight_sets(task, fam, problem, space, impl, make_inputs, weight_sets)
    candidates = {}
    for i, cfg in enumerate(task.finalists):
        _, _, _, _, kernel, geo = _setup(task, cfg)
        candidates[f"f{i}"] = impl.consumer_kernel(kernel, geo, fam, problem, sets)
    out: dict[str, Any] = {"weight_sets": len(sets)}
    try:
        candidates["baseline"] = impl.consumer_op(fam, problem, sets)  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - no baseline is not fatal, and is said
        out["baseline_error"] = str(exc)
    samples = consumer_samples(candidates, impl.evaluate, impl.sync, ConsumerPlan(),  # type: ignore[attr-defined]
                               clock=getattr(impl, "clock", time.perf_counter))
    n = len(task.finalists)
    out["modes"] = {mode: {"finalists": [by[f"f{i}"] for i in range(n)], "baseline": by.get("baseline")}
                    for mode, by in samples.items()}
    out["finalists"], out["baseline"] = out["modes"]["graph"]["finalists"], out["modes"]["graph"]["baseline"]
    return out


def _final_round_by_launches(task: VariantTask, fam: Any, problem: Any, impl: Any,
                             logical: dict[str, np.ndarray]) -> dict[str, Any]:
    """The finalists and the op timed by separate launches, interleaved (``launcher``, ``baseline_launcher``)."""
    from ._verify import kernel_inputs

    candidates = {}
    for i, cfg in enumerate(task.finalists):
        _, _, _, _, kernel, geo = _setup(task, cfg)
        candidates[f"f{i}"] = impl.launcher(kernel, geo, kernel_inputs(problem, logical, geo), problem.dtype)
    out: dict[str, Any] = {}
    try:
        candidates["baseline"] = impl.baseline_launcher(fam, problem, logical)
    except Exception as exc:  # noqa: BLE001 - no baseline is not fatal, and is said
        out["baseline_error"] = str(exc)
    samples = interleaved(candidates, clock=getattr(impl, "clock", time.perf_counter))
    out["finalists"] = [samples[f"f{i}"] for i in range(len(task.finalists))]
    out["baseline"] = samples.get("baseline")
    return out


def _weight_sets(task: VariantTask, fam: Any, problem: Any, space: Any, impl: Any, make_inputs: Any,
                 weight_sets: Any) -> list[dict[str, Any]]:
    """Input sets for the final round: one set of activations, and enough copies of the weight inputs that
    they total more than twice the chip's last-level cache (the others share the first set's arrays)."""
    first = make_inputs(problem, task.seed + 2)
    weights = [t.name for t in fam.inputs if t.weight]
    wbytes = sum(first[n].nbytes for n in weights)
    cache = float(getattr(space.chip, "system_cache_mb", 0) or 0) * 2**20 or getattr(impl, "cache_bytes", 48e6)
    n = weight_sets(wbytes, cache, getattr(impl, "memory_budget_bytes", 4e9))
    sets = [first]
    for k in range(1, n):
        more = make_inputs(problem, task.seed + 2 + k)
        sets.append({**first, **{name: more[name] for name in weights}})
    return sets


def time_baseline(task: VariantTask) -> float:
    """Median time (ms) of the family's baseline op on the problem, measured like a variant."""
    from ._verify import make_inputs

    fam, problem, _, impl, _, _ = _setup(task)
    logical = make_inputs(problem, task.seed + 2)
    launch, sync = impl.baseline_launcher(fam, problem, logical)
    return float(np.median(measure(launch, sync, clock=getattr(impl, "clock", time.perf_counter))))

"""The worker entry points: one variant rebuilt from a picklable :class:`VariantTask` in an isolated worker
(``evaluation/_worker.py``), then verified, timed, compiled ahead or re-timed in the final round there.

Each entry point returns a typed record (``kernsearch._records``): :func:`verify_variant` a ``Proof``,
:func:`measure_variant` a ``Measurement``, :func:`final_round` ``FinalTimings``, :func:`prepare_variant`
:class:`Prepared`. The timing method itself (samples, spreads, interleaving, racing, consumer calls) lives in
``kernsearch.evaluation``; the back-end that runs the kernel in ``kernsearch.backends``.

A worker process serves one problem at a time (a study's): what it builds for the problem (family, space,
back-end; the inputs and their float64 reference, seconds at 4096^3) is kept by its :class:`ProcessCache` and
dropped when a task for another problem arrives.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .._records import FinalTimings, Measurement, ModeSamples, Proof
from .._vocabulary import ConsumerMode, Severity, TrialStatus, Verdict, Verifier

if TYPE_CHECKING:
    from ..backends._base import BaseBackend
    from ..evaluation._measure import TimingPlan
    from ..evaluation._race import Race
    from ..family._render import Geometry, KernelSource
    from ..family._space import Problem, Space
    from ..family._spec import Family


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
    # the final round: the config of the key's current version, rendered to its published source (the objective
    # checked it), timed against the leading finalist in paired rounds (None: no current version to time)
    incumbent: dict[str, Any] | None = None


@dataclass(frozen=True)
class Prepared:
    """A variant compiled ahead of its timing: whether the back-end could compile it in this process, and how long
    rendering and compiling took."""

    compiled: bool
    seconds: float


@dataclass(frozen=True)
class Setup:
    """A task's problem as a worker builds it."""

    family: Family
    problem: Problem
    space: Space
    backend: BaseBackend


class ProcessCache:
    """What one worker process keeps for the problem it serves: its :class:`Setup`, and its data (logical inputs
    and float64 reference by seed, the kernel's input arrays by layout, the final round's weight sets). A task for
    another problem starts afresh."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._setup: Setup | None = None
        self._problem: tuple[str, str, str] | None = None
        self._data: dict[Any, Any] = {}

    def setup(self, task: VariantTask) -> Setup:
        from ..backends import get_backend
        from ..family._space import Space, make_problem
        from ..family._spec import load_family
        from ..hardware._chips import get_chip

        key = (task.family, task.shape, task.dtype, task.chip, task.backend,
               tuple(sorted(task.backend_options.items())))
        if key != self._key or self._setup is None:
            fam = load_family(task.family)
            chip = get_chip(task.chip)
            problem = make_problem(fam, task.shape, task.dtype, chip)
            impl = get_backend(task.backend, **task.backend_options)
            impl.check_available()
            self._key, self._setup = key, Setup(fam, problem, Space(problem, chip), impl)
        return self._setup

    def data(self, problem: Problem, key: Any, make: Callable[[], Any]) -> Any:
        """``make()``, once per ``key`` while this process serves ``problem``."""
        this = (problem.family.name, problem.shape_text, problem.dtype)
        if self._problem != this:
            self._problem, self._data = this, {}
        if key not in self._data:
            self._data[key] = make()
        return self._data[key]

    def problem_data(self, problem: Problem, seed: int, with_reference: bool = True) -> tuple[Any, Any]:
        """(logical inputs, float64 reference or None) of ``problem`` for ``seed``."""
        from ..evaluation._verify import make_inputs, reference

        held = self.data(problem, ("problem", seed), lambda: [make_inputs(problem, seed), None])
        if with_reference and held[1] is None:
            held[1] = reference(problem, held[0])
        return held[0], held[1]

    def timing_inputs(self, problem: Problem, seed: int, geo: Geometry) -> list[Any]:
        """The kernel's inputs for timing, the same array objects for every variant with the same layout
        (a back-end may keep its device copies of them across variants)."""
        from ..evaluation._verify import kernel_inputs

        logical, _ = self.problem_data(problem, seed, with_reference=False)
        inputs: list[Any] = self.data(problem, ("kernel", seed, tuple(sorted(geo.transposed_inputs))),
                                      lambda: kernel_inputs(problem, logical, geo))
        return inputs


#: This process's cache (a worker serves one problem at a time; see :class:`ProcessCache`).
PROCESS = ProcessCache()


def _variant(task: VariantTask, config: dict[str, Any] | None = None) -> tuple[Setup, KernelSource, Geometry]:
    """The task's setup, and the kernel and launch geometry of ``config`` (default: the task's)."""
    from .._errors import VariantFailure
    from ..family._render import geometry, render
    from ..hardware._targets import DEFAULT_TARGET

    s = PROCESS.setup(task)
    cfg = config if config is not None else task.config
    if not s.space.is_valid(cfg):
        raise VariantFailure(TrialStatus.INVALID, f"not valid for shape {s.problem.shape_text}: "
                             + "; ".join(map(str, s.space.violations(cfg))))
    return s, render(s.family, cfg, task.dtype, s.backend.target or DEFAULT_TARGET), geometry(s.space, cfg)


def _check(s: Setup, kernel: KernelSource, geo: Geometry, seed: int, options: dict[str, Any]) -> Proof:
    """Run the variant once (outputs pre-filled with NaN) against the float64 reference; a wrong one (or one the
    back-end reports an error diagnostic for) raises :class:`VariantFailure`."""
    from .._errors import VariantFailure
    from ..evaluation._verify import verify_kernel

    check, diagnostics = verify_kernel(s.backend, kernel, geo, s.problem, seed,
                                       data=PROCESS.problem_data(s.problem, seed), **options)
    errors = [d for d in diagnostics if getattr(d, "severity", Severity.ERROR) == Severity.ERROR]
    bounds = [d for d in errors if getattr(d, "kind", "") == "device_bounds"]
    if bounds:  # an access outside a buffer explains a wrong result (and is a bug where the result is right)
        located = [d for d in bounds if getattr(d, "template_line", None)] or bounds
        raise VariantFailure("device_bounds", str(located[0]))
    if not check.ok:
        raise VariantFailure(check.reason or "wrong", _with_hint(check, options))
    if errors:
        raise VariantFailure(getattr(errors[0], "kind", "diagnostic"), str(errors[0]))
    verifier = Verifier.INTERPRETER if s.backend.interprets else Verifier.DEVICE
    threadgroups = options.get("threadgroups")
    return Proof(verifier, (s.problem.shape_text,), check.max_abs_err, check.max_rel_err,
                 len(threadgroups) if threadgroups else None)


def _with_hint(check: Any, options: dict[str, Any]) -> str:
    """The failure's detail; a NaN (or unwritten element) found in fast mode also says that check mode says why."""
    detail = str(check.detail or check.summary())
    if check.reason in ("nan", "unwritten") and options.get("mode", "fast") == "fast":
        detail += ("; `kernsearch verify ... --check` says why (races, missing barriers, uninitialized reads, "
                   "with their template lines)")
    return detail


def verify_variant(task: VariantTask) -> Proof:
    """Run once with fresh random inputs (outputs pre-filled with NaN) and compare with the reference."""
    s, kernel, geo = _variant(task)
    options = {**task.options, **({"chip": s.space.chip} if s.backend.interprets else {})}
    if s.backend.interprets and "lines" not in options:  # failures name the template file:line
        from ..interp import template_lines

        options["lines"] = template_lines(s.family, task.config, task.dtype, kernel.target)
    sample = options.pop("sample_threadgroups", None)
    if sample:  # a big problem on the interpreter: a sample of its threadgroups, checked against the reference
        from ..evaluation._verify import sample_threadgroups

        options["threadgroups"] = sample_threadgroups(geo, int(sample), task.seed)
    return _check(s, kernel, geo, task.seed, options)


def measure_variant(task: VariantTask) -> Measurement:
    """Build, verify (NaN-prefilled outputs against the float64 reference), then time one variant on a
    real GPU. Inputs and the reference are built once per worker and problem, not per variant.

    A back-end that times kernels as consumers call them (``times_as_consumers``) times the variant that way, in
    graph use with cold weights (10 rounds of 8 calls): a kernel of a few microseconds timed by separate launches
    is mostly launch overhead, and the search would rank noise.
    The final round then times the finalists in every mode."""
    from ..evaluation._measure import spread

    s, kernel, geo = _variant(task)
    proof = _check(s, kernel, geo, task.seed, task.options)
    if s.backend.times_as_consumers:
        samples, lost = _consumer_timing(task, s, kernel, geo)
        compiled = getattr(s.backend, "compile_seconds", {}).get(kernel.sha256, 0.0)
        return Measurement(tuple(samples), float(np.median(samples)), spread(samples), compiled, lost, proof)
    inputs = PROCESS.timing_inputs(s.problem, task.seed + 1, geo)
    extra = {k: v for k, v in (("plan", task.plan), ("race", task.race)) if v is not None}
    timing = s.backend.time(kernel, geo, inputs, s.problem.dtype, **task.options, **extra)
    return Measurement(tuple(timing.samples_ms), timing.median_ms, timing.spread, timing.compile_seconds,
                       timing.not_winning, proof)


def _consumer_timing(task: VariantTask, s: Setup, kernel: KernelSource, geo: Geometry) -> tuple[list[float], bool]:
    """Samples of the variant called as consumers call it (the family's first declared mode, cold weights: a
    chain of dependent calls for decode families), racing the incumbent by the same rule as launches: (samples,
    stopped because it could not win)."""
    from ..evaluation._consumer import ConsumerPlan, consumer_samples

    impl = s.backend
    sets = PROCESS.data(s.problem, ("consumer sets", task.seed), lambda: _weight_sets(task, s))
    call = impl.consumer_kernel(kernel, geo, s.family, s.problem, sets)
    clock = impl.clock
    rounds = task.race.after if task.race is not None else 10
    mode = judging_mode(s.family)
    samples = consumer_samples({"k": call}, impl.evaluate, impl.sync, ConsumerPlan(rounds=rounds, modes=(mode,)),
                               clock=clock)[mode]["k"]
    lost = task.race is not None and task.race.lost(samples)
    if task.race is not None and not lost:
        samples += consumer_samples({"k": call}, impl.evaluate, impl.sync,
                                    ConsumerPlan(rounds=10 - rounds, modes=(mode,), warmup=0),
                                    clock=clock)[mode]["k"]
    return samples, lost


def judging_mode(family: Any) -> str:
    """The consumer mode the search's objective, racing and the final round's ranking use: the family's first
    declared mode (``graph``, the chain, unless the family says otherwise)."""
    modes = list(getattr(family, "consumer_modes", None) or [ConsumerMode.GRAPH.value])
    return str(modes[0])


def prepare_variant(task: VariantTask) -> Prepared:
    """Render and compile one variant ahead of its timing, in the worker that will then verify and time it.

    MLX keeps a compiled custom kernel in the process that compiled it (``cuda_kernel`` never writes NVRTC's
    output to its disk cache: ``docs/timing.md``), so the worker that compiles a config also times it
    (:class:`kernsearch.evaluation._worker.PinnedPool`), its first launch then a lookup. What that timing needs
    from the CPU is built here too, while another worker times: the float64 reference and the consumer weight
    sets. A render or compile error fails the variant here, before anything is timed.
    """
    s, kernel, geo = _variant(task)
    start = time.perf_counter()
    shapes = [tuple(x.shape) for x in PROCESS.timing_inputs(s.problem, task.seed + 1, geo)]
    done = bool(s.backend.precompile(kernel, geo, shapes, s.problem.dtype))
    PROCESS.problem_data(s.problem, task.seed)  # the reference the verification compares with
    if s.backend.times_as_consumers:  # the weight sets its timing calls the kernel on
        PROCESS.data(s.problem, ("consumer sets", task.seed), lambda: _weight_sets(task, s))
    return Prepared(done, time.perf_counter() - start)


def final_round(task: VariantTask) -> FinalTimings:
    """Re-time the finalists interleaved with the family's baseline op as consumers call them (a fresh worker
    runs this): through the exported package's own planned calls, in graph and eager use, with cold weights
    (:mod:`kernsearch.evaluation._consumer`).

    A back-end that declares ``times_as_consumers`` provides ``consumer_kernel(kernel, geometry, family, problem,
    sets)`` and ``consumer_op(family, problem, sets)`` (each a ``call(i)``), ``evaluate(outputs)`` and ``sync()``
    (``backends._base``). One that does not (a simulation timing launches) has its finalists timed by separate
    launches: timings without consumer modes, which the gate records but never ships as a win (docs/artifacts.md).
    """
    from ..evaluation._consumer import ConsumerPlan, consumer_samples, timed_modes

    s = PROCESS.setup(task)
    impl = s.backend
    if not impl.times_as_consumers:
        return _final_round_by_launches(task, s)
    sets = _weight_sets(task, s)
    candidates = {}
    for i, cfg in enumerate(task.finalists):
        _, kernel, geo = _variant(task, cfg)
        candidates[f"f{i}"] = impl.consumer_kernel(kernel, geo, s.family, s.problem, sets)
    error = None
    try:
        candidates["baseline"] = impl.consumer_op(s.family, s.problem, sets)
    except Exception as exc:  # noqa: BLE001 - no baseline is not fatal, and is said
        error = str(exc)
    plan = ConsumerPlan(modes=timed_modes(s.family.consumer_modes))
    clock = impl.clock
    samples = consumer_samples(candidates, impl.evaluate, impl.sync, plan, clock=clock)
    n = len(task.finalists)
    modes = {mode: ModeSamples(tuple(tuple(by[f"f{i}"]) for i in range(n)),
                               tuple(by["baseline"]) if "baseline" in by else None)
             for mode, by in samples.items()}
    timings = FinalTimings(modes, len(sets), error, rank_mode=judging_mode(s.family))
    if "baseline" not in candidates:
        return timings
    timings = _decide_paired(timings, candidates, impl, tuple(s.family.consumer_modes), clock)
    return _versus_current(timings, task, s, sets, candidates, clock)


def _decide_paired(timings: FinalTimings, candidates: dict[str, Any], impl: Any, judged: tuple[str, ...],
                   clock: Callable[[], float]) -> FinalTimings:
    """The ranking's fastest finalist and the op in fresh paired rounds, added until the interval of the median
    per-round ratio decides in the modes the family is judged in, or a cap (docs/timing.md)."""
    medians = [float(np.median(f)) for f in timings.finalists]
    first = int(np.argmin(medians))
    ratios = _paired(candidates[f"f{first}"], candidates["baseline"], impl, judged, clock)
    return replace(timings, paired=ratios, paired_finalist=first)


def _paired(kernel: Any, other: Any, impl: Any, judged: tuple[str, ...], clock: Callable[[], float]
            ) -> dict[str, tuple[float, ...]]:
    """Per-round ratios (``other``'s time / ``kernel``'s) by mode, in fresh paired rounds added until their interval
    decides in the ``judged`` modes (``_rules.decide``), or a cap."""
    from .._rules import decide
    from ..evaluation._consumer import PairedPlan, paired_rounds, timed_modes

    ratios = paired_rounds(kernel, other, impl.evaluate, impl.sync, lambda r: decide(r, judged) != Verdict.UNDECIDED,
                           PairedPlan(modes=timed_modes(judged)), clock=clock)
    return {m: tuple(r) for m, r in ratios.items()}


def _versus_current(timings: FinalTimings, task: VariantTask, s: Setup, sets: list[dict[str, Any]],
                    candidates: dict[str, Any], clock: Callable[[], float]) -> FinalTimings:
    """The paired finalist against the key's current version (``task.incumbent``) in fresh paired rounds, added until
    the interval decides as the gate will read it, or a cap: the gate then compares two kernels timed back to back
    in one run. Nothing is timed where the finalist is the current version's config, and a current version that
    cannot be called is not timed (the gate falls back to the two runs' figures)."""
    first = timings.paired_finalist
    if task.incumbent is None or first is None or task.finalists[first] == task.incumbent:
        return timings
    impl = s.backend
    try:
        _, kernel, geo = _variant(task, task.incumbent)
        current = impl.consumer_kernel(kernel, geo, s.family, s.problem, sets)
        ratios = _paired(candidates[f"f{first}"], current, impl, tuple(s.family.consumer_modes), clock)
    except Exception:  # noqa: BLE001 - a current version that cannot be called here is not timed (and not a failure)
        return timings
    return replace(timings, against_current=ratios)


def _final_round_by_launches(task: VariantTask, s: Setup) -> FinalTimings:
    """The finalists and the op timed by separate launches, interleaved (``launcher``, ``baseline_launcher``)."""
    from ..evaluation._measure import interleaved
    from ..evaluation._verify import kernel_inputs, make_inputs

    impl: Any = s.backend
    logical = make_inputs(s.problem, task.seed + 2)
    candidates = {}
    for i, cfg in enumerate(task.finalists):
        _, kernel, geo = _variant(task, cfg)
        candidates[f"f{i}"] = impl.launcher(kernel, geo, kernel_inputs(s.problem, logical, geo), s.problem.dtype)
    error = None
    try:
        candidates["baseline"] = impl.baseline_launcher(s.family, s.problem, logical)
    except Exception as exc:  # noqa: BLE001 - no baseline is not fatal, and is said
        error = str(exc)
    samples = interleaved(candidates, clock=impl.clock)
    launches = ModeSamples(tuple(tuple(samples[f"f{i}"]) for i in range(len(task.finalists))),
                           tuple(samples["baseline"]) if "baseline" in samples else None)
    return FinalTimings({}, baseline_error=error, launches=launches)


def _weight_sets(task: VariantTask, s: Setup) -> list[dict[str, Any]]:
    """Input sets for the final round (:func:`~kernsearch.evaluation._consumer.input_sets`)."""
    from ..evaluation._consumer import input_sets

    return input_sets(s.problem, s.family, s.space.chip, s.backend, task.seed + 2)


def time_baseline(task: VariantTask) -> float:
    """Median time (ms) of the family's baseline op on the problem, measured like a variant."""
    from ..evaluation._measure import measure
    from ..evaluation._verify import make_inputs

    s = PROCESS.setup(task)
    logical = make_inputs(s.problem, task.seed + 2)
    launch, sync = s.backend.baseline_launcher(s.family, s.problem, logical)
    return float(np.median(measure(launch, sync, clock=s.backend.clock)))

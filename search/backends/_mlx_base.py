"""What the two MLX back-ends share: arrays in and out, building once, one submission per launch.

``metal`` (``mx.fast.metal_kernel``) and ``cuda`` (``mx.fast.cuda_kernel``) differ only in how a kernel
object is made, how availability is checked and how a compiler error reads; everything else is here.

Timing follows :mod:`kernsearch.evaluation._measure` (``docs/timing.md``): ``launch`` submits one run and ``sync``
waits for the device (``mx.synchronize``); a batch's wall time over its size is one sample. Each launch is
its own submission (``mx.async_eval``): within one evaluation MLX may run independent kernels concurrently
(a CUDA graph; a concurrent Metal encoder), so a batch evaluated at once would time the throughput of
overlapping small grids instead of one kernel's duration. Inputs are rotated among copies when the working
set would sit in the last-level cache, so a launch does not find its operands hot from the previous one.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from .._errors import BackendError, VariantFailure
from .._vocabulary import Evidence
from ..family._render import Geometry, KernelSource
from ._base import BaseBackend, RunResult, Timing

#: A batch keeps every launch's outputs alive until its sync: at most this many bytes of them.
_MAX_BATCH_OUTPUT_BYTES = 1e9


def mx_core() -> Any:
    try:
        import mlx.core as mx
    except ImportError:  # pragma: no cover - MLX is a dependency
        raise BackendError("this back-end needs MLX (pip install mlx, or 'mlx[cuda13]' on NVIDIA)") from None
    return mx


def to_mx(array: np.ndarray, dtype: str) -> Any:
    """A NumPy array (values exact in ``dtype``) as a contiguous MLX array of ``dtype`` on the device."""
    mx = mx_core()
    if dtype in ("uint32", "int32"):
        out = mx.array(np.ascontiguousarray(array, dtype=dtype))
        mx.eval(out)
        return out
    host = np.ascontiguousarray(array, dtype=np.float16 if dtype == "float16" else np.float32)
    out = mx.array(host)
    if dtype == "bfloat16":
        out = out.astype(mx.bfloat16)
    mx.eval(out)
    return out


def to_numpy(array: Any) -> np.ndarray:
    return np.array(array.astype(mx_core().float32), dtype=np.float64)


def mlx_namespace() -> dict[str, Any]:
    """The array functions a family's ``baseline`` expression may call, as MLX ops (``_vocab``)."""
    from ..family._vocab import mlx_namespace as vocabulary

    return vocabulary(mx_core())


def kernel_arrays(inputs: list[np.ndarray], geometry: Geometry, dtype: str) -> list[Any]:
    """The kernel's inputs on the device, each in its own dtype (``geometry.input_dtypes``)."""
    return [to_mx(x, geometry.input_dtype(i, dtype)) for i, x in enumerate(inputs)]


def judge_op(family: Any, problem: Any) -> Callable[..., Any]:
    """The op a kernel is judged against, a function of the family's input arrays: the baseline expression of the
    outputs a consumer reads (not the scratch ones) as the plain MLX ops a user writes
    (:func:`kernsearch.evaluation._plain_op.plain_op`: planned once, each value computed once), ``mx.compile``d only
    where the family gives a reason (``compile_baseline``); its parameters and the problem's dimensions bound. Every
    timing of the op uses it: the search's, the final round's, the gate's and ``rejudge``'s."""
    from ..evaluation._plain_op import plain_op
    from ..family._tree import expr_tree

    mx = mx_core()
    names = {**problem.dims, **family.param_values}
    direct = {"quantized_matmul": mx.quantized_matmul, "rms_norm": mx.fast.rms_norm,
              "layer_norm": mx.fast.layer_norm, "matmul": mx.matmul,
              "softmax": functools.partial(mx.softmax, axis=-1, precise=True)}
    fn = plain_op(expr_tree(family.judged_baseline), [t.name for t in family.inputs], names,
                  {**mlx_namespace(), **direct}, _TRAILING)
    return mx.compile(fn) if family.compile_baseline else fn


def _bound_chain(family: Any, call: Callable[..., Any], arrays: list[list[Any]], link: Any) -> Callable[..., Any]:
    """``call`` (a function of all the family's inputs) behind the exported package's bound front, one binding per
    input set (:func:`~kernsearch.exporting.runtime._binding.bind_plan`), each planned once here, untimed, as a
    decoder's first token is; chained as the op is, the activations passed."""
    from ..evaluation._chain import chained
    from ..exporting.runtime._binding import bind_plan

    inputs = [(t.name, t.weight) for t in family.inputs]
    weights = [i for i, (_, weight) in enumerate(inputs) if weight]
    acts = [i for i, (_, weight) in enumerate(inputs) if not weight]
    fronts = [bind_plan(family.name, inputs, call, [row[i] for i in weights]) for row in arrays]
    for front, row in zip(fronts, arrays):
        front(*[row[i] for i in acts])
    return chained(fronts, arrays, link, acts)


#: The vocabulary functions :func:`judge_op` calls as the MLX function itself (as a user does, no wrapper frame):
#: the keyword names of their trailing constant arguments (``_rules.mlx_namespace`` has the same meanings).
_TRAILING = {"quantized_matmul": ("transpose", "group_size", "bits"), "rms_norm": ("eps",),
             "layer_norm": ("eps",), "matmul": (), "softmax": ("axis",)}


def baseline_call(family: Any, problem: Any) -> tuple[list[str], list[str], Callable[[list[Any]], list[Any]]]:
    """(input names, their dtypes, call): the family's MLX baseline op (:func:`judge_op`) on device arrays of its
    inputs, each output an array of the returned list."""
    names = [t.name for t in family.inputs]
    dtypes = [t.resolved_dtype(problem.dtype) for t in family.inputs]
    fn = judge_op(family, problem)

    def call(arrays_: list[Any]) -> list[Any]:
        out = fn(*arrays_)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    return names, dtypes, call


def separate_launches(call: Callable[[list[Any]], list[Any]], copies: list[list[Any]]
                      ) -> tuple[Callable[[int], object], Callable[[], None]]:
    """``launch`` submits one run on the next input copy without waiting; ``sync`` waits for all."""
    mx = mx_core()
    pending: list[Any] = []
    turn = [0]

    def launch(_: int) -> object:  # rotates its own input copies, whatever set the caller names
        outs = call(copies[turn[0] % len(copies)])
        turn[0] += 1
        mx.async_eval(outs)
        pending.append(outs)  # alive until the sync
        return None

    def sync() -> None:
        mx.synchronize()
        pending.clear()

    return launch, sync


class MLXBackend(BaseBackend):
    """Builds, runs and times rendered kernels through ``mx.fast`` (evidence: measured)."""

    evidence = Evidence.MEASURED
    measures_device = True
    rotates_inputs = True
    compiles_ahead = True
    times_as_consumers = True  # the exported package's planned calls, in graph and eager use
    #: Last-level cache assumed when deciding how many input copies to rotate.
    default_cache_bytes: float = 48e6
    default_memory_budget_bytes: float = 2e9

    def __init__(self, plan: Any = None, cache_bytes: float | None = None,
                 memory_budget_bytes: float | None = None) -> None:
        from ..evaluation._measure import TimingPlan

        self.plan = plan if plan is not None else TimingPlan()
        self.cache_bytes = cache_bytes if cache_bytes is not None else self.default_cache_bytes
        self.memory_budget_bytes = memory_budget_bytes or self.default_memory_budget_bytes
        self._kernels: dict[tuple[str, int], Any] = {}
        self.compile_seconds: dict[str, float] = {}  # per source hash: wall time of its first launch here
        self._copies: tuple[Any, list[list[Any]], list[np.ndarray]] | None = None
        #: The last consumer sets uploaded: (their ids, the device arrays, the sets themselves).
        self._consumer_kept: tuple[tuple[int, ...], list[list[Any]], list[dict[str, np.ndarray]]] | None = None
        #: The chain's link per family (one object: candidates and the op derive their activations alike).
        self._links: dict[str, Any] = {}

    # -- what differs between Metal and CUDA ----------------------------------------------------------
    def _make_kernel(self, source: KernelSource, geometry: Geometry) -> Any:
        """The kernel object of a variant: built by its target's factory (``_targets.TARGETS``)."""
        from .._rules import factory_texts
        from ..hardware._targets import get_target, kernel_factory

        target = get_target(source.target)
        extra = {"shared_memory": int(geometry.shared_memory)} if target.shared_memory_at_build else {}
        mx_core()  # MLX missing: its one-line error
        texts = factory_texts(target.name, source.header, source.source, int(geometry.shared_memory))
        return kernel_factory(target.name)(
            name=source.name, input_names=list(source.input_names), output_names=list(source.output_names),
            source=texts.source, header=texts.header, ensure_row_contiguous=True, **extra)

    def classify(self, exc: Exception) -> VariantFailure:
        """An MLX exception while building or running one variant, as that variant's failure."""
        text = str(exc).strip()
        if "compile" in text.lower() or "program_source" in text:
            return VariantFailure("compile", text[:1500])
        return VariantFailure("launch", text.splitlines()[0][:500] if text else type(exc).__name__)

    # -- building and running -------------------------------------------------------------------------
    def kernel(self, source: KernelSource, geometry: Geometry) -> Any:
        """The kernel object of a variant, made once per source (and shared-memory size)."""
        if source.target != self.target:
            raise BackendError(f"the {self.name} back-end runs {self.target} templates, not {source.target!r} ones")
        key = (source.sha256, int(geometry.shared_memory))
        if key not in self._kernels:
            self._kernels[key] = self._make_kernel(source, geometry)
        return self._kernels[key]

    def _call(self, source: KernelSource, geometry: Geometry, arrays: list[Any],
              init_value: float | None) -> list[Any]:
        mx = mx_core()
        extra = {} if init_value is None else {"init_value": float(init_value)}
        outputs: list[Any] = self.kernel(source, geometry)(
            inputs=arrays,
            template=[(k, getattr(mx, v) if isinstance(v, str) else v) for k, v in source.template],
            grid=tuple(geometry.grid), threadgroup=tuple(geometry.threadgroup),
            output_shapes=[tuple(s) for s in geometry.output_shapes],
            output_dtypes=[getattr(mx, d) for d in geometry.output_dtypes], **extra)
        return outputs

    def _first(self, source: KernelSource, geometry: Geometry, arrays: list[Any],
               init_value: float | None) -> tuple[list[Any], float]:
        """One synchronised run; the first run of a variant compiles it, and that time is kept."""
        mx = mx_core()
        start = time.perf_counter()
        try:
            outs = self._call(source, geometry, arrays, init_value)
            mx.eval(outs)
            mx.synchronize()
        except (RuntimeError, ValueError) as exc:
            raise self.classify(exc) from None
        if source.sha256 in self.compile_seconds:
            return outs, 0.0
        seconds = self.compile_seconds[source.sha256] = time.perf_counter() - start
        return outs, seconds

    def precompile(self, source: KernelSource, geometry: Geometry, shapes: list[tuple[int, ...]], dtype: str) -> bool:
        """Compile ``source`` in this process ahead of its verification and timing, which follow in this same
        process (MLX keeps a compiled kernel in memory only: ``docs/timing.md``): one threadgroup on zero inputs
        of the real shapes and dtypes (a few microseconds of GPU). True once compiled; compile errors raise.

        Each input in its own dtype (a float32 ``eps`` beside float16 rows, uint32 packed weights), as the
        timing passes them: MLX generates the kernel's signature from them, and a different signature is
        another kernel, compiled again at the first launch."""
        mx = mx_core()
        try:
            arrays = [mx.zeros(tuple(s), dtype=getattr(mx, geometry.input_dtype(i, dtype)))
                      for i, s in enumerate(shapes)]
            one = replace(geometry, grid=geometry.threadgroup)
            mx.eval(self._call(source, one, arrays, None))
            mx.synchronize()
        except (RuntimeError, ValueError) as exc:
            raise self.classify(exc) from None
        return True

    def run(self, kernel: KernelSource, geometry: Geometry, inputs: list[np.ndarray], dtype: str,
            init_value: float | None = float("nan"), **options: Any) -> RunResult:
        """Every output has a poisoned guard zone after its end (:mod:`._guard`): a write past it is reported."""
        from ._guard import guarded_run

        self.check_available()
        arrays, seconds = kernel_arrays(inputs, geometry, dtype), []

        def launch(guarded: Geometry, init: float | None) -> list[np.ndarray]:
            outs, compile_s = self._first(kernel, guarded, arrays, init)
            seconds.append(compile_s)
            return [to_numpy(o) for o in outs]

        outputs, diagnostics = guarded_run(launch, geometry, init_value, tuple(kernel.output_names))
        return RunResult(outputs, diagnostics, seconds[0])

    # -- timing ---------------------------------------------------------------------------------------
    def input_sets(self, arrays: list[np.ndarray], dtype: str, geometry: Geometry | None = None) -> int:
        """How many copies of the inputs to rotate among (:func:`kernsearch.evaluation._measure.input_sets_needed`)."""
        from ..evaluation._measure import input_sets_needed
        from ..family._spec import DTYPES

        size = DTYPES[dtype]
        working = sum(x.size for x in arrays) * size
        if geometry is not None:
            working += sum(int(np.prod(s)) for s in geometry.output_shapes) * size
        return input_sets_needed(working, self.cache_bytes, self.memory_budget_bytes)

    def launcher(self, kernel: KernelSource, geometry: Geometry, inputs: list[np.ndarray], dtype: str,
                 sets: int | None = None) -> tuple[Callable[[int], object], Callable[[], None]]:
        """``(launch, sync)`` for :mod:`kernsearch.evaluation._measure`, after one (compiling) run."""
        self.check_available()
        copies = self._device_copies(inputs, dtype, sets or self.input_sets(inputs, dtype, geometry), geometry)
        self._first(kernel, geometry, copies[0], geometry.init_value)
        return separate_launches(lambda arrays: self._call(kernel, geometry, arrays, geometry.init_value), copies)

    def _device_copies(self, inputs: list[np.ndarray], dtype: str, sets: int,
                       geometry: Geometry | None = None) -> list[list[Any]]:
        """Device copies of ``inputs`` (each in its dtype), kept while the caller passes the same arrays (one
        problem's trials in a worker): uploading 4096^3 inputs per variant costs more than timing it."""
        dtypes = tuple(geometry.input_dtype(i, dtype) if geometry else dtype for i in range(len(inputs)))
        key = (tuple(id(x) for x in inputs), dtypes, sets)
        kept = self._copies
        if kept is None or kept[0] != key:
            copies = [[to_mx(x, d) for x, d in zip(inputs, dtypes)] for _ in range(sets)]
            self._copies = kept = (key, copies, inputs)  # holding the arrays keeps their ids unique
        return kept[1]

    def baseline_launcher(self, family: Any, problem: Any, logical: dict[str, np.ndarray],
                          sets: int | None = None) -> tuple[Callable[[int], object], Callable[[], None]]:
        """``(launch, sync)`` of the family's MLX baseline op (e.g. ``mx.matmul``) on the same inputs."""
        self.check_available()
        names, dtypes, call = baseline_call(family, problem)
        arrays = [logical[n] for n in names]
        copies = [[to_mx(x, d) for x, d in zip(arrays, dtypes)]
                  for _ in range(sets or self.input_sets(arrays, problem.dtype))]
        mx_core().eval(call(copies[0]))
        return separate_launches(call, copies)

    # -- as consumers call it (the final round: kernsearch.evaluation._consumer) ------------------------
    def consumer_kernel(self, kernel: KernelSource, geometry: Geometry, family: Any, problem: Any,
                        sets: list[dict[str, np.ndarray]]) -> Callable[[int], Any]:
        """``call(i, previous=None)``: the kernel as the exported package calls it on input set ``i``, its activation
        chained from ``previous`` where given: its planned call (``_runtime.kernel_call``, layout packing inside it,
        so paid), and for a family with weights behind the package's own bound front (``family.bind(*weights)``,
        one binding per input set: :func:`~kernsearch.exporting.runtime._binding.bind_plan`), what a decode
        consumer calls."""
        from ..evaluation._chain import chained
        from ..exporting.runtime._runtime import kernel_call

        mx = mx_core()
        self.check_available()
        arrays = self._consumer_arrays(family, problem, sets)
        params = [to_mx(np.array([p.number]), p.dtype) for p in family.params.values()]
        call = kernel_call(self.kernel(kernel, geometry),
                           [(k, getattr(mx, v) if isinstance(v, str) else v) for k, v in kernel.template],
                           geometry.grid, geometry.threadgroup, geometry.output_shapes,
                           [getattr(mx, d) for d in geometry.output_dtypes], params,
                           [t.name in geometry.transposed_inputs for t in family.inputs], geometry.init_value)
        if not any(t.weight for t in family.inputs):
            return chained(call, arrays, self.consumer_link(family))
        return _bound_chain(family, call, arrays, self.consumer_link(family))

    def consumer_op(self, family: Any, problem: Any, sets: list[dict[str, np.ndarray]]) -> Callable[[int], Any]:
        """``call(i, previous=None)``: the op as a consumer writes it (:func:`judge_op`: the baseline's plain MLX
        ops, not the exported package's op path) on input set ``i``, chained as the kernels are."""
        from ..evaluation._chain import chained

        self.check_available()
        arrays = self._consumer_arrays(family, problem, sets)
        return chained(judge_op(family, problem), arrays, self.consumer_link(family))

    def consumer_link(self, family: Any) -> Any:
        """The chain's link for ``family`` (:mod:`kernsearch.evaluation._chain`): one object per family, so
        every candidate and the op derive their activations by the same op."""
        from ..evaluation._chain import mlx_link

        if family.name not in self._links:
            self._links[family.name] = mlx_link(family.inputs, family.chain_inputs)
        return self._links[family.name]

    def _consumer_arrays(self, family: Any, problem: Any, sets: list[dict[str, np.ndarray]]) -> list[list[Any]]:
        """Each set's logical inputs on the device, each in its own dtype; arrays shared between sets (the same
        NumPy object: activations, where only weights rotate) are uploaded once."""
        key = tuple(id(s[t.name]) for s in sets for t in family.inputs)
        kept = self._consumer_kept
        if kept is not None and kept[0] == key:  # the same sets as the last variant's (one problem's trials)
            return list(kept[1])
        uploaded: dict[int, Any] = {}
        out = []
        for s in sets:
            row = []
            for t in family.inputs:
                x = s[t.name]
                if id(x) not in uploaded:
                    uploaded[id(x)] = to_mx(x, t.resolved_dtype(problem.dtype))
                row.append(uploaded[id(x)])
            out.append(row)
        self._consumer_kept = (key, out, sets)  # holding the sets keeps their ids unique
        return out

    def evaluate(self, outputs: Any) -> None:
        mx_core().eval(outputs)

    def sync(self) -> None:
        mx_core().synchronize()

    def time(self, kernel: KernelSource, geometry: Geometry, inputs: list[np.ndarray], dtype: str,
             **options: Any) -> Timing:
        from ..evaluation._measure import measure_raced
        from ..family._spec import DTYPES

        launch, sync = self.launcher(kernel, geometry, inputs, dtype)
        plan = options.get("plan", self.plan)
        out_bytes = sum(int(np.prod(s)) for s in geometry.output_shapes) * DTYPES[dtype]
        plan = replace(plan, max_batch=max(1, min(plan.max_batch, int(_MAX_BATCH_OUTPUT_BYTES // max(out_bytes, 1)))))
        try:
            sampled = measure_raced(launch, sync, options.get("race"), plan=plan)
        except (RuntimeError, ValueError) as exc:
            raise self.classify(exc) from None
        # The compile time of this kernel in this process (its first launch, e.g. during verification).
        return Timing(sampled.samples, self.evidence, self.compile_seconds.get(kernel.sha256, 0.0),
                      sampled.not_winning)

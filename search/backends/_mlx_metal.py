"""The ``metal`` back-end: ``mx.fast.metal_kernel`` on an Apple GPU (measured).

MLX wraps the rendered body in a ``[[kernel]]`` function whose signature it derives from the names the
body uses (``A``, ``A_shape``, ``thread_position_in_grid`` ...), compiles it on first use and caches the
pipeline under the kernel's name (which carries the source hash). ``grid`` counts threads.

Timing follows :mod:`kernsearch._measure` (see ``docs/timing.md``): ``launch`` submits one run
(``mx.async_eval``: its own command buffer, so launches do not overlap) and ``sync`` waits for the GPU
(``mx.synchronize``); a batch's wall time over the batch size is one sample. Inputs are rotated among
copies when the working set would sit in the chip's system-level cache. Without a Metal device (Linux,
CI) the back-end refuses with a one-line reason.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from .._errors import BackendError, VariantFailure
from .._render import Geometry, KernelSource
from ._base import BaseBackend, Evidence, RunResult, Timing


def _mx() -> Any:
    try:
        import mlx.core as mx
    except ImportError:  # pragma: no cover - MLX is a dependency
        raise BackendError("the metal back-end needs MLX (pip install mlx) on macOS") from None
    return mx


def _to_mx(array: np.ndarray, dtype: str) -> Any:
    mx = _mx()
    out = mx.array(np.ascontiguousarray(array, dtype=np.float32)).astype(getattr(mx, dtype))
    mx.eval(out)
    return out


def _to_numpy(array: Any) -> np.ndarray:
    return np.array(array.astype(_mx().float32), dtype=np.float64)


def _failure(exc: Exception) -> VariantFailure:
    """An MLX exception while building or running one variant, as that variant's failure."""
    text = str(exc).strip()
    first = text.splitlines()[0][:500] if text else type(exc).__name__
    if "compile" in text.lower() or "program_source" in text:
        return VariantFailure("compile", text[:1500])
    return VariantFailure("launch", first)


class MetalBackend(BaseBackend):
    """Builds, runs and times rendered Metal kernels with ``mx.fast.metal_kernel`` (evidence: measured)."""

    name = "metal"
    evidence = Evidence.MEASURED
    target = "metal"

    def __init__(self, plan: Any = None, cache_bytes: float | None = None,
                 memory_budget_bytes: float = 2e9) -> None:
        from .._measure import TimingPlan

        self.plan = plan if plan is not None else TimingPlan()
        self.cache_bytes = cache_bytes if cache_bytes is not None else 48e6
        self.memory_budget_bytes = memory_budget_bytes
        self._kernels: dict[str, Any] = {}
        self._compile_seconds: dict[str, float] = {}

    def check_available(self) -> None:
        mx = _mx()
        if not mx.metal.is_available():
            raise BackendError("no Metal device: the metal back-end runs on Apple silicon only "
                               "(use --backend model here, or cpu to check correctness)")

    # -- building and running -------------------------------------------------------------------------
    def kernel(self, source: KernelSource) -> Any:
        if source.target != "metal":
            raise BackendError(f"the metal back-end runs Metal templates, not {source.target!r} ones")
        if source.sha256 not in self._kernels:
            self._kernels[source.sha256] = _mx().fast.metal_kernel(
                name=source.name, input_names=list(source.input_names), output_names=list(source.output_names),
                source=source.source, header=source.header, ensure_row_contiguous=True)
        return self._kernels[source.sha256]

    def _call(self, source: KernelSource, geometry: Geometry, arrays: list[Any],
              init_value: float | None) -> list[Any]:
        mx = _mx()
        extra = {} if init_value is None else {"init_value": float(init_value)}
        return self.kernel(source)(
            inputs=arrays,
            template=[(k, getattr(mx, v) if isinstance(v, str) else v) for k, v in source.template],
            grid=tuple(geometry.grid), threadgroup=tuple(geometry.threadgroup),
            output_shapes=[tuple(s) for s in geometry.output_shapes],
            output_dtypes=[getattr(mx, d) for d in geometry.output_dtypes], **extra)

    def _first(self, source: KernelSource, geometry: Geometry, arrays: list[Any],
               init_value: float | None) -> list[Any]:
        """One synchronised run; the first run of a variant compiles it, and that time is kept."""
        mx = _mx()
        start = time.perf_counter()
        try:
            outs = self._call(source, geometry, arrays, init_value)
            mx.eval(outs)
            mx.synchronize()
        except (RuntimeError, ValueError) as exc:
            raise _failure(exc) from None
        self._compile_seconds.setdefault(source.sha256, time.perf_counter() - start)
        return outs

    def run(self, kernel: KernelSource, geometry: Geometry, inputs: list[np.ndarray], dtype: str,
            init_value: float | None = float("nan"), **options: Any) -> RunResult:
        self.check_available()
        outs = self._first(kernel, geometry, [_to_mx(x, dtype) for x in inputs], init_value)
        return RunResult([_to_numpy(o) for o in outs], [], self._compile_seconds.get(kernel.sha256, 0.0))

    # -- timing ---------------------------------------------------------------------------------------
    def input_sets(self, arrays: list[np.ndarray], dtype: str, geometry: Geometry | None = None) -> int:
        from .._measure import input_sets_needed
        from .._spec import DTYPES

        size = DTYPES[dtype]
        working = sum(x.size for x in arrays) * size
        if geometry is not None:
            working += sum(int(np.prod(s)) for s in geometry.output_shapes) * size
        return input_sets_needed(working, self.cache_bytes, self.memory_budget_bytes)

    def launcher(self, kernel: KernelSource, geometry: Geometry, inputs: list[np.ndarray], dtype: str,
                 sets: int | None = None) -> tuple[Callable[[int], object], Callable[[], None]]:
        """``(launch, sync)`` for :mod:`kernsearch._measure`, after one compiling run."""
        self.check_available()
        copies = [[_to_mx(x, dtype) for x in inputs]
                  for _ in range(sets or self.input_sets(inputs, dtype, geometry))]
        self._first(kernel, geometry, copies[0], None)
        return _lazy(lambda arrays: self._call(kernel, geometry, arrays, None), copies)

    def baseline_launcher(self, family: Any, problem: Any, logical: dict[str, np.ndarray],
                          sets: int | None = None) -> tuple[Callable[[int], object], Callable[[], None]]:
        """``(launch, sync)`` of the family's MLX baseline op (e.g. ``mx.matmul``) on the same inputs."""
        from .._spec import ARRAY_FUNCTIONS

        self.check_available()
        mx = _mx()
        names = [t.name for t in family.inputs]
        arrays = [logical[n] for n in names]
        copies = [[_to_mx(x, problem.dtype) for x in arrays]
                  for _ in range(sets or self.input_sets(arrays, problem.dtype))]
        ns = {n: getattr(mx, n) for n in ARRAY_FUNCTIONS if hasattr(mx, n)}
        ns["softmax"] = lambda x, axis=-1: mx.softmax(x, axis=axis)
        ns.update(problem.dims)

        def call(arrays_: list[Any]) -> list[Any]:
            out = family.baseline({**ns, **dict(zip(names, arrays_))})
            return list(out) if isinstance(out, (list, tuple)) else [out]

        mx.eval(call(copies[0]))
        return _lazy(call, copies)

    def time(self, kernel: KernelSource, geometry: Geometry, inputs: list[np.ndarray], dtype: str,
             **options: Any) -> Timing:
        from .._measure import measure

        from dataclasses import replace

        from .._spec import DTYPES

        new = kernel.sha256 not in self._compile_seconds
        launch, sync = self.launcher(kernel, geometry, inputs, dtype)
        plan = options.get("plan", self.plan)
        out_bytes = sum(int(np.prod(s)) for s in geometry.output_shapes) * DTYPES[dtype]
        # a batch keeps every launch's output alive until its sync: cap it at ~1 GB of outputs
        plan = replace(plan, max_batch=max(1, min(plan.max_batch, int(1e9 // max(out_bytes, 1)))))
        try:
            samples = measure(launch, sync, plan=plan)
        except (RuntimeError, ValueError) as exc:
            raise _failure(exc) from None
        return Timing(samples, self.evidence, self._compile_seconds[kernel.sha256] if new else 0.0)


def _lazy(call: Callable[[list[Any]], list[Any]], copies: list[list[Any]]
          ) -> tuple[Callable[[int], object], Callable[[], None]]:
    """``launch`` submits one run on the next input copy without waiting; ``sync`` waits for all.

    Each launch is its own submission (``mx.async_eval`` ends MLX's encoder and commits a command
    buffer): within one encoder MLX dispatches concurrently and only inserts a barrier when a kernel
    reads an earlier kernel's output, so a batch of independent launches evaluated together could
    overlap small grids and time their throughput instead of one kernel's duration.
    """
    mx = _mx()
    pending: list[Any] = []
    turn = [0]

    def launch(_: int) -> object:  # rotates its own input copies, whatever set the caller names
        outs = call(copies[turn[0] % len(copies)])
        mx.async_eval(outs)
        pending.append(outs)  # alive until the sync
        turn[0] += 1
        return None

    def sync() -> None:
        mx.synchronize()
        pending.clear()

    return launch, sync

"""The ``cuda`` back-end: ``mx.fast.cuda_kernel`` on an NVIDIA GPU through MLX's CUDA back-end (measured).

MLX wraps the rendered body in a ``__global__`` function (inputs ``const T*`` with ``X_shape`` when the
body reads it, outputs ``T*``), compiles it with NVRTC on the first evaluation and caches the PTX/cubin on
disk (``MLX_PTX_CACHE_DIR``, default ``/tmp/mlx/<version>/ptx``) under the kernel's name, which carries the
source hash. ``grid`` counts threads, as with Metal; dynamic shared memory is fixed when the kernel object
is made (``Geometry.shared_memory``), and MLX opts the function into more than 48 KB itself.

Timing follows :mod:`kernsearch._measure`: ``launch`` submits one run (``mx.async_eval``, its own CUDA
graph, so launches run one after another and never overlap) and ``sync`` waits for the device
(``mx.synchronize``); a batch's wall time over its size is one sample. For kernels of a few tens of
microseconds that includes MLX's per-operation host cost; Nsight Compute's GPU durations
(``benchmarks/gpu_kernel_times.py``) separate the two.
Inputs are rotated among copies when the working set fits the chip's L2, so a launch does not find its
operands hot from the previous one.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable

import numpy as np

from .._errors import BackendError, VariantFailure
from .._render import Geometry, KernelSource
from ._base import BaseBackend, Diagnostic, Evidence, RunResult, Timing

#: NVRTC log lines: ``name.cu(57): error: identifier "x" is undefined``.
_NVRTC_LINE = re.compile(r"\S*\.cu\((\d+)\): (error|warning)[^:]*: (.*)$", re.MULTILINE)
#: Last-level cache assumed when deciding how many input copies to rotate (the H100 has 50 MB of L2).
_DEFAULT_L2_BYTES = 50e6


def _mx() -> Any:
    try:
        import mlx.core as mx
    except ImportError:  # pragma: no cover - MLX is a dependency
        raise BackendError("the cuda back-end needs MLX with its CUDA back-end (pip install 'mlx[cuda13]')") from None
    return mx


def to_mx(array: np.ndarray, dtype: str) -> Any:
    """A NumPy array (values exact in ``dtype``) as a contiguous MLX array of ``dtype`` on the device."""
    mx = _mx()
    host = np.ascontiguousarray(array, dtype=np.float16 if dtype == "float16" else np.float32)
    out = mx.array(host)
    if dtype == "bfloat16":
        out = out.astype(mx.bfloat16)
    mx.eval(out)
    return out


def to_numpy(array: Any) -> np.ndarray:
    mx = _mx()
    return np.array(array.astype(mx.float32), dtype=np.float64)


def mlx_namespace() -> dict[str, Any]:
    """The array functions a family's ``baseline`` expression may call, as MLX ops."""
    from .._spec import ARRAY_FUNCTIONS

    mx = _mx()
    ns = {name: getattr(mx, name) for name in ARRAY_FUNCTIONS if hasattr(mx, name)}
    ns["softmax"] = lambda x, axis=-1: mx.softmax(x, axis=axis)
    return ns


def compile_diagnostics(message: str) -> list[Diagnostic]:
    """NVRTC's errors and warnings, with the line of the generated program they point at."""
    return [Diagnostic("compile", text.strip(), int(line), None, "error" if kind == "error" else "warning")
            for line, kind, text in _NVRTC_LINE.findall(message)]


def classify(exc: Exception) -> VariantFailure:
    """An MLX/CUDA exception of one variant as a :class:`VariantFailure` (compile or launch)."""
    text = str(exc)
    if "Failed to compile kernel" in text:
        errors = [d.message for d in compile_diagnostics(text) if d.severity == "error"]
        return VariantFailure("compile", "; ".join(errors[:3]) or text[:500])
    return VariantFailure("launch", text.strip().splitlines()[0][:500] if text.strip() else type(exc).__name__)


class CudaBackend(BaseBackend):
    """Builds, runs and times rendered CUDA kernels with ``mx.fast.cuda_kernel`` (evidence: measured)."""

    name = "cuda"
    evidence = Evidence.MEASURED
    target = "cuda"

    def __init__(self, plan: Any = None, l2_bytes: float = _DEFAULT_L2_BYTES,
                 memory_budget_bytes: float = 4e9) -> None:
        from .._measure import TimingPlan

        self.plan = plan if plan is not None else TimingPlan()
        self.l2_bytes = l2_bytes
        self.memory_budget_bytes = memory_budget_bytes
        self._kernels: dict[tuple[str, int], Any] = {}
        self._compiled: set[tuple[str, int]] = set()
        self.compile_seconds: dict[str, float] = {}  # per source hash: wall time of the first launch

    # -- availability ---------------------------------------------------------------------------------
    def check_available(self) -> None:
        mx = _mx()
        if not hasattr(mx, "cuda") or not mx.cuda.is_available():
            raise BackendError("no CUDA device: the cuda back-end needs an NVIDIA GPU and MLX's CUDA build "
                               "(pip install 'mlx[cuda13]'); this MLX has no CUDA back-end")

    # -- building -------------------------------------------------------------------------------------
    def kernel(self, source: KernelSource, geometry: Geometry) -> Any:
        """The ``cuda_kernel`` object of a variant (made once per source and shared-memory size)."""
        if source.target != "cuda":
            raise BackendError(f"the cuda back-end runs CUDA templates, not {source.target!r} ones")
        key = (source.sha256, int(geometry.shared_memory))
        if key not in self._kernels:
            mx = _mx()
            self._kernels[key] = mx.fast.cuda_kernel(
                name=source.name, input_names=list(source.input_names), output_names=list(source.output_names),
                source=source.source, header=source.header, ensure_row_contiguous=True,
                shared_memory=int(geometry.shared_memory))
        return self._kernels[key]

    def _call(self, source: KernelSource, geometry: Geometry, inputs: list[Any], dtype: str,
              init_value: float | None) -> list[Any]:
        mx = _mx()
        kwargs: dict[str, Any] = {}
        if init_value is not None:
            kwargs["init_value"] = float(init_value)
        return self.kernel(source, geometry)(
            inputs=inputs, template=[(name, getattr(mx, value) if isinstance(value, str) else value)
                                     for name, value in source.template],
            grid=tuple(geometry.grid), threadgroup=tuple(geometry.threadgroup),
            output_shapes=[tuple(s) for s in geometry.output_shapes],
            output_dtypes=[getattr(mx, d) for d in geometry.output_dtypes], **kwargs)

    def _first(self, source: KernelSource, geometry: Geometry, inputs: list[Any], dtype: str,
               init_value: float | None) -> tuple[list[Any], float]:
        """Run once, synchronised; the first run of a variant also compiles it (timed)."""
        mx = _mx()
        key = (source.sha256, int(geometry.shared_memory))
        start = time.perf_counter()
        try:
            outs = self._call(source, geometry, inputs, dtype, init_value)
            mx.eval(outs)
            mx.synchronize()
        except (RuntimeError, ValueError) as exc:
            raise classify(exc) from None
        seconds = time.perf_counter() - start
        compile_s = 0.0
        if key not in self._compiled:
            self._compiled.add(key)
            compile_s = self.compile_seconds[source.sha256] = seconds
        return outs, compile_s

    # -- the interface --------------------------------------------------------------------------------
    def run(self, kernel: KernelSource, geometry: Geometry, inputs: list[np.ndarray], dtype: str,
            init_value: float | None = float("nan"), **options: Any) -> RunResult:
        self.check_available()
        arrays = [to_mx(x, dtype) for x in inputs]
        outs, compile_s = self._first(kernel, geometry, arrays, dtype, init_value)
        return RunResult([to_numpy(o) for o in outs], [], compile_s)

    def input_sets(self, inputs: list[np.ndarray], dtype: str, geometry: Geometry | None = None) -> int:
        """How many copies of the inputs to rotate among (see :func:`kernsearch._measure.input_sets_needed`)."""
        from .._measure import input_sets_needed
        from .._spec import DTYPES

        size = DTYPES[dtype]
        out_bytes = sum(int(np.prod(s)) for s in geometry.output_shapes) * size if geometry else 0
        working = sum(x.size for x in inputs) * size + out_bytes
        return input_sets_needed(working, self.l2_bytes, self.memory_budget_bytes)

    def launcher(self, kernel: KernelSource, geometry: Geometry, inputs: list[np.ndarray], dtype: str,
                 sets: int | None = None) -> tuple[Callable[[int], object], Callable[[], None]]:
        """``(launch, sync)`` for :mod:`kernsearch._measure`; builds (and compiles) the kernel first."""
        self.check_available()
        n = sets or self.input_sets(inputs, dtype, geometry)
        copies = [[to_mx(x, dtype) for x in inputs] for _ in range(n)]
        self._first(kernel, geometry, copies[0], dtype, None)
        return _launcher(lambda arrays: self._call(kernel, geometry, arrays, dtype, None), copies)

    def baseline_launcher(self, family: Any, problem: Any, logical: dict[str, np.ndarray],
                          sets: int | None = None) -> tuple[Callable[[int], object], Callable[[], None]]:
        """``(launch, sync)`` of the family's MLX baseline op (e.g. ``mx.matmul``) on the same inputs."""
        self.check_available()
        names = [t.name for t in family.inputs]
        arrays = [logical[n] for n in names]
        n = sets or self.input_sets(arrays, problem.dtype)
        copies = [[to_mx(x, problem.dtype) for x in arrays] for _ in range(n)]
        ns = {**mlx_namespace(), **problem.dims}

        def call(arrays_: list[Any]) -> list[Any]:
            out = family.baseline({**ns, **dict(zip(names, arrays_))})
            return list(out) if isinstance(out, (list, tuple)) else [out]

        mx = _mx()
        mx.eval(call(copies[0]))
        return _launcher(call, copies)

    def time(self, kernel: KernelSource, geometry: Geometry, inputs: list[np.ndarray], dtype: str,
             **options: Any) -> Timing:
        from .._measure import measure

        launch, sync = self.launcher(kernel, geometry, inputs, dtype)
        try:
            samples = measure(launch, sync, plan=options.get("plan", self.plan))
        except (RuntimeError, ValueError) as exc:
            raise classify(exc) from None
        # The compile time of this kernel in this process (its first launch, e.g. during verification).
        return Timing(samples, self.evidence, self.compile_seconds.get(kernel.sha256, 0.0))


def _launcher(call: Callable[[list[Any]], list[Any]], copies: list[list[Any]]
                   ) -> tuple[Callable[[int], object], Callable[[], None]]:
    """``launch`` submits one run (rotating input copies) without waiting; ``sync`` waits for all.

    Each launch is its own submission (``mx.async_eval``): MLX records one evaluation as a CUDA graph in
    which independent kernels may run concurrently, so a batch of independent launches evaluated at once
    would overlap kernels with small grids and time their throughput instead of one kernel's duration.
    Separate submissions on MLX's stream run one after another.
    """
    mx = _mx()
    pending: list[Any] = []
    turn = [0]

    def launch(_: int) -> object:
        arrays = copies[turn[0] % len(copies)]
        turn[0] += 1
        outs = call(arrays)
        mx.async_eval(outs)
        pending.append(outs)  # alive until the sync
        return None

    def sync() -> None:
        mx.synchronize()
        pending.clear()

    return launch, sync

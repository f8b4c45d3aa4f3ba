"""The ``cuda`` back-end: ``mx.fast.cuda_kernel`` on an NVIDIA GPU through MLX's CUDA back-end (measured).

MLX wraps the rendered body in a ``__global__`` function (inputs ``const T*`` with ``X_shape`` when the
body reads it, outputs ``T*``) and compiles it with NVRTC on the first evaluation, into a cache of this process
only: MLX reads its PTX disk cache (``MLX_PTX_CACHE_DIR``) for every module but writes custom kernels to it
never, so a kernel compiled in one process is compiled again in the next (``docs/timing.md``; the search
therefore times a config in the worker that compiled it). ``grid`` counts threads, as with Metal; dynamic
shared memory is fixed when the kernel object is made (``Geometry.shared_memory``), and MLX opts the function
into more than 48 KB itself. Building, running and timing are shared with the Metal back-end
(:mod:`._mlx_base`). For kernels of a few tens of microseconds a timing includes MLX's per-operation host cost;
Nsight Compute's GPU durations (``benchmarks/gpu_kernel_times.py``) separate the two.
"""

from __future__ import annotations

import re

from .._errors import BackendError, VariantFailure
from .._vocabulary import Severity, Target
from ._base import Diagnostic
from ._mlx_base import MLXBackend, mx_core

#: NVRTC log lines: ``name.cu(57): error: identifier "x" is undefined``.
_NVRTC_LINE = re.compile(r"\S*\.cu\((\d+)\): (error|warning)[^:]*: (.*)$", re.MULTILINE)


def compile_diagnostics(message: str) -> list[Diagnostic]:
    """NVRTC's errors and warnings, with the line of the generated program they point at."""
    return [Diagnostic("compile", text.strip(), int(line), None, Severity(kind))
            for line, kind, text in _NVRTC_LINE.findall(message)]


class CudaBackend(MLXBackend):
    """Rendered CUDA kernels through ``mx.fast.cuda_kernel`` (evidence: measured)."""

    name = Target.CUDA.value  # the measuring back-ends are named after the target they run
    target = Target.CUDA.value
    default_cache_bytes = 50e6  # the H100's L2
    default_memory_budget_bytes = 4e9
    memchecks = True  # a winner's reads are checked by compute-sanitizer before it is published (``_memcheck``)

    def check_available(self) -> None:
        mx = mx_core()
        if not hasattr(mx, "cuda") or not mx.cuda.is_available():
            raise BackendError("no CUDA device: the cuda back-end needs an NVIDIA GPU and MLX's CUDA build "
                               "(pip install 'mlx[cuda13]'); this MLX has no CUDA back-end")

    def classify(self, exc: Exception) -> VariantFailure:
        """NVRTC errors become a ``compile`` failure with the compiler's first messages."""
        text = str(exc)
        if "Failed to compile kernel" in text:
            errors = [d.message for d in compile_diagnostics(text) if d.severity == Severity.ERROR]
            return VariantFailure("compile", "; ".join(errors[:3]) or text[:500])
        return super().classify(exc)

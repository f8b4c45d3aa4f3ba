"""Back-ends: where a rendered kernel runs (or is predicted).

``get_backend(name)`` imports a back-end only when it is asked for (MLX and compilers are heavy).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from .._errors import BackendError
from ._base import BaseBackend, Diagnostic, Evidence, RunResult, Timing

#: name -> "module:Class", imported lazily.
BACKENDS = {
    "metal": "._mlx_metal:MetalBackend",  # mx.fast.metal_kernel on Apple GPUs: measured
    "cuda": "._mlx_cuda:CudaBackend",  # mx.fast.cuda_kernel on NVIDIA GPUs: measured
    "cpu": "._cpu:CpuBackend",  # the Metal interpreter: interpreted (correctness only)
    "model": "._model:ModelBackend",  # the per-chip performance model: modeled
    "replay": "._replay:ReplayBackend",  # a recorded landscape (KernelTuner cache file)
}


def get_backend(name: str, **options: Any) -> BaseBackend:
    """Instantiate a back-end by name; unknown or missing ones are a one-line error."""
    if name not in BACKENDS:
        raise BackendError(f"unknown back-end {name!r} (known: {', '.join(BACKENDS)})")
    module_name, _, cls_name = BACKENDS[name].partition(":")
    try:
        module = import_module(module_name, __name__)
    except ModuleNotFoundError as exc:
        raise BackendError(f"back-end {name!r} is not available: {exc}") from None
    backend: BaseBackend = getattr(module, cls_name)(**options)
    return backend


__all__ = ["BACKENDS", "BaseBackend", "Diagnostic", "Evidence", "RunResult", "Timing", "get_backend"]

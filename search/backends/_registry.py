"""The back-end registry: names to classes, imported only when asked for (MLX and compilers are heavy)."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from .._errors import BackendError
from .._vocabulary import Target
from ._base import BaseBackend

#: name -> "module:Class", imported lazily.
BACKENDS = {  # the measuring back-ends are named after the target they run
    Target.METAL.value: "._mlx_metal:MetalBackend",  # mx.fast.metal_kernel on Apple GPUs: measured
    Target.CUDA.value: "._mlx_cuda:CudaBackend",  # mx.fast.cuda_kernel on NVIDIA GPUs: measured
    "cpu": "._cpu:CpuBackend",  # the Metal interpreter: interpreted (correctness only)
    "model": "._model:ModelBackend",  # the per-chip performance model: modeled
}


def backend_class(name: str) -> type[BaseBackend]:
    """A back-end class by registry name, or by ``package.module:Class`` (a plug-in, or a test's simulated
    GPU). Its capabilities are class attributes: asking them opens no device. Unknown or missing ones are
    a one-line error."""
    if ":" in name:
        module_name, _, cls_name = name.partition(":")
        try:
            cls: type[BaseBackend] = getattr(import_module(module_name), cls_name)
        except (ImportError, AttributeError, TypeError) as exc:  # TypeError: a class that breaks the contract
            raise BackendError(f"cannot load back-end {name!r}: {exc}") from None
        return cls
    if name not in BACKENDS:
        raise BackendError(f"unknown back-end {name!r} (known: {', '.join(BACKENDS)})")
    module_name, _, cls_name = BACKENDS[name].partition(":")
    try:
        module = import_module(module_name, __package__)
    except ModuleNotFoundError as exc:
        raise BackendError(f"back-end {name!r} is not available: {exc}") from None
    found: type[BaseBackend] = getattr(module, cls_name)
    return found


def get_backend(name: str, **options: Any) -> BaseBackend:
    """Instantiate a back-end by name (see :func:`backend_class`)."""
    return backend_class(name)(**options)

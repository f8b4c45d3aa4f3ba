"""The ``metal`` back-end: ``mx.fast.metal_kernel`` on an Apple GPU (measured).

MLX wraps the rendered body in a ``[[kernel]]`` function whose signature it derives from the names the
body uses (``A``, ``A_shape``, ``thread_position_in_grid`` ...), compiles it on first use and caches the
library in this process's memory under the kernel's name (which carries the source hash): another process
compiles it again, so the search times a config in the worker that compiled it (``docs/timing.md``). ``grid``
counts threads. Building,
running and timing are shared with the CUDA back-end (:mod:`._mlx_base`). Without a Metal device (Linux,
CI) the back-end refuses with a one-line reason.
"""

from __future__ import annotations

from .._errors import BackendError
from .._vocabulary import Target
from ._mlx_base import MLXBackend, mx_core


class MetalBackend(MLXBackend):
    """Rendered Metal kernels through ``mx.fast.metal_kernel`` (evidence: measured)."""

    name = Target.METAL.value  # the measuring back-ends are named after the target they run
    target = Target.METAL.value
    #: The study passes the chip's system-level cache; this is an M-series Max's.
    default_cache_bytes = 48e6

    def check_available(self) -> None:
        if not mx_core().metal.is_available():
            raise BackendError("no Metal device: the metal back-end runs on Apple silicon only (here: tune with "
                               "--backend model, whose winners are verified on the interpreter; check one variant "
                               "with `kernsearch verify --backend cpu`)")

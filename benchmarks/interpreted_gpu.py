"""A GPU for dry runs whose kernels run on the CPU interpreter: the metal back-end's own code, minus the device.

Not a kernsearch back-end a user can pick: it lives beside the benchmarks, and a search loads it as
``interpreted_gpu:InterpretedGPU`` (``module:Class``) with this folder on ``sys.path``. Nothing it reports is a
measurement; the scripts that use it say "dry run".

What is real: every verification goes through ``MLXBackend.run`` (the metal back-end's), so the outputs it declares
(each flat, with a poisoned guard zone after it: ``kernsearch.backends._guard``) and the ``init_value`` it fills
them with are the ones a GPU gets. The kernel object MLX would build is replaced by the CPU interpreter running
the same Metal source, in grid order, reporting nothing of its own (a GPU reports no out-of-bounds access, no race):
a bug is seen here only as far as the device's checks see it. What is simulated: timings (a per-kernel cost derived
from its source hash, on a clock of its own), as ``tests/test_faults.py``'s simulated GPU does. Its chip is the one
named (``measures_device`` is False): a dry run tunes for the chip the GPU run will detect.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from kernsearch.backends._base import Timing
from kernsearch.backends._mlx_base import to_mx, to_numpy
from kernsearch.backends._mlx_metal import MetalBackend

#: Simulated cost of the baseline op (ms); a kernel costs 0.05 .. 1.05 ms by its source hash, so one beats it.
BASELINE_MS = 2.0


class InterpretedGPU(MetalBackend):
    """See the module docstring."""

    name = "interpreted-gpu"
    measures_device = False  # the chip is the one named: a dry run of the GPU's search
    compiles_ahead = False  # one process: the interpreter compiles each kernel once into its cache

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.now_ms = 0.0
        self.launched: list[dict[str, Any]] = []  # every kernel call as MLX was asked for it (for the tests)

    def check_available(self) -> None:
        from kernsearch.interp._compile import compiler

        compiler()

    def clock(self) -> float:  # the timing reads this instead of the wall clock
        return self.now_ms / 1e3

    # -- the kernel object: MLX's call, run by the interpreter ------------------------------------------
    def _make_kernel(self, source: Any, geometry: Any) -> Any:
        from kernsearch.backends import get_backend

        cpu = get_backend("cpu")

        def call(inputs: list[Any], template: Any, grid: Any, threadgroup: Any, output_shapes: Any,
                 output_dtypes: Any, init_value: float | None = None) -> list[Any]:
            dtypes = [str(d).rsplit(".", 1)[-1] for d in output_dtypes]
            self.launched.append({"output_shapes": [tuple(s) for s in output_shapes], "init_value": init_value})
            launch = replace(geometry, grid=tuple(grid), threadgroup=tuple(threadgroup),
                             output_shapes=tuple(tuple(s) for s in output_shapes), output_dtypes=tuple(dtypes))
            dtype = str(dict(template).get("T", output_dtypes[0])).rsplit(".", 1)[-1]
            run = cpu.run(source, launch, [to_numpy(x) for x in inputs], dtype,
                          init_value=float("nan") if init_value is None else init_value, timeout=60.0)
            return [to_mx(np.asarray(o), d) for o, d in zip(run.outputs, dtypes)]  # its diagnostics: none on a GPU

        return call

    def precompile(self, source: Any, geometry: Any, shapes: Any, dtype: str) -> bool:
        return False

    # -- timings: simulated -------------------------------------------------------------------------------
    @staticmethod
    def kernel_ms(kernel: Any) -> float:
        return 0.05 + (int(kernel.sha256[:8], 16) % 1000) / 1000.0

    def _launcher(self, ms: float) -> tuple[Any, Any]:
        def launch(_: int) -> None:
            self.now_ms += ms

        def sync() -> None:
            self.now_ms += 0.01

        return launch, sync

    def launcher(self, kernel: Any, geometry: Any, inputs: Any, dtype: str, sets: Any = None) -> tuple[Any, Any]:
        return self._launcher(self.kernel_ms(kernel))

    def baseline_launcher(self, family: Any, problem: Any, logical: Any, sets: Any = None) -> tuple[Any, Any]:
        return self._launcher(BASELINE_MS)

    def _costs(self, ms: float) -> Any:
        def call(i: int, previous: Any = None) -> None:
            self.now_ms += ms

        return call

    def consumer_kernel(self, kernel: Any, geometry: Any, family: Any, problem: Any, sets: Any) -> Any:
        return self._costs(self.kernel_ms(kernel))

    def consumer_op(self, family: Any, problem: Any, sets: Any) -> Any:
        return self._costs(BASELINE_MS)

    def evaluate(self, outputs: Any) -> None:
        self.now_ms += 0.002

    def sync(self) -> None:
        self.now_ms += 0.01

    def time(self, kernel: Any, geometry: Any, inputs: Any, dtype: str, **options: Any) -> Timing:
        from kernsearch.evaluation._measure import measure

        launch, sync = self.launcher(kernel, geometry, inputs, dtype)
        return Timing(measure(launch, sync, clock=self.clock), self.evidence, 0.0)

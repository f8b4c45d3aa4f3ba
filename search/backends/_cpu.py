"""The ``cpu`` back-end: Metal kernels run on the CPU interpreter (:mod:`kernsearch.interp`).

Its results are *interpreted* evidence: correctness and diagnostics, never a timing.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .._errors import BackendError
from .._rules import INTERPRETER_TARGET, TARGETS
from .._vocabulary import Evidence
from ..family._render import Geometry, KernelSource
from ._base import BaseBackend, Diagnostic, RunResult


class CpuBackend(BaseBackend):
    """Runs the exact Metal source MLX would compile, on the CPU, in a child process per run.

    Options of :meth:`run`: ``mode`` ("fast", "check", "sanitize"), ``timeout`` (seconds before a
    hanging kernel is stopped), ``chip`` (its threadgroup-memory limit is checked), ``lines``
    (a :class:`kernsearch.interp.TemplateLines`, so diagnostics name the template line), ``threadgroups``
    (run only these threadgroups), ``input_dtypes`` (each input's MLX dtype, for kernels mixing dtypes)
    and ``atomic_outputs`` (MLX's flag: outputs are ``device atomic<T>*``).
    """

    name: ClassVar[str] = "cpu"
    evidence: ClassVar[Evidence] = Evidence.INTERPRETED
    target: ClassVar[str | None] = INTERPRETER_TARGET
    interprets: ClassVar[bool] = True

    @classmethod
    def check_tunable(cls) -> None:
        raise BackendError("the cpu back-end (Metal interpreter) checks correctness only and never times "
                           "a kernel; tune with --backend model (verified on the interpreter) instead")

    def __init__(self, mode: str = "fast", timeout: float = 30.0) -> None:
        from ..interp import MODES

        if mode not in MODES:
            raise BackendError(f"unknown cpu back-end mode {mode!r} (known: {', '.join(MODES)})")
        self.mode = mode
        self.timeout = timeout

    def check_available(self) -> None:
        from ..interp._compile import compiler

        compiler()

    def run(self, kernel: KernelSource, geometry: Geometry, inputs: list[np.ndarray], dtype: str,
            init_value: float | None = float("nan"), mode: str | None = None, timeout: float | None = None,
            chip: Any = None, lines: Any = None, threadgroups: Any = None, input_dtypes: Any = None,
            atomic_outputs: bool = False, schedule: str = "in-order", **options: Any) -> RunResult:
        """Execute once; a variant that cannot run raises :class:`~kernsearch._errors.VariantFailure`."""
        from ..interp import MODES, run_kernel
        from ..interp._interp import DEFAULT_TG_LIMIT

        mode = mode or self.mode
        if mode not in MODES:
            raise BackendError(f"unknown cpu back-end mode {mode!r} (known: {', '.join(MODES)})")
        if kernel.target != INTERPRETER_TARGET:
            raise BackendError(f"the cpu back-end runs {TARGETS[INTERPRETER_TARGET].language} kernels, "
                               f"not {kernel.target}")
        limit = getattr(chip, "threadgroup_memory_bytes", None) or DEFAULT_TG_LIMIT
        if input_dtypes is None and geometry.input_dtypes:  # the family's typed inputs and parameters
            input_dtypes = list(geometry.input_dtypes)
        result = run_kernel(kernel, geometry.grid, geometry.threadgroup, list(geometry.output_shapes),
                            list(geometry.output_dtypes), inputs, dtype, init_value=init_value, mode=mode,
                            timeout=self.timeout if timeout is None else timeout, tg_limit=limit, lines=lines,
                            threadgroups=threadgroups, input_dtypes=input_dtypes, atomic_outputs=atomic_outputs,
                            schedule=schedule)
        diagnostics = [Diagnostic(d.kind, d.message + (f" | {d.code}" if d.code else ""), d.line, d.template_line,
                                  d.severity) for d in result.diagnostics]
        return RunResult(result.outputs, diagnostics, result.compile_seconds)

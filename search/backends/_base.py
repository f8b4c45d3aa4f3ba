"""The back-end interface: build a kernel from rendered source, run it on inputs, return outputs.

Concrete back-ends live beside this module (``_mlx_metal``, ``_mlx_cuda``, ``_cpu``, ``_model``); each
says which evidence its results are (measured / interpreted / modeled) and, as class attributes, what it can
do: callers ask those (no device is opened to ask) instead of comparing back-end names.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .._records import Prediction
from .._vocabulary import Evidence, Severity
from ..family._render import Geometry, KernelSource

if TYPE_CHECKING:
    from ..family._space import Config, Space

#: ``(launch, sync)``: ``launch(i)`` submits one run on input set ``i``; ``sync()`` waits for the device.
Launcher = tuple[Callable[[int], object], Callable[[], None]]


@dataclass
class Diagnostic:
    """A problem a back-end noticed while running a kernel (race, divergence, out of bounds...)."""

    kind: str
    message: str
    line: int | None = None  # line of the rendered source
    template_line: str | None = None  # "gemm.metal.j2:123" through #line mapping, when known
    severity: str = Severity.ERROR  # or Severity.WARNING

    def __str__(self) -> str:
        where = f" at line {self.line}" if self.line is not None else ""
        tmpl = f" ({self.template_line})" if self.template_line else ""
        return f"{self.severity}: {self.kind}{where}{tmpl}: {self.message}"


@dataclass
class RunResult:
    outputs: list[np.ndarray]
    diagnostics: list[Diagnostic] = field(default_factory=list)
    compile_seconds: float = 0.0


@dataclass
class Timing:
    """Repeated timings of one variant, in milliseconds."""

    samples_ms: list[float]
    evidence: Evidence
    compile_seconds: float = 0.0
    not_winning: bool = False  # stopped early: it could no longer beat the incumbent (racing, docs/timing.md)

    @property
    def median_ms(self) -> float:
        return float(np.median(self.samples_ms))

    @property
    def spread(self) -> float:
        """Relative spread: (p90 - p10) / median."""
        lo, hi = np.percentile(self.samples_ms, [10, 90])
        return float((hi - lo) / self.median_ms) if self.median_ms > 0 else 0.0


#: What a back-end that declares :attr:`BaseBackend.times_as_consumers` must define itself.
CONSUMER_METHODS = ("consumer_kernel", "consumer_op", "evaluate", "sync")


class BaseBackend(ABC):
    """Runs rendered kernels. Inputs arrive as NumPy arrays whose values are exact in ``dtype``.

    The contract: this class declares everything callers use, as class attributes (capabilities, asked without
    opening a device) and methods (a back-end without one says so plainly). A search times a variant as consumers
    call it (:meth:`consumer_kernel`...) only where :attr:`times_as_consumers` says so, else by separate launches
    (:meth:`time`, :meth:`launcher`). A class that defines the consumer methods must declare the capability (True,
    or False to be timed by launches anyway), and one that declares it must define them: either mistake is a
    ``TypeError`` when the class is made, never a search routed by a guess.
    """

    name: ClassVar[str]
    evidence: ClassVar[Evidence]
    #: Which template family target this back-end executes ("metal", "cuda"), None if it runs nothing.
    target: ClassVar[str | None]

    # -- capabilities: what callers may ask of the class (a plug-in that declares none gets these) --------
    #: ``time`` measures on the GPU here: a measurement belongs to the detected device, never to a chip
    #: named on the command line (the metal and cuda back-ends).
    measures_device: ClassVar[bool] = False
    #: ``predict_ms``/``breakdown`` predict for the chip given to the constructor (``chip=``); ``run``
    #: executes nothing, so results are proven correct by :attr:`verified_by` (the model back-end).
    predicts: ClassVar[bool] = False
    #: ``run`` executes on the CPU interpreter: correctness only, never a timing; ``run`` takes its options
    #: (``mode``, ``timeout``, ``chip``, ``lines``, ``threadgroups``) and a timeout is no verdict on a kernel.
    interprets: ClassVar[bool] = False
    #: The constructor takes ``cache_bytes`` (the chip's last-level cache): inputs are rotated among copies
    #: when the working set would fit in it.
    rotates_inputs: ClassVar[bool] = False
    #: Compile workers may build the next variants while the timing process measures (a measured search's
    #: default is one per core but the timer's).
    compiles_ahead: ClassVar[bool] = False
    #: A winner's verification launches run once more under NVIDIA's memcheck before it is published (reads and
    #: writes outside any allocation, which the device does not report: ``_memcheck``; the cuda back-end).
    memchecks: ClassVar[bool] = False
    #: The back-end whose runs prove this one's results correct; None: this one (it runs its kernels).
    verified_by: ClassVar[str | None] = None
    #: Variants are timed as consumers call them (:data:`CONSUMER_METHODS`: the search's samples in the family's
    #: judging mode, the final round in every mode, paired against the op); False: by separate launches, timings
    #: the gate records but never ships as a win (docs/artifacts.md). The metal and cuda back-ends.
    times_as_consumers: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse a class whose consumer methods and declared capability disagree (see the class docstring)."""
        super().__init_subclass__(**kwargs)
        missing = [m for m in CONSUMER_METHODS if getattr(cls, m) is getattr(BaseBackend, m)]
        declared = any("times_as_consumers" in vars(k) for k in cls.__mro__ if k is not BaseBackend)
        if cls.times_as_consumers and missing:
            raise TypeError(f"back-end {cls.__name__} declares times_as_consumers but does not define "
                            f"{', '.join(missing)}")
        if not declared and len(missing) < len(CONSUMER_METHODS):
            raise TypeError(f"back-end {cls.__name__} defines consumer timing methods but does not declare "
                            "times_as_consumers (True to be timed as consumers call it, False by launches)")

    @classmethod
    def verifier(cls) -> str:
        """The name of the back-end that verifies this one's results (itself, or the interpreter)."""
        return cls.verified_by or cls.name

    @classmethod
    def check_tunable(cls) -> None:
        """Raise :class:`BackendError` with a one-line reason if a search cannot use this back-end (it
        neither times nor predicts kernels)."""

    def check_available(self) -> None:
        """Raise :class:`BackendError` with a one-line reason if this back-end cannot run here."""

    @abstractmethod
    def run(self, kernel: KernelSource, geometry: Geometry, inputs: list[np.ndarray], dtype: str,
            init_value: float | None = float("nan"), **options: Any) -> RunResult:
        """Execute once; outputs are pre-filled with ``init_value`` so unwritten elements show."""

    def time(self, kernel: KernelSource, geometry: Geometry, inputs: list[np.ndarray], dtype: str,
             **options: Any) -> Timing:
        """Time a variant. Options a measuring back-end takes: ``plan`` (a ``TimingPlan``) and ``race`` (a
        ``Race``: stop as soon as it is lost, returning ``not_winning`` with the samples so far)."""
        raise NotImplementedError(f"back-end {self.name} does not time kernels")

    # Optional capabilities: a back-end that has one overrides it; the others say plainly they lack it.
    def launcher(self, kernel: KernelSource, geometry: Geometry, inputs: list[np.ndarray], dtype: str,
                 sets: int | None = None) -> Launcher:
        """``(launch, sync)`` of the kernel for the interleaved final round (a GPU back-end)."""
        raise NotImplementedError(f"back-end {self.name} does not launch kernels for timing")

    def baseline_launcher(self, family: Any, problem: Any, logical: dict[str, np.ndarray],
                          sets: int | None = None) -> Launcher:
        """``(launch, sync)`` of the family's MLX baseline op on the same inputs (a GPU back-end)."""
        raise NotImplementedError(f"back-end {self.name} does not run the baseline op")

    def precompile(self, source: KernelSource, geometry: Geometry, shapes: list[tuple[int, ...]], dtype: str) -> bool:
        """Build the kernel ahead of its timing (a compile worker); True if it compiled here. Default: nothing to
        build ahead (False)."""
        return False

    def clock(self) -> float:
        """Seconds, the clock timings read (a simulated device keeps its own)."""
        return time.perf_counter()

    # As consumers call it: only where ``times_as_consumers`` (each a ``call(i, previous=None)`` on input set i).
    def consumer_kernel(self, kernel: KernelSource, geometry: Geometry, family: Any, problem: Any,
                        sets: list[dict[str, np.ndarray]]) -> Callable[..., Any]:
        """The variant as consumers call it (the exported package's planned call) on input set ``i``."""
        raise NotImplementedError(f"back-end {self.name} does not time kernels as consumers call them")

    def consumer_op(self, family: Any, problem: Any, sets: list[dict[str, np.ndarray]]) -> Callable[..., Any]:
        """The family's op as a consumer writes it, on input set ``i``."""
        raise NotImplementedError(f"back-end {self.name} does not time the op as consumers call it")

    def evaluate(self, outputs: Any) -> None:
        """Evaluate a call's (lazy) outputs, as a consumer's graph does."""
        raise NotImplementedError(f"back-end {self.name} does not time kernels as consumers call them")

    def sync(self) -> None:
        """Wait for the device."""
        raise NotImplementedError(f"back-end {self.name} does not time kernels as consumers call them")

    def predict_ms(self, space: Space, config: Config) -> float:
        """A predicted kernel time (the model back-end)."""
        raise NotImplementedError(f"back-end {self.name} predicts nothing")

    def predict(self, space: Space, config: Config) -> Prediction:
        """A predicted kernel time and its tie-break (the model back-end)."""
        raise NotImplementedError(f"back-end {self.name} predicts nothing")

    def breakdown(self, space: Space, config: Config) -> dict[str, Any]:
        """The prediction's terms (the model back-end), a bag of named figures for display."""
        raise NotImplementedError(f"back-end {self.name} predicts nothing")

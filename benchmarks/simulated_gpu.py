"""A simulated NVIDIA GPU for dry runs of the GPU scripts and for tests of the search's schedule (no device).

Not a kernsearch back-end a user can pick: it lives beside the benchmarks, and a search loads it as
``simulated_gpu:SimulatedGPU`` (``module:Class``) with this folder on ``sys.path``. Nothing it reports is a
measurement; the scripts that use it say "dry run" on every figure.

What it simulates, in real time (so schedules and throughput behave as on the device):

* **compile** — ``precompile`` sleeps ``compile_s`` and keeps the kernel in this process only, as MLX does
  (``mx.fast.cuda_kernel`` never writes NVRTC's output to its disk cache: ``docs/timing.md``); the first run of
  a kernel then looks it up (``load_s``) in the process that compiled it, and compiles it (``compile_s``) in
  any other;
* **kernels** — a launch costs a per-kernel time derived from its source hash (``0.05 .. 1.05 ms``, or
  ``kernel_ms`` for every kernel), with multiplicative noise ``noise``; ``sync`` sleeps what the batch costs;
* **verification** — ``run`` returns the family's float64 reference (``family``, ``shape``, ``dtype`` name the
  problem): every variant is correct by construction.

With ``events`` (a file path) every compile, load, verification run and timing is appended to it as one JSON
line ``{"pid", "kind", "key", "start", "end"}`` (``time.monotonic``, system-wide on Linux): what the
schedule test reads.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np

from kernsearch.backends._base import BaseBackend, Evidence, RunResult, Timing


class SimulatedGPU(BaseBackend):
    """See the module docstring."""

    name = "simulated-gpu"
    evidence = Evidence.MEASURED  # what the search treats it as; the scripts label every figure "dry run"
    target = "cuda"
    measures_device = True
    compiles_ahead = True

    def __init__(self, compile_s: float = 2.5, load_s: float = 0.005, kernel_ms: float | None = None,
                 noise: float = 0.02, baseline_ms: float = 0.3, events: str | None = None,
                 family: str | None = None, shape: str | None = None, dtype: str | None = None,
                 seed: int = 0) -> None:
        self.compile_s, self.load_s, self.kernel_ms, self.noise = compile_s, load_s, kernel_ms, noise
        self.baseline_ms = baseline_ms
        self.events = events
        self.problem_spec = (family, shape, dtype)  # shape as text ("64,256"): options are hashed
        self.rng = np.random.default_rng([seed, os.getpid()])
        self.loaded: set[str] = set()  # kernels run in this process
        self.compiled: set[str] = set()  # kernels compiled in this process (its in-memory cache)
        self.compile_seconds: dict[str, float] = {}
        self._problem: Any = None
        self._refs: dict[tuple[int, ...], list[np.ndarray]] = {}

    # -- bookkeeping ------------------------------------------------------------------------------------
    def _event(self, kind: str, key: str, start: float) -> None:
        if self.events:
            with open(self.events, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"pid": os.getpid(), "kind": kind, "key": key, "start": start,
                                     "end": time.monotonic()}) + "\n")

    def _ensure_built(self, kernel: Any) -> float:
        """The first run of a kernel in this process: a lookup when this process compiled it, else a compile."""
        if kernel.sha256 in self.loaded:
            return 0.0
        start = time.monotonic()
        if kernel.sha256 in self.compiled:
            time.sleep(self.load_s)
            self._event("load", kernel.sha256[:12], start)
        else:
            self._compile(kernel)
        self.loaded.add(kernel.sha256)
        seconds = self.compile_seconds[kernel.sha256] = time.monotonic() - start
        return seconds

    def _compile(self, kernel: Any) -> None:
        start = time.monotonic()
        time.sleep(self.compile_s)
        self.compiled.add(kernel.sha256)
        self._event("compile", kernel.sha256[:12], start)

    # -- the back-end interface -------------------------------------------------------------------------
    def precompile(self, kernel: Any, geometry: Any, shapes: Any, dtype: str) -> bool:
        self._compile(kernel)
        return True

    def _reference(self, geometry: Any, inputs: list[np.ndarray]) -> list[np.ndarray]:
        from kernsearch import get_chip, load_family, make_problem
        from kernsearch.evaluation._verify import reference, round_to_dtype

        family, shape, dtype = self.problem_spec
        if family is None:
            raise RuntimeError("the simulated GPU verifies by the family's reference: give family, shape, dtype")
        if self._problem is None:
            self._problem = make_problem(load_family(family), shape, dtype, get_chip("H100"))
        fam = self._problem.family
        logical = {t.name: (x.T if t.name in geometry.transposed_inputs else x) for t, x in zip(fam.inputs, inputs)}
        key = tuple(id(x) for x in inputs)
        if key not in self._refs:
            problem = self._problem_at(logical, make_problem, get_chip)
            self._refs = {key: [round_to_dtype(r, problem.dtype) for r in reference(problem, logical)]}
        return self._refs[key]

    def _problem_at(self, logical: dict[str, np.ndarray], make_problem: Any, get_chip: Any) -> Any:
        """The problem at the inputs' own shape (a ragged-shape check runs below the tuned one): each dimension
        read from an input whose declared extent is that bare name."""
        fam, dims = self._problem.family, dict(zip(self._problem.family.dims, self._problem.shape))
        for t in fam.inputs:
            names = [n.strip() for n in t.shape.text.strip("[] ").split(",")]
            dims.update({n: int(size) for n, size in zip(names, logical[t.name].shape) if n in dims})
        shape = ",".join(str(dims[d]) for d in fam.dims)
        return make_problem(fam, shape, self._problem.dtype, get_chip("H100"))

    def run(self, kernel: Any, geometry: Any, inputs: list[np.ndarray], dtype: str,
            init_value: float | None = float("nan"), **options: Any) -> RunResult:
        compile_s = self._ensure_built(kernel)
        start = time.monotonic()
        outputs = [np.array(r, dtype=np.float64) for r in self._reference(geometry, inputs)]
        self._event("verify", kernel.sha256[:12], start)
        return RunResult(outputs, [], compile_s)

    def kernel_time_ms(self, kernel: Any) -> float:
        if self.kernel_ms is not None:
            return self.kernel_ms
        return 0.05 + (int(kernel.sha256[:8], 16) % 1000) / 1000.0

    def _launcher(self, ms: float) -> tuple[Any, Any]:
        pending = [0]

        def launch(_: int) -> None:
            pending[0] += 1

        def sync() -> None:
            if pending[0]:
                cost = ms * pending[0] * max(0.5, 1.0 + self.noise * float(self.rng.standard_normal()))
                time.sleep(cost / 1e3)
            pending[0] = 0

        return launch, sync

    def launcher(self, kernel: Any, geometry: Any, inputs: Any, dtype: str, sets: Any = None) -> tuple[Any, Any]:
        self._ensure_built(kernel)
        return self._launcher(self.kernel_time_ms(kernel))

    def baseline_launcher(self, family: Any, problem: Any, logical: Any, sets: Any = None) -> tuple[Any, Any]:
        return self._launcher(self.baseline_ms)

    def time(self, kernel: Any, geometry: Any, inputs: Any, dtype: str, **options: Any) -> Timing:
        from kernsearch.evaluation._measure import TimingPlan, measure_raced

        launch, sync = self.launcher(kernel, geometry, inputs, dtype)
        start = time.monotonic()
        sampled = measure_raced(launch, sync, options.get("race"), plan=options.get("plan") or TimingPlan())
        self._event("time", kernel.sha256[:12], start)
        return Timing(sampled.samples, self.evidence, self.compile_seconds.get(kernel.sha256, 0.0),
                      sampled.not_winning)

"""Correctness: random inputs, the float64 NumPy reference, tolerance checks, and failure reasons.

Inputs are generated once per problem as float64 arrays whose values are exactly representable in the
problem's dtype, so the reference sees the same numbers the kernel does. Outputs are pre-filled with
NaN; a NaN in the result is then told apart as *unwritten* (a second run with a finite sentinel shows
the sentinel there) or a *NaN computed* by the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import KernsearchError, SpecError
from ..family._expr import BUILTINS, ExprError
from ..family._render import Geometry, KernelSource
from ..family._space import Problem
from ..family._vocab import numpy_namespace

SENTINEL = 1.0e30


def round_to_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float values to the nearest ``dtype`` value (round-to-nearest-even), returned as float64."""
    if dtype == "float32":
        return x.astype(np.float32).astype(np.float64)
    if dtype == "float16":
        with np.errstate(over="ignore"):  # beyond float16's range is inf, as on the GPU (the 1e30 sentinel)
            return x.astype(np.float16).astype(np.float64)
    if dtype == "bfloat16":
        raw = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
        bits = (raw + 0x7FFF + ((raw >> 16) & 1)) & 0xFFFF0000
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    raise ValueError(f"unknown dtype {dtype!r}")


def _numpy_namespace() -> dict[str, Any]:
    return numpy_namespace()


def draw(dist: Any, shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    """Values of one input from its declared distribution, exact in ``dtype`` (float64, or uint32 words)."""
    if dist.kind == "packed":
        return rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)
    low, high = dist.bounds()
    if dist.kind == "integer":
        values = rng.integers(int(low), int(high), size=shape, endpoint=True).astype(np.float64)
    else:
        values = rng.uniform(low, high, size=shape)
    if dtype == "uint32":
        return values.astype(np.uint32)
    if dtype == "int32":
        return values.astype(np.int32)
    return round_to_dtype(values, dtype)


#: Most elements (inputs and outputs together) a CPU-side check allocates (float64: 8 bytes each).
MAX_CHECK_ELEMENTS = 1 << 28  # ~2 GiB as float64: a 16384x4096 row op (x, y and weights) fits


def check_size(problem: Problem) -> None:
    """Refuse (one line) a problem too big to hold in memory for a reference check."""
    ctx = problem._ctx()
    total = 0
    for t in list(problem.family.inputs) + list(problem.family.outputs):
        n = 1
        for s in t.shape(ctx):
            n *= int(s)
        total += n
    if total > MAX_CHECK_ELEMENTS:
        raise KernsearchError(f"{problem.shape_text}: {total:.3g} elements are too many to check against the "
                              f"NumPy reference here (at most {MAX_CHECK_ELEMENTS:.3g})")


def make_inputs(problem: Problem, seed: int = 0) -> dict[str, np.ndarray]:
    """Logical inputs (as the reference sees them), drawn from each input's distribution (uniform in
    [-1, 1] unless the spec says otherwise), exact in each input's dtype (``T``: the problem's)."""
    check_size(problem)
    rng = np.random.default_rng(seed)
    ctx = problem._ctx()
    return {t.name: draw(t.distribution, tuple(t.shape(ctx)), t.resolved_dtype(problem.dtype), rng)
            for t in problem.family.inputs}


def kernel_inputs(problem: Problem, logical: dict[str, np.ndarray], geometry: Geometry) -> list[np.ndarray]:
    """The arrays the kernel takes, in order: transposed (contiguous) where the variant wants it, then
    each scalar parameter as a 1-element array of its dtype."""
    fam = problem.family
    arrays = [np.ascontiguousarray(logical[t.name].T if t.name in geometry.transposed_inputs else logical[t.name])
              for t in fam.inputs]
    return arrays + [np.asarray([p.number], dtype=np.float32 if p.dtype == "float32" else p.dtype)
                     for p in fam.params.values()]


def reference(problem: Problem, logical: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The float64 reference outputs; a reference that gives other outputs than the family declares (their
    number or shapes) is a spec error (one line, exit 2), not a failing kernel."""
    ns = {**_numpy_namespace(), **problem.dims, **problem.family.param_values, **logical}
    out = problem.family.reference(ns)
    outs = [np.asarray(o, dtype=np.float64) for o in (list(out) if isinstance(out, (list, tuple)) else [out])]
    _check_reference_shapes(problem, outs)
    return outs


def _check_reference_shapes(problem: Problem, outs: list[np.ndarray]) -> None:
    fam = problem.family
    where = f"{fam.path / 'family.toml'}: reference"
    if len(outs) != len(fam.outputs):
        raise SpecError(f"{where}: gives {len(outs)} array(s), the family declares {len(fam.outputs)} output(s) "
                        f"({', '.join(t.name for t in fam.outputs)})")
    ctx = {**BUILTINS, **problem.dims, **fam.param_values}
    for t, ref in zip(fam.outputs, outs):
        try:
            declared = tuple(int(v) for v in t.shape(ctx))
        except (ExprError, TypeError, ValueError):
            continue  # a shape that depends on knobs: the kernel's launch checks it
        if tuple(ref.shape) != declared:
            raise SpecError(f"{where}: gives {t.name} of shape {tuple(ref.shape)}, the family declares "
                            f"{declared} ({t.shape.text})")


@dataclass
class Check:
    """Outcome of comparing a variant's outputs with the reference."""

    ok: bool
    reason: str = ""  # "", "wrong", "nan", "unwritten", "shape"
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    bad_elements: int = 0
    detail: str = ""

    def summary(self) -> str:
        if not self.ok and self.reason in ("nan", "unwritten", "shape"):  # no error figure to speak of
            return f"FAIL ({self.reason}): {self.detail}"
        state = "pass" if self.ok else f"FAIL ({self.reason})"
        return f"{state}: max abs err {self.max_abs_err:.3g}, max rel err {self.max_rel_err:.3g}" + (
            f"; {self.detail}" if self.detail else "")


def tolerance(problem: Problem) -> tuple[float, float]:
    tol = problem.family.tolerance[problem.dtype]  # type: ignore[index]
    ctx = {**BUILTINS, **problem.dims, **problem.family.param_values}
    return float(tol.rtol(ctx)), float(tol.atol(ctx))


def compare(problem: Problem, outputs: list[np.ndarray], refs: list[np.ndarray],
            sentinel_outputs: list[np.ndarray] | None = None) -> Check:
    """Element-wise ``|out - ref| <= atol + rtol·|ref|`` for every output."""
    rtol, atol = tolerance(problem)
    worst_abs = worst_rel = 0.0
    for i, (name, out, ref) in enumerate(zip((t.name for t in problem.family.outputs), outputs, refs)):
        out = np.asarray(out, dtype=np.float64)
        if out.shape != ref.shape:
            return Check(False, "shape", detail=f"{name}: shape {out.shape}, expected {ref.shape}")
        nan = np.isnan(out)
        if nan.any():
            where = tuple(int(i) for i in np.argwhere(nan)[0])
            unwritten = sentinel_outputs is not None and bool(np.all(np.asarray(sentinel_outputs[i])[nan] == SENTINEL))
            reason = "unwritten" if unwritten else "nan"
            what = "never written" if unwritten else "NaN"
            return Check(False, reason, bad_elements=int(nan.sum()),
                         detail=f"{name}: {int(nan.sum())} element(s) {what}, first at {where}")
        err = np.abs(out - ref)
        bad = err > atol + rtol * np.abs(ref)
        worst_abs = max(worst_abs, float(err.max(initial=0.0)))
        worst_rel = max(worst_rel, float((err / np.maximum(np.abs(ref), atol)).max(initial=0.0)))
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            return Check(False, "wrong", worst_abs, worst_rel, int(bad.sum()),
                         detail=f"{name}: {int(bad.sum())} element(s) out of tolerance, first at {where}: "
                                f"got {out[where]:.6g}, expected {ref[where]:.6g}")
    return Check(True, "", worst_abs, worst_rel)


def verify_outputs(problem: Problem, run: Any, logical: dict[str, np.ndarray],
                   refs: list[np.ndarray] | None = None, zero_outputs: bool = False) -> Check:
    """Compare ``run(init_value)`` with the reference (``refs``, when the caller keeps it across variants);
    a second run tells unwritten from NaN.

    A kernel that accumulates into its outputs (``zero_outputs``, e.g. split-K) runs on zero-filled outputs
    instead: an element it never wrote then reads 0 and fails the comparison (the inputs are random)."""
    refs = reference(problem, logical) if refs is None else refs
    if zero_outputs:
        return compare(problem, run(0.0), refs)
    outputs = run(float("nan"))
    check = compare(problem, outputs, refs)
    if check.reason == "nan":
        check = compare(problem, outputs, refs, sentinel_outputs=run(SENTINEL))
    return check


def verify_kernel(backend: Any, kernel: KernelSource, geometry: Geometry, problem: Problem, seed: int = 0,
                  threadgroups: list[tuple[int, int, int]] | None = None,
                  data: tuple[dict[str, np.ndarray], list[np.ndarray] | None] | None = None,
                  **options: Any) -> tuple[Check, list[Any]]:
    """Run ``kernel`` on ``backend`` and check it; returns (check, diagnostics). Inputs are made from
    ``seed``, or ``data`` = (logical inputs, float64 reference) kept by the caller across variants of one
    problem (outputs are pre-filled with NaN on every run either way).

    With ``threadgroups`` (the interpreter only) just those threadgroups run, and what they wrote is
    checked against the reference (see :func:`verify_sampled`)."""
    logical, refs = data if data is not None else (make_inputs(problem, seed), None)
    inputs = kernel_inputs(problem, logical, geometry)
    diagnostics: list[Any] = []
    extra = {"threadgroups": threadgroups} if threadgroups and not geometry.zero_outputs else {}

    def run(init: float) -> list[np.ndarray]:
        result = backend.run(kernel, geometry, inputs, problem.dtype, init_value=init, **options, **extra)
        diagnostics.extend(d for d in result.diagnostics if d not in diagnostics)
        return list(result.outputs)

    if threadgroups and not geometry.zero_outputs:  # a sample of partial sums proves nothing: run all
        return verify_sampled(problem, geometry, run, logical, threadgroups), diagnostics
    return verify_outputs(problem, run, logical, refs, geometry.zero_outputs), diagnostics


def threadgroup_counts(geometry: Geometry) -> tuple[int, int, int]:
    return tuple(-(-g // t) for g, t in zip(geometry.grid, geometry.threadgroup))  # type: ignore[return-value]


def sample_threadgroups(geometry: Geometry, count: int = 16, seed: int = 0) -> list[tuple[int, int, int]]:
    """Threadgroups that exercise a big launch: every corner of the grid, the middle of every edge, then
    random interior ones (up to ``count`` in all)."""
    counts = threadgroup_counts(geometry)
    picks: list[tuple[int, int, int]] = []

    def add(t: tuple[int, ...]) -> None:
        if t not in picks:
            picks.append(t)  # type: ignore[arg-type]

    ends = [sorted({0, c - 1}) for c in counts]
    for x in ends[0]:
        for y in ends[1]:
            for z in ends[2]:
                add((x, y, z))
    mids = [c // 2 for c in counts]
    for d in range(3):
        for end in ends[d]:
            for other in range(3):
                if other != d:
                    t = list(mids)
                    t[d] = end
                    add(tuple(t))
    rng = np.random.default_rng(seed)
    total = counts[0] * counts[1] * counts[2]
    tries = 0
    while len(picks) < min(count, total) and tries < 10 * count:
        add(tuple(int(rng.integers(0, c)) for c in counts))
        tries += 1
    return picks


def verify_sampled(problem: Problem, geometry: Geometry, run: Any, logical: dict[str, np.ndarray],
                   threadgroups: list[tuple[int, int, int]]) -> Check:
    """Check what a sample of threadgroups wrote against the reference of the whole problem.

    Outputs are pre-filled twice (NaN, then a sentinel): an element either run changed was written. Every
    written element must match the reference, and the sample must have written about its share of the
    outputs (half of it at least: edge tiles are partial), so a kernel that skips its tiles fails."""
    refs = reference(problem, logical)
    first, second = run(float("nan")), run(SENTINEL)
    rtol, atol = tolerance(problem)
    counts = threadgroup_counts(geometry)
    total_tgs = counts[0] * counts[1] * counts[2]
    worst_abs = worst_rel = 0.0
    sentinel = float(round_to_dtype(np.array([SENTINEL]), problem.dtype)[0])  # as the output dtype holds it
    for name, a, b, ref in zip((t.name for t in problem.family.outputs), first, second, refs):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.shape != ref.shape:
            return Check(False, "shape", detail=f"{name}: shape {a.shape}, expected {ref.shape}")
        written = ~np.isnan(a) | (b != sentinel)
        expected = len(threadgroups) * ref.size / total_tgs
        if written.sum() < 0.5 * min(expected, ref.size):
            return Check(False, "unwritten", detail=f"{name}: {len(threadgroups)} sampled threadgroups of "
                         f"{total_tgs} wrote {int(written.sum())} element(s), about {expected:.0f} expected")
        got, want = a[written], ref[written]
        if np.isnan(got).any():
            return Check(False, "nan", detail=f"{name}: NaN written by a sampled threadgroup")
        err = np.abs(got - want)
        bad = err > atol + rtol * np.abs(want)
        worst_abs = max(worst_abs, float(err.max(initial=0.0)))
        worst_rel = max(worst_rel, float((err / np.maximum(np.abs(want), atol)).max(initial=0.0)))
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(written)[int(np.argmax(bad))])
            return Check(False, "wrong", worst_abs, worst_rel, int(bad.sum()),
                         detail=f"{name}: {int(bad.sum())} element(s) out of tolerance in sampled threadgroups, "
                                f"first at {where}: got {a[where]:.6g}, expected {ref[where]:.6g}")
    return Check(True, "", worst_abs, worst_rel,
                 detail=f"{len(threadgroups)} of {total_tgs} threadgroups sampled")

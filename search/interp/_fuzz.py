"""Schedule fuzz: on the CPU threadgroups run one after another and threads resume in index order, so a
kernel that reads another threadgroup's device output, or orders device memory with only a threadgroup
barrier, passes silently. Running it again with threadgroups reversed and shuffled (and the threads of each
threadgroup resumed in reversed / shuffled order, which interleaves simdgroups differently) shows such a
kernel: its output depends on the order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._interp import InterpResult, run_kernel


@dataclass(frozen=True)
class OrderDependence:
    """The first output element that differs between the grid-order run and another schedule."""

    schedule: str
    output: str
    index: tuple[int, ...]
    in_order: float
    other: float
    differing: int  # elements of that output that differ

    def __str__(self) -> str:
        return (f"output {self.output} depends on the schedule: element {self.index} is {self.in_order!r} in grid "
                f"order but {self.other!r} with threadgroups and threads {self.schedule} "
                f"({self.differing} element(s) differ)")


@dataclass(frozen=True)
class FuzzResult:
    runs: dict[str, InterpResult]
    dependence: OrderDependence | None

    @property
    def order_dependent(self) -> bool:
        return self.dependence is not None


def _first_difference(a: np.ndarray, b: np.ndarray, tolerance: float) -> tuple[tuple[int, ...], int] | None:
    if np.issubdtype(a.dtype, np.floating):
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        if tolerance > 0:
            wide_a, wide_b = a.astype(np.float64), b.astype(np.float64)
            same |= np.abs(wide_a - wide_b) <= tolerance * (1 + np.abs(wide_a))
    else:
        same = a == b
    bad = np.argwhere(~same)
    if len(bad) == 0:
        return None
    return tuple(int(v) for v in bad[0]), int(len(bad))


def fuzz_schedule(kernel: Any, grid: tuple[int, int, int], threadgroup: tuple[int, int, int],
                  output_shapes: list[tuple[int, ...]], output_dtypes: list[str], inputs: list[np.ndarray],
                  dtype: str, schedules: tuple[str, ...] = ("reversed", "shuffled"), seed: int = 1,
                  tolerance: float = 0.0, **run: Any) -> FuzzResult:
    """Run ``kernel`` in grid order and under each of ``schedules``; the first output element that differs
    (beyond ``tolerance``, relative: float atomics legitimately round differently in another order) is
    reported. Other keyword arguments go to :func:`run_kernel` (``mode``, ``input_dtypes``, ...)."""
    runs = {"in-order": run_kernel(kernel, grid, threadgroup, output_shapes, output_dtypes, inputs, dtype, **run)}
    base = runs["in-order"].outputs
    for k, name in enumerate(schedules):
        r = run_kernel(kernel, grid, threadgroup, output_shapes, output_dtypes, inputs, dtype, schedule=name,
                       seed=seed + k, **run)
        runs[name] = r
        for i, (a, b) in enumerate(zip(base, r.outputs)):
            diff = _first_difference(np.asarray(a), np.asarray(b), tolerance)
            if diff is not None:
                index, count = diff
                return FuzzResult(runs, OrderDependence(name, kernel.output_names[i], index, a[index].item(),
                                                        b[index].item(), count))
    return FuzzResult(runs, None)

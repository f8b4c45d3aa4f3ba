"""Honest timing of GPU work (the method is written down in ``docs/timing.md``).

The functions here know nothing about MLX: a back-end hands them ``launch(i)`` (enqueue one run on
input set ``i``, without waiting) and ``sync()`` (wait until all enqueued work is done, e.g.
``mx.synchronize``). The method:

1. warm up (the first launches compile and fault in caches and clocks);
2. pick a batch size so one batch of launches between two syncs lasts at least ``min_batch_ms``:
   launch overhead and the sync's own cost then stay small next to the kernel;
3. take samples (batch time / batch size) until the median is known to ``target_spread`` or the
   sample or time limit is reached; rotate among input sets so a working set that fits in the last-
   level cache is not measured hot when it would not be in real use; during a search, stop early a
   config that can no longer beat the incumbent (:mod:`._race`), and sample under :data:`SEARCH_PLAN`;
4. for the final ranking, :func:`interleaved` measures finalists and the baseline round-robin in one
   process, so drifting clocks and temperature hit every candidate alike, and :func:`lead_exceeds_noise`
   decides whether a lead is real.

The worker entry points that apply the method to a variant (build it, verify it, time it) are
:mod:`kernsearch.variants._tasks`, a floor above the back-ends that run it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ._race import Race

Launch = Callable[[int], object]
Sync = Callable[[], None]


@dataclass(frozen=True)
class TimingPlan:
    """Knobs of the method; the defaults suit kernels from microseconds to a few hundred ms."""

    warmup: int = 3
    min_batch_ms: float = 20.0
    max_batch: int = 1000
    min_samples: int = 10
    max_samples: int = 100
    target_spread: float = 0.02  # relative (p90 - p10) / median at which sampling may stop
    max_seconds: float = 5.0


#: The per-config budget during a search (the final round re-times the finalists under the full plan,
#: interleaved): batches of 5 ms, 6 to 30 samples, until a 3 % spread or 1 s. With racing, most configs
#: stop after 4 samples; the few that can still win are timed to this plan.
SEARCH_PLAN = TimingPlan(warmup=3, min_batch_ms=5.0, min_samples=6, max_samples=30, target_spread=0.03,
                         max_seconds=1.0)


@dataclass(frozen=True)
class Sampled:
    """The samples of one timing (ms per launch) and whether it stopped because it could not win."""

    samples: list[float]
    not_winning: bool = False


def input_sets_needed(working_set_bytes: float, cache_bytes: float, memory_budget_bytes: float = 2e9) -> int:
    """How many input sets to rotate so consecutive launches do not find their inputs in cache."""
    if working_set_bytes <= 0 or working_set_bytes >= cache_bytes:
        return 1
    sets = int(np.ceil(2 * cache_bytes / working_set_bytes)) + 1
    return max(1, min(sets, int(memory_budget_bytes // max(working_set_bytes, 1)), 64))


def spread(samples: list[float]) -> float:
    """Relative spread (p90 - p10) / median; 0 for fewer than two samples."""
    if len(samples) < 2:
        return 0.0
    lo, med, hi = np.percentile(samples, [10, 50, 90])
    return float((hi - lo) / med) if med > 0 else 0.0


def _batch_ms(launch: Launch, sync: Sync, n: int, first_set: int, n_sets: int,
              clock: Callable[[], float]) -> float:
    sync()
    start = clock()
    for i in range(n):
        launch((first_set + i) % n_sets)
    sync()
    return (clock() - start) * 1e3


def _calibrate(launch: Launch, sync: Sync, input_sets: int, plan: TimingPlan, clock: Callable[[], float]) -> int:
    """Warm up, then grow the batch until it lasts ``min_batch_ms`` (or reaches ``max_batch``)."""
    for i in range(plan.warmup):
        launch(i % input_sets)
        sync()
    batch = 1
    while True:
        ms = _batch_ms(launch, sync, batch, 0, input_sets, clock)
        if ms >= plan.min_batch_ms or batch >= plan.max_batch:
            return batch
        batch = min(plan.max_batch, max(batch * 2, int(batch * plan.min_batch_ms / max(ms, 1e-3)) + 1))


def measure(launch: Launch, sync: Sync, *, input_sets: int = 1, plan: TimingPlan = TimingPlan(),
            clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Per-launch times in ms (one sample per batch), following the method above."""
    return measure_raced(launch, sync, None, input_sets=input_sets, plan=plan, clock=clock).samples


def measure_raced(launch: Launch, sync: Sync, race: Race | None, *, input_sets: int = 1,
                  plan: TimingPlan = TimingPlan(), clock: Callable[[], float] = time.perf_counter) -> Sampled:
    """:func:`measure`, stopped as soon as ``race`` is lost (``not_winning``: the samples so far)."""
    batch = _calibrate(launch, sync, input_sets, plan, clock)
    samples: list[float] = []
    deadline = clock() + plan.max_seconds
    k = 0
    while len(samples) < plan.max_samples:
        samples.append(_batch_ms(launch, sync, batch, k, input_sets, clock) / batch)
        k += batch
        if race is not None and race.lost(samples):
            return Sampled(samples, not_winning=True)
        if len(samples) >= plan.min_samples and (spread(samples) <= plan.target_spread or clock() > deadline):
            break
    return Sampled(samples)


def interleaved(candidates: dict[str, tuple[Launch, Sync]], *, rounds: int = 15, input_sets: int = 1,
                plan: TimingPlan = TimingPlan(), clock: Callable[[], float] = time.perf_counter
                ) -> dict[str, list[float]]:
    """Round-robin samples of several candidates (finalists and the baseline), in one process."""
    batches: dict[str, int] = {}
    for name, (launch, sync) in candidates.items():
        batches[name] = _calibrate(launch, sync, input_sets, plan, clock)
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for r in range(rounds):
        order = list(candidates) if r % 2 == 0 else list(reversed(candidates))  # no fixed position
        for name in order:
            launch, sync = candidates[name]
            samples[name].append(_batch_ms(launch, sync, batches[name], r, input_sets, clock) / batches[name])
    return samples


def lead_exceeds_noise(fast: list[float], slow: list[float]) -> bool:
    """True when ``fast`` beats ``slow`` by more than their noise: fast's p90 is below slow's p10."""
    return float(np.percentile(fast, 90)) < float(np.percentile(slow, 10))


@dataclass(frozen=True)
class Speedup:
    """Baseline median / candidate median, with the range from the samples' p10/p90."""

    median: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.median:.2f}x (range {self.low:.2f}-{self.high:.2f})"


def speedup(candidate: list[float], baseline: list[float]) -> Speedup:
    c10, c50, c90 = np.percentile(candidate, [10, 50, 90])
    b10, b50, b90 = np.percentile(baseline, [10, 50, 90])
    return Speedup(float(b50 / c50), float(b10 / c90), float(b90 / c10))

"""The final round's timing method: kernels and the MLX op timed as consumers call them (``docs/timing.md``).

A consumer does not submit one launch at a time and wait: a model builds a graph of many calls, each waiting
for the one before (a decode step), and evaluates it once (``graph``: a chain of dependent calls), or evaluates
after every call (``eager``, e.g. an interactive loop); a family consumers call side by side may also be timed as
independent calls in one evaluation (``batch``: their launches overlap on the GPU, a throughput no decoder sees).
Each candidate is a ``call(i, previous=None)`` that runs the exported package's own planned call
(:func:`kernsearch.exporting.runtime._runtime.kernel_call`, :func:`~kernsearch.exporting.runtime._runtime.op_call`)
on input set ``i`` and returns its lazy outputs; given ``previous`` (the last call's outputs), its activation is
derived from them by the chain's link (:mod:`kernsearch.evaluation._chain`, the same for every candidate, so it
cancels). A sample is the wall time of ``calls`` such calls (built and evaluated) over ``calls``. Where the
family's inputs include weights, the sets rotate among copies whose total exceeds twice the last-level cache,
so every call reads its weights cold, as the layers of a model do. Candidates are interleaved round by round
(order reversed every other round), every candidate on the same sequence of input sets.

Nothing here knows MLX: the back-end hands in ``evaluate(outputs)`` (``mx.eval``) and ``sync()``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._vocabulary import CONSUMER_MODES, ConsumerMode

Call = Callable[..., Any]


@dataclass(frozen=True)
class ConsumerPlan:
    """How many calls make one graph (the chain's length), rounds of samples, warm-up calls per candidate, and
    the modes timed."""

    calls: int = 8
    rounds: int = 15
    warmup: int = 2
    modes: tuple[str, ...] = CONSUMER_MODES


def weight_sets(weight_bytes: float, cache_bytes: float, memory_budget_bytes: float = 4e9, most: int = 64) -> int:
    """Copies of the weights to rotate so that no call finds them in the last-level cache: enough that they
    total more than twice the cache (1 when the family has no weights)."""
    if weight_bytes <= 0:
        return 1
    wanted = math.ceil(2 * cache_bytes / weight_bytes) + 1
    return max(1, min(wanted, int(memory_budget_bytes // weight_bytes), most))


def consumer_samples(calls: dict[str, Call], evaluate: Callable[[Any], None], sync: Callable[[], None],
                     plan: ConsumerPlan = ConsumerPlan(), clock: Callable[[], float] = time.perf_counter
                     ) -> dict[str, dict[str, list[float]]]:
    """Per-call times (ms) by mode, then candidate: ``{"graph": {"f0": [...], "baseline": [...]}, ...}``."""
    for call in calls.values():  # first calls build, compile and load
        evaluate([call(i) for i in range(plan.warmup)])
        sync()
    samples: dict[str, dict[str, list[float]]] = {m: {name: [] for name in calls} for m in plan.modes}
    turn = 0
    for r in range(plan.rounds):
        order: Sequence[str] = list(calls) if r % 2 == 0 else list(reversed(list(calls)))
        for mode in plan.modes:
            for name in order:
                samples[mode][name].append(_sample(calls[name], mode, turn, plan.calls, evaluate, sync, clock))
        turn += plan.calls
    return samples


def _sample(call: Call, mode: str, first: int, n: int, evaluate: Callable[[Any], None], sync: Callable[[], None],
            clock: Callable[[], float]) -> float:
    sync()
    start = clock()
    if mode == ConsumerMode.GRAPH:
        evaluate(chain(call, first, n))
    elif mode == ConsumerMode.BATCH:
        evaluate([call(first + i) for i in range(n)])
    else:
        for i in range(n):
            evaluate(call(first + i))
    sync()
    return (clock() - start) * 1e3 / n


def chain(call: Call, first: int, n: int) -> Any:
    """The outputs of the last of ``n`` dependent calls: call ``j`` takes its activation from call ``j - 1``'s
    outputs, so evaluating them runs the whole chain, one call after the other, as a decode step does."""
    out = call(first)
    for i in range(1, n):
        out = call(first + i, out)
    return out


def timed_modes(declared: Sequence[str]) -> tuple[str, ...]:
    """The modes a final round times: every mode of :data:`CONSUMER_MODES`, then the family's other declared
    ones (``batch`` only where declared)."""
    return tuple(CONSUMER_MODES) + tuple(m for m in declared if m not in CONSUMER_MODES)


__all__ = ["Call", "ConsumerPlan", "chain", "consumer_samples", "timed_modes", "weight_sets"]

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

The decision on the op is taken by :func:`paired_rounds`: the winner and the op timed back to back in each round
(order alternating), one ratio per round and mode, rounds added until the interval of the median ratio decides
(``_rules.decide``) or a round or time cap is reached.

Nothing here knows MLX: the back-end hands in ``evaluate(outputs)`` (``mx.eval``) and ``sync()``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._rules import FIRST_LOOK, MAX_ROUNDS, looks
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


def input_sets(problem: Any, family: Any, chip: Any, backend: Any, seed: int) -> list[dict[str, Any]]:
    """Input sets for consumer timing: one set of activations, and enough copies of the weight inputs that they
    total more than twice the chip's last-level cache (the others share the first set's arrays), so that no call
    finds its weights in cache."""
    from ._verify import make_inputs

    first = make_inputs(problem, seed)
    weights = [t.name for t in family.inputs if t.weight]
    wbytes = sum(first[n].nbytes for n in weights)
    cache = float(getattr(chip, "system_cache_mb", 0) or 0) * 2**20 or getattr(backend, "cache_bytes", 48e6)
    n = weight_sets(wbytes, cache, getattr(backend, "memory_budget_bytes", 4e9))
    sets = [first]
    for k in range(1, n):
        more = make_inputs(problem, seed + k)
        sets.append({**first, **{name: more[name] for name in weights}})
    return sets


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


@dataclass(frozen=True)
class PairedPlan:
    """The sequential paired rounds of the decision: at most ``max_rounds`` rounds or ``max_seconds`` of timing (but
    at least ``_rules.FIRST_LOOK`` rounds, the fewest that bound the median), checked after the rounds of
    ``_rules.looks``; ``calls`` and ``modes`` as :class:`ConsumerPlan`."""

    calls: int = 8
    max_rounds: int = MAX_ROUNDS
    max_seconds: float = 30.0
    warmup: int = 2
    modes: tuple[str, ...] = CONSUMER_MODES


def paired_rounds(kernel: Call, op: Call, evaluate: Callable[[Any], None], sync: Callable[[], None],
                  decided: Callable[[dict[str, list[float]]], bool], plan: PairedPlan = PairedPlan(),
                  clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Per-round ratios (op time / kernel time) by mode, the two timed back to back in each round, order alternating
    (kernel first in even rounds); each sample takes the next input sets in turn, so the second of a round never
    finds the first's weights in cache. Rounds are added until ``decided(ratios)`` at a look of ``_rules.looks`` or
    a cap. Fresh rounds, not the ranking's: the winner is not judged on the rounds that chose it."""
    for call in (kernel, op):
        evaluate([call(i) for i in range(plan.warmup)])
        sync()
    ratios: dict[str, list[float]] = {m: [] for m in plan.modes}
    checks = set(looks(plan.max_rounds))
    deadline = clock() + plan.max_seconds
    turn = 0
    for r in range(plan.max_rounds):
        for mode in plan.modes:
            first, second = (kernel, op) if r % 2 == 0 else (op, kernel)
            a = _sample(first, mode, turn, plan.calls, evaluate, sync, clock)
            b = _sample(second, mode, turn + plan.calls, plan.calls, evaluate, sync, clock)
            k_ms, op_ms = (a, b) if r % 2 == 0 else (b, a)
            ratios[mode].append(op_ms / max(k_ms, 1e-12))
            turn += 2 * plan.calls
        if (r + 1 in checks and decided(ratios)) or (r + 1 >= FIRST_LOOK and clock() > deadline):
            break
    return ratios


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


__all__ = ["Call", "ConsumerPlan", "PairedPlan", "chain", "consumer_samples", "input_sets", "paired_rounds",
           "timed_modes", "weight_sets"]

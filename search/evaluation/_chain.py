"""The chain's link: how a call of a ``graph``-mode chain takes its activations from the previous call's outputs.

A decode step is a chain: every call waits for the one before. To time a kernel (and the MLX op) that way, call
``j`` of a chain reads inputs made from call ``j - 1``'s first output. Which inputs the family spec declares
(``chain_link``): a decode chains its residual stream, so a family that adds a residual R takes the previous
output as its next R (and its X from it too); the others take their first activation from it (the default: the
first input that is not a weight). Each fed input is made by the cheapest op that keeps its shape: the previous
output itself where shape and dtype agree (no op at all), else the output flattened (free: a contiguous view),
its first elements taken when it is at least as long as the input (free), else followed by the rest of the input
set's own array (one small copy, e.g. the down projection's X, longer than its output), cast where the dtypes
differ, and shaped as the input. The inputs not fed stay the input set's. Candidate and op are called through one
:class:`Link` object, so the derivation is the same op for both.

MLX is imported lazily (the back-end's process has it; this module's importers need not).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any


@dataclass(frozen=True)
class Link:
    """The fed inputs' positions among the family's inputs, and the derivation (previous outputs, the input set's
    own array) -> the next call's array."""

    positions: tuple[int, ...]
    derive: Callable[[Any, Any], Any]


def chain_position(inputs: Sequence[Any]) -> int:
    """The input a chain feeds by default: the first that is not a weight (the first input when all are)."""
    return next((i for i, t in enumerate(inputs) if not getattr(t, "weight", False)), 0)


def chain_positions(inputs: Sequence[Any], feeds: Sequence[str] = ()) -> tuple[int, ...]:
    """The positions of the inputs named by ``feeds`` (a spec's validated ``chain_link``); none named: the
    default one (:func:`chain_position`)."""
    if not feeds:
        return (chain_position(inputs),)
    names = [t.name for t in inputs]
    return tuple(names.index(name) for name in feeds)


def fed_from(mx: Any, previous: Any, own: Any) -> Any:
    """The next call's array for an input whose own array is ``own``, from the previous call's outputs: the output
    itself where shape and dtype agree (no op), else flattened (a view), cut to ``own``'s size (a view) or followed
    by the rest of ``own`` (one small copy), cast where the dtypes differ, shaped as ``own``. The gate's link and
    ``bench decode``'s kernel rows both derive this way, so their figures differ only by the call path."""
    y = previous[0] if isinstance(previous, (tuple, list)) else previous
    if y.shape == own.shape and y.dtype == own.dtype:
        return y  # the residual stream itself: no op
    flat, size = y.reshape(-1), own.size
    if flat.size > size:
        flat = flat[:size]
    elif flat.size < size:
        flat = mx.concatenate([flat, own.reshape(-1)[flat.size:]])
    if flat.dtype != own.dtype:
        flat = flat.astype(own.dtype)
    return flat.reshape(own.shape)


def mlx_link(inputs: Sequence[Any], feeds: Sequence[str] = ()) -> Link:
    """The chain's link for a family's inputs (their specs, in order) and its declared ``chain_link``, derived
    with MLX ops (:func:`fed_from`)."""
    import mlx.core as mx

    return Link(chain_positions(inputs, feeds), partial(fed_from, mx))


def chained(run: Callable[..., Any] | Sequence[Callable[..., Any]], arrays: Sequence[Sequence[Any]], link: Link,
            passed: Sequence[int] | None = None) -> Callable[..., Any]:
    """``call(i, previous=None)``: ``run`` on input set ``i``; given ``previous`` (the last call's outputs), the
    fed inputs are derived from them by ``link``. ``run`` may be one function per input set (a bound call holds
    its set's weights) and ``passed`` the positions of the inputs it takes (default: all): the op and a bound
    kernel go through this same code, so the harness costs both sides the same."""
    sets = [list(row) for row in arrays]
    runs = list(run) if isinstance(run, Sequence) else [run] * len(sets)
    if len(runs) != len(sets):
        raise ValueError(f"{len(runs)} functions for {len(sets)} input sets")
    take = list(range(len(sets[0]))) if passed is None else list(passed)
    fed_at = link.positions

    def call(i: int, previous: Any = None) -> Any:
        k = i % len(sets)
        row = sets[k]
        if previous is not None:
            row = list(row)
            for at in fed_at:
                row[at] = link.derive(previous, sets[k][at])
        return runs[k](*[row[p] for p in take])

    return call


__all__ = ["Link", "chain_position", "chain_positions", "chained", "fed_from", "mlx_link"]

"""The chain's link: how a call of a ``graph``-mode chain takes its activation from the previous call's outputs.

A decode step is a chain: every call waits for the one before. To time a kernel (and the MLX op) that way, call
``j`` of a chain reads an activation made from call ``j - 1``'s first output by the cheapest op that keeps shapes:
the output flattened (free: a contiguous view), its first elements taken when it is at least as long as the
activation (free), else followed by the rest of the input set's own activation (one small copy, e.g. qmatvec's
down projection, whose output is shorter than its activation), cast where the dtypes differ, and shaped as the
activation. A family with several activations chains its first (its first input that is not a weight); the
others stay the input set's. Candidate and op are called through one :class:`Link` object, so the derivation is
the same op for both and cancels in their ratio.

MLX is imported lazily (the back-end's process has it; this module's importers need not).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Link:
    """The chained input's position among the family's inputs, and the derivation (previous outputs, the input
    set's own activation) -> the next call's activation."""

    position: int
    derive: Callable[[Any, Any], Any]


def chain_position(inputs: Sequence[Any]) -> int:
    """The input a chain feeds: the first that is not a weight (the first input when all are)."""
    return next((i for i, t in enumerate(inputs) if not getattr(t, "weight", False)), 0)


def mlx_link(inputs: Sequence[Any]) -> Link:
    """The chain's link for a family's inputs (their specs, in order), derived with MLX ops."""
    import mlx.core as mx

    def derive(previous: Any, activation: Any) -> Any:
        y = previous[0] if isinstance(previous, (tuple, list)) else previous
        flat, size = y.reshape(-1), activation.size
        if flat.size > size:
            flat = flat[:size]
        elif flat.size < size:
            flat = mx.concatenate([flat, activation.reshape(-1)[flat.size:]])
        if flat.dtype != activation.dtype:
            flat = flat.astype(activation.dtype)
        return flat.reshape(activation.shape)

    return Link(chain_position(inputs), derive)


def chained(run: Callable[..., Any], arrays: Sequence[Sequence[Any]], link: Link) -> Callable[..., Any]:
    """``call(i, previous=None)``: ``run`` on input set ``i``; given ``previous`` (the last call's outputs), the
    chained input is derived from them by ``link``."""
    sets = [list(row) for row in arrays]
    at = link.position

    def call(i: int, previous: Any = None) -> Any:
        row = sets[i % len(sets)]
        if previous is None:
            return run(*row)
        fed = list(row)
        fed[at] = link.derive(previous, row[at])
        return run(*fed)

    return call


__all__ = ["Link", "chain_position", "chained", "mlx_link"]

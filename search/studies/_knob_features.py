"""What a surrogate sees of a config: its knobs, plus the structure kernel knobs have and generic encodings hide.

A kernel's time often turns on facts that are not a knob's position in its list: a block width that is a
power of two (on the recorded convolution landscapes of AMD GPUs a width of 48 or 96 is 50-100x slower
than 64 or 128), how many times a size divides by two (alignment, vector widths), and products of knobs
(threads per block = block_size_x x block_size_y; work per thread = tile_x x tile_y). A tree can split on
such a column at once where it would need many splits, and many evaluations, to carve it out of the
positions. Columns, per knob with more than one value:

* a numeric knob with more than two values: its position in the sorted list (scaled to [0, 1]), and where
  all values are positive its log2; where all are positive integers, its 2-adic valuation (times it
  divides by two, capped) and whether it is a power of two;
* a two-valued knob: 0/1; a categorical knob of more values: one column per value (one-hot);
* for every pair of positive numeric knobs: the log2 of their product.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

#: The 2-adic valuation is counted up to this (2**12 = 4096: alignment beyond it does not matter).
MAX_TWOS = 12


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _twos(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(times each positive integer divides by two, capped at MAX_TWOS; whether it is a power of two)."""
    x = a.astype(np.int64)
    twos = np.zeros(len(x))
    for _ in range(MAX_TWOS):
        even = (x % 2 == 0) & (x > 0)
        twos += even
        x = np.where(even, x // 2, x)
    return twos, (x == 1).astype(float)


def knob_columns(name: str, values: Sequence[Any], column: Sequence[Any]) -> tuple[list[np.ndarray], np.ndarray | None]:
    """The feature columns of one knob (its ``column`` of values over the configs), and its log2 column when
    it can enter a product (positive numeric, more than two values), else None."""
    if len(values) < 2:
        return [], None
    if _numeric(values) and len(values) > 2:
        a = np.array(column, dtype=float)
        order = {v: i for i, v in enumerate(sorted(values))}
        cols = [np.array([order[v] for v in column], dtype=float) / (len(values) - 1)]
        if min(values) <= 0:
            return cols, None
        log2 = np.log2(a)
        cols.append(log2)
        if all(float(v).is_integer() for v in values):
            cols += list(_twos(a))
        return cols, log2
    index = {repr(v): i for i, v in enumerate(values)}
    pos = np.array([index[repr(v)] for v in column])
    if len(values) == 2:
        return [pos.astype(float)], None
    return [(pos == j).astype(float) for j in range(len(values))], None


def knob_features(knobs: dict[str, list[Any]], configs: Sequence[dict[str, Any]]) -> np.ndarray:
    """The feature matrix of ``configs`` (rows) over ``knobs`` (see the module docstring)."""
    cols: list[np.ndarray] = []
    logs: list[np.ndarray] = []
    for name, values in knobs.items():
        c, log2 = knob_columns(name, values, [cfg[name] for cfg in configs])
        cols += c
        if log2 is not None:
            logs.append(log2)
    for i in range(len(logs)):
        for j in range(i + 1, len(logs)):
            cols.append(logs[i] + logs[j])
    return np.array(cols, dtype=float).T if cols else np.zeros((len(configs), 0))

"""Many configs at once, a column a name: each config's index into the distinct values of a knob or an expression.

A space's configs share few values a name, so an expression over them is evaluated once per distinct combination
of the values it reads (the combinations found by NumPy), not once per config. What a loop over the configs with
a memo did, in the same order: each combination's value is looked up in the memo (or evaluated, and kept there) at
its first config, the combinations taken in the order of their first configs. The enumeration of a space
(``_enumerate``) and the model's predictions of many configs (``backends/_model_columns``) read configs this way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

_MISSING = object()


class Column:
    """A value a config: ``values[codes[i]]`` is config i's."""

    __slots__ = ("codes", "values")

    def __init__(self, codes: np.ndarray, values: list[Any]) -> None:
        self.codes, self.values = codes, values

    @classmethod
    def of(cls, items: list[Any]) -> Column:
        """The column of ``items``, of one type (equal items share an index); items of several types (1 and True
        would share one) or an unhashable one raise TypeError."""
        if len(set(map(type, items))) > 1:
            raise TypeError("a column of several types")
        index = {value: i for i, value in enumerate(dict.fromkeys(items))}
        return cls(np.fromiter(map(index.__getitem__, items), dtype=np.intp, count=len(items)), list(index))

    def take(self, rows: np.ndarray) -> Column:
        """The column of the configs ``rows`` (indices)."""
        return Column(self.codes[rows], self.values)

    def value(self, row: int) -> Any:
        return self.values[self.codes[row]]


def combinations(varying: list[Column], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each of the ``n`` configs' combination of ``varying``'s values (an index), and each combination's first
    config."""
    combined, size = np.zeros(n, dtype=np.int64), 1
    for col in varying:  # one number a combination (mixed radix, renumbered before it could overflow)
        if size * len(col.values) >= 2**62:
            combined = np.unique(combined, return_inverse=True)[1].reshape(-1).astype(np.int64)
            size = int(combined.max()) + 1
        combined, size = combined * len(col.values) + col.codes, size * len(col.values)
    _, first, codes = np.unique(combined, return_index=True, return_inverse=True)
    return codes.reshape(-1).astype(np.intp), first


def evaluated(names: list[str], cols: dict[str, Column], n: int, memo: dict[Any, Any],
              evaluate: Callable[[list[Any]], Any]) -> Column:
    """An expression's value for each of the ``n`` configs of ``cols``, from the values of ``names`` (what it reads
    that varies): ``memo``'s, by the values' key (one name: its value; several: their tuple; none: ``()``), else
    ``evaluate(values)``, kept in ``memo``. Combinations with the same value share its index where that value is
    a bool, int or str (equal ones are the same value), so that what reads it meets each value once. An unhashable
    key raises TypeError; ``evaluate``'s errors pass."""
    varying = [cols[name] for name in names]
    codes, first = combinations(varying, n)
    index: dict[Any, int] = {}
    values: list[Any] = []
    shared = [0] * len(first)
    for j in np.argsort(first, kind="stable").tolist():
        row = int(first[j])
        read = [col.value(row) for col in varying]
        key = tuple(read) if len(read) != 1 else read[0]
        value = memo.get(key, _MISSING)
        if value is _MISSING:
            value = memo[key] = evaluate(read)
        same = (type(value), value) if type(value) in _EXACT else j  # j: an int, never a pair
        shared[j] = at = index.setdefault(same, len(values))
        if at == len(values):
            values.append(value)
    return Column(np.array(shared, dtype=np.intp)[codes], values)


#: Types whose equal values are the same value (not so 1 and 1.0, or 0.0 and -0.0).
_EXACT = frozenset({bool, int, str})

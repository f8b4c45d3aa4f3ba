"""The pruned walk of a space, a depth at a time: every config of the walk that reaches a knob's depth is a row of
columns (``_columns``), and a derived value or a constraint is evaluated once per combination of what it reads.

:meth:`Space.walk` goes depth first, checking each constraint as soon as what it reads is bound; this visits the
same configs (a big product's first-knob values one at a time, then every depth of a subtree at once) and says the
same: the valid configs in the walk's order, each rejected subtree counted under the first constraint it fails
(the counts in the order the walk first met them), every derived value and constraint evaluated at the first
config where the walk evaluated it. Gemm's 2,488,320 configs at 64x64x64: ~0.37 s a walk, ~0.24 s here. Where an
expression fails or a value cannot be a memo's key, this returns None and the walk finds it config by config.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import KernsearchError
from ._columns import Column, evaluated

if TYPE_CHECKING:
    from ._space import Config, Space

#: A product of more configs than this is walked a first-knob value at a time (bounding the rows of a depth).
MAX_AT_ONCE = 1 << 22


class _Level:
    """The rows of one subtree at one depth: their columns and how many there are."""

    def __init__(self, cols: dict[str, Column], n: int) -> None:
        self.cols, self.n = cols, n

    def keep(self, rows: np.ndarray) -> _Level:
        return _Level({name: col.take(rows) for name, col in self.cols.items()}, len(rows))

    def grown(self, knob: str, values: list[Any]) -> _Level:
        """Each row once per value of the next knob (in the walk's order: a row's values together)."""
        m = len(values)
        cols = {name: Column(np.repeat(col.codes, m), col.values) for name, col in self.cols.items()}
        cols[knob] = Column(np.tile(np.arange(m, dtype=np.intp), self.n), values)
        return _Level(cols, self.n * m)


class _Walk:
    """One enumeration: the space, its memos (one an expression, shared by every subtree) and what it found."""

    def __init__(self, space: Space) -> None:
        self.space = space
        fam = space.family
        self.names = list(fam.knobs)
        self.values = [list(fam.knobs[n].values) for n in self.names]
        sizes = [len(v) for v in self.values]
        self.below = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
        self.varying = set(fam.knobs) | set(fam.derived)
        self.memos: dict[int, dict[Any, Any]] = {}
        self.rejected: Counter[str] = Counter()
        self.first_rejected: dict[str, tuple[int, ...]] = {}  # where the walk first rejects under each name
        self.valid: list[Config] = []

    def subtrees(self, firsts: list[int]) -> None:
        """The subtrees of the first knob's values ``firsts`` (indices), depth by depth."""
        level = _Level({self.names[0]: Column(np.array(firsts, dtype=np.intp), self.values[0])}, len(firsts))
        for depth, name in enumerate(self.names):
            if depth:
                level = level.grown(name, self.values[depth])
            level = self.bound(level, depth)
        knobs = [list(map(values.__getitem__, level.cols[name].codes.tolist()))
                 for name, values in zip(self.names, self.values)]
        self.valid.extend(dict(zip(self.names, row)) for row in zip(*knobs))

    def bound(self, level: _Level, depth: int) -> _Level:
        """The derived values that become computable at ``depth``, then its constraints, each on the rows the
        ones before it passed; the rows that pass them all."""
        fam, (derived, checks) = self.space.family, self.space._plan[depth]
        for name in derived:
            level.cols[name] = self.column(level, fam.derived[name], f"derived.{name}")
        alive = np.ones(level.n, dtype=bool)
        for i in checks:
            rows = np.flatnonzero(alive)
            constraint = fam.constraints[i]
            col = self.column(level, constraint.expr, constraint.name, rows)
            failed = rows[~np.array([bool(v) for v in col.values], dtype=bool)[col.codes]]
            if len(failed):
                self.reject(constraint.name, level, depth, failed)
                alive[failed] = False
        return level if alive.all() else level.keep(np.flatnonzero(alive))

    def column(self, level: _Level, expr: Any, where: str, rows: np.ndarray | None = None) -> Column:
        """``expr`` on the rows of ``level`` (or those of them in ``rows``): only the columns it reads are taken."""
        names = sorted(n for n in expr.names if n in self.varying)
        cols = {n: level.cols[n] if rows is None else level.cols[n].take(rows) for n in names}
        base = self.space.base
        memo = self.memos.setdefault(id(expr), {})
        return evaluated(names, cols, level.n if rows is None else len(rows), memo,
                         lambda read: self.space._eval(expr, {**base, **dict(zip(names, read))}, where))

    def reject(self, name: str, level: _Level, depth: int, failed: np.ndarray) -> None:
        self.rejected[name] += len(failed) * self.below[depth]
        at = tuple(int(level.cols[k].codes[failed[0]]) for k in self.names[:depth + 1])
        if name not in self.first_rejected or at < self.first_rejected[name]:
            self.first_rejected[name] = at

    def rejections(self) -> Counter[str]:
        """The counts in the order the depth-first walk first met each name."""
        order = sorted(self.first_rejected, key=self.first_rejected.__getitem__)
        return Counter({name: self.rejected[name] for name in order})


def by_levels(space: Space, advance: Callable[[int], None]) -> tuple[list[Config], Counter[str]] | None:
    """The valid configs of ``space`` (a family with knobs) and its rejections, as :meth:`Space.enumerate`'s walk
    finds them; None where an expression fails (or a value is not hashable): the walk then says where.
    ``advance`` hears how many configs of the product are walked, after each first-knob value."""
    walk = _Walk(space)
    firsts = range(len(walk.values[0]))
    # A big product a first-knob value at a time (a depth of its rows stays small), a small one at once.
    chunks = [[i] for i in firsts] if walk.below[0] * len(firsts) > MAX_AT_ONCE else [list(firsts)] * bool(firsts)
    try:
        for chunk in chunks:
            walk.subtrees(chunk)
            advance((chunk[-1] + 1) * walk.below[0])
    except (KernsearchError, TypeError, ValueError):
        return None
    return walk.valid, walk.rejections()

"""Shapes where a config may run, derived from its family's spec: the smallest one the interpreter proves a
variant on, and a ragged one near a given shape.

A tuned config is valid at its tuned shape, not at every shape: a row kernel that holds a 4096-element row in
registers is invalid (``held_row_not_oversized``) at a 96-element row, and a quantized kernel's dims are tied
(``KW * 32 == K * BITS``). So the shapes are searched, not capped: from the tuned shape, dims (alone or together,
so that tied dims move as one) shrink while every constraint of the family still holds for the config, the
problem's own derived quantities (those of dims alone: qmatvec's bits and group size) keep their values, the
launch still spans two threadgroups along each grid axis that spanned two at the tuned shape (the edges between
threadgroups and a partial last one are exercised) and no dim falls below :data:`MIN_SIDE` (or its tuned size:
a kernel's loops over a dim must still run more than once); the cheapest such shape (by the spec's ``flops`` +
``bytes``) is kept. The floor is no cap: a dim stays as large as the config needs (a held 4096-element row
stays above 2048).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .._errors import KernsearchError

if TYPE_CHECKING:
    from ..hardware._chips import Chip
    from ._space import Config, Space
    from ._spec import Family

Shape = tuple[int, ...]

#: No dim of a verification shape shrinks below this (a dim tuned smaller keeps its size): below it a kernel's
#: loops over a dim (a row, a K-block) stop running more than once and a check proves little.
MIN_SIDE = 64
#: Shrinking steps: a dim ``d`` becomes ``d - d // k`` (halved, then smaller steps near a constraint's edge).
_STEPS = (2, 4, 8, 16)
#: Cuts tried for a ragged shape (sizes just below the given ones, off the tiles), in order: odd ones first, so
#: that no power-of-two tile divides a cut dim (a tile that divided it hid a guard off by one at the edge).
_CUTS = (1, 3, 4, 8, 12, 20, 2)


class _Shapes:
    """One config of one family at one dtype and chip: which shapes it is valid at, and what they cost."""

    def __init__(self, family: Family, dtype: str, chip: Chip, config: Config) -> None:
        from ._expr import BUILTINS

        self.family, self.dtype, self.chip, self.config = family, dtype, chip, config
        self._memo: dict[Shape, Space | None] = {}
        problem_names = set(family.dims) | {"dtype", "dtype_size"} | set(BUILTINS)
        #: derived values of the problem alone (no knob, no chip): what the problem *is* beyond its sizes
        self.quantities = [name for name, expr in family.derived.items() if expr.names <= problem_names]

    def quantities_at(self, shape: Shape) -> tuple[object, ...] | None:
        space = self.space(shape)
        if space is None:
            return None
        ctx = space.context(self.config)
        return tuple(ctx[name] for name in self.quantities)

    def space(self, shape: Shape) -> Space | None:
        """The space at ``shape`` when ``config`` is valid there (None: not a problem, or invalid)."""
        if shape not in self._memo:
            from ._space import Space, make_problem

            try:
                space: Space | None = Space(make_problem(self.family, shape, self.dtype, self.chip), self.chip)
                if space is not None and not space.is_valid(self.config):
                    space = None
            except KernsearchError:
                space = None
            self._memo[shape] = space
        return self._memo[shape]

    def spans(self, shape: Shape) -> tuple[int, ...] | None:
        """Threadgroups along each grid axis at ``shape`` (None: the config is not valid there)."""
        from ._render import geometry

        space = self.space(shape)
        if space is None:
            return None
        try:
            geo = geometry(space, self.config)
        except KernsearchError:
            return None
        return tuple(-(-g // t) for g, t in zip(geo.grid, geo.threadgroup))

    def cost(self, shape: Shape) -> float:
        """The spec's work at ``shape`` (flops + bytes), what the interpreter spends its time on."""
        from ._space import make_problem

        try:
            problem = make_problem(self.family, shape, self.dtype, self.chip)
            return float(problem.flops()) + float(problem.bytes())
        except (KernsearchError, ArithmeticError, TypeError, ValueError):
            return float(sum(shape))


def _shrunk(shape: Shape) -> Iterator[Shape]:
    """Every shape one step smaller than ``shape``: each non-empty set of dims, each step size."""
    dims = [i for i, d in enumerate(shape) if d > 1]
    for n in range(len(dims), 0, -1):
        for chosen in itertools.combinations(dims, n):
            for k in _STEPS:
                yield tuple(d - max(1, d // k) if i in chosen else d for i, d in enumerate(shape))


def smallest_shape(family: Family, dtype: str, chip: Chip, config: Config, start: Shape) -> Shape:
    """The cheapest shape at most ``start`` (dim by dim) and no dim below ``min(start, MIN_SIDE)`` where ``config``
    is valid, the problem's derived quantities are those at ``start`` and the launch spans at least two
    threadgroups along every grid axis that has two at ``start``; ``start`` itself when nothing smaller is."""
    shapes = _Shapes(family, dtype, chip, config)
    declared = _declared(shapes, family, dtype, tuple(start), "verify_shape")
    if declared is not None:  # the family says which small problem keeps it what it is (qmatvec's quantization)
        return declared
    spans = shapes.spans(tuple(start))
    if spans is None:
        return tuple(start)
    floor = tuple(min(2, s) for s in spans)
    sides = tuple(min(d, MIN_SIDE) for d in start)
    same = shapes.quantities_at(tuple(start))

    def fits(shape: Shape) -> bool:
        if any(d < low for d, low in zip(shape, sides)):
            return False
        now = shapes.spans(shape)
        return now is not None and all(a >= b for a, b in zip(now, floor)) and shapes.quantities_at(shape) == same

    current = tuple(start)
    while True:  # greedy: the cheapest smaller shape that fits, until none does
        candidates = sorted(set(_shrunk(current)), key=lambda s: (shapes.cost(s), s))
        nxt = next((s for s in candidates if fits(s)), None)
        if nxt is None:
            return current
        current = nxt


def ragged_shape(family: Family, dtype: str, chip: Chip, config: Config, near: Shape) -> Shape | None:
    """A shape a little smaller than ``near`` whose sizes are not multiples of the tiles, where ``config`` is still
    valid and the problem's derived quantities are those at ``near``: every dim above the cut cut by it if that
    is valid, else as many dims as can be (tied dims stay)."""
    shapes = _Shapes(family, dtype, chip, config)
    declared = _declared(shapes, family, dtype, tuple(near), "ragged_shape")
    if declared is not None and declared != tuple(near):
        return declared
    same = shapes.quantities_at(tuple(near))
    found = [shape for shape in (_cut_each(shapes, tuple(near), same), _cut_together(shapes, tuple(near), same))
             if shape is not None]
    # The most dims off every power-of-two tile (odd), then the most dims cut: a dim a tile of the config divides
    # hides an off-by-one at its edge (gemv at 3x256x256 with VEC 4: N and K cut together by 4 gave 252, which its
    # 4 outputs per threadgroup divide; N cut alone is 255).
    return max(found, key=lambda shape: (sum(d % 2 for d in shape), sum(a != b for a, b in zip(shape, near))),
               default=None)


def _cut_each(shapes: _Shapes, near: Shape, same: tuple[object, ...] | None) -> Shape | None:
    """Each even dim in turn cut by the first of :data:`_CUTS` that keeps the config valid (an odd dim stays: no
    power-of-two tile divides it); None if none could be cut."""
    shape = list(near)
    for i, d in enumerate(near):
        if d % 2:
            continue
        for cut in (c for c in _CUTS if d > c):
            trial = tuple(shape[:i] + [d - cut] + shape[i + 1:])
            if shapes.space(trial) is not None and shapes.quantities_at(trial) == same:
                shape = list(trial)
                break
    return tuple(shape) if tuple(shape) != near else None


def _cut_together(shapes: _Shapes, near: Shape, same: tuple[object, ...] | None) -> Shape | None:
    """Every dim above the cut cut by it if that is valid, else as many dims as can be (tied dims stay)."""
    dims = list(range(len(near)))
    for n in range(len(dims), 0, -1):
        for cut in _CUTS:
            for chosen in itertools.combinations(dims, n):
                shape = tuple(d - cut if i in chosen and d > cut else d for i, d in enumerate(near))
                if shape != near and shapes.space(shape) is not None and shapes.quantities_at(shape) == same:
                    return shape
    return None


def _declared(shapes: _Shapes, family: Family, dtype: str, shape: Shape, field: str) -> Shape | None:
    """The family's ``problem.verify_shape`` / ``problem.ragged_shape`` of ``shape`` where it declares one and the
    config is valid there; None otherwise."""
    from ._space import make_problem

    try:
        problem = make_problem(family, shape, dtype)
        found = problem.verify_shape() if field == "verify_shape" and family.problem.verify_shape is not None \
            else problem.ragged_shape() if field == "ragged_shape" else None
    except KernsearchError:
        return None
    return tuple(found) if found is not None and shapes.space(tuple(found)) is not None else None

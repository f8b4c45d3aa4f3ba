"""The search space of one problem: a family's knobs filtered by its constraints for a shape, dtype and chip.

Enumeration walks the knobs in declared order and checks each constraint as soon as every name it
reads is bound, so whole sub-trees are pruned at once (a depth at a time, ``_enumerate``). A rejected config
is counted once, under the first constraint (in that walk order) it violates; :meth:`Space.violations` lists
*all* of them for one config.
"""

from __future__ import annotations

import itertools
import math
import operator
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .._errors import ConfigError, KernsearchError, SpecError
from ..hardware._chips import Chip
from ._enumerate import by_levels
from ._expr import BUILTINS, ExprError
from ._spec import DTYPES, Family, KnobValue

#: Largest size of one problem dimension (kernels index with 32-bit integers).
MAX_DIM = 2**31 - 1

Config = dict[str, KnobValue]
#: Draws of the product a sample may take per new valid config it has found (and ten more) before it enumerates
#: the space instead (valid configs rarer than that, or a sample near the whole of them: the pruned walk is then
#: the cheaper way to them).
DRAWS_PER_NEW_CONFIG = 200


@dataclass(frozen=True)
class Problem:
    """One concrete problem: a family at a shape and dtype."""

    family: Family
    shape: tuple[int, ...]
    dtype: str

    @property
    def dims(self) -> dict[str, int]:
        return dict(zip(self.family.dims, self.shape))

    @property
    def shape_text(self) -> str:
        return "x".join(map(str, self.shape))

    def flops(self) -> float:
        return float(self.family.problem.flops(self._ctx()))

    def bytes(self) -> float:
        return float(self.family.problem.bytes(self._ctx()))

    def _ctx(self) -> dict[str, Any]:
        return {**BUILTINS, **self.dims, "dtype": self.dtype, "dtype_size": DTYPES[self.dtype]}

    def verify_shape(self) -> tuple[int, ...]:
        """The small problem the interpreter verifies this one on (``problem.verify_shape``, else each size cut
        to 96)."""
        declared = self._declared("verify_shape")
        return declared if declared is not None else tuple(min(d, 96) for d in self.shape)

    def ragged_shape(self) -> tuple[int, ...] | None:
        """The family's ragged problem near this one (``problem.ragged_shape``); None where it declares none.
        A declared shape is never larger than this problem in any size."""
        return self._declared("ragged_shape")

    def _declared(self, field: str) -> tuple[int, ...] | None:
        expr = getattr(self.family.problem, field)
        if expr is None:
            return None
        where = f"{self.family.path}/family.toml: problem.{field}"
        try:
            value = expr(self._ctx())
        except ExprError as exc:
            raise SpecError(f"{where}: {exc}") from None
        if not isinstance(value, (list, tuple)) or len(value) != len(self.shape) \
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise SpecError(f"{where}: expected {len(self.shape)} integer sizes, got {str(value)[:80]}")
        if any(v > d for v, d in zip(value, self.shape)):  # never more work than the problem it stands for
            raise SpecError(f"{where}: {str(value)[:80]} is larger than the problem {self.shape_text}")
        return make_problem(self.family, tuple(value), self.dtype).shape


def make_problem(family: Family, shape: str | tuple[int, ...] | None = None, dtype: str | None = None,
                 chip: Chip | None = None) -> Problem:
    """Parse and check a shape (``"4096,4096,4096"``) and dtype against the family (and chip)."""
    sizes = _sizes(family, shape)
    dtype = dtype or family.problem.default_dtype
    if dtype not in family.problem.dtypes:
        raise KernsearchError(f"dtype {dtype!r} not supported by {family.name} "
                              f"(supported: {', '.join(family.problem.dtypes)})")
    if chip is not None and dtype == "bfloat16" and not chip.bfloat16:
        raise KernsearchError(f"chip {chip.name} has no bfloat16 support")
    return Problem(family, sizes, dtype)


def _sizes(family: Family, shape: str | tuple[int, ...] | None) -> tuple[int, ...]:
    """The problem's sizes from a shape given as text, numbers or not at all (the family's default), checked."""
    dims = family.dims
    if shape is None:
        sizes = tuple(family.problem.default_shape)
    elif isinstance(shape, str):
        parts = [p for p in shape.replace("x", ",").split(",") if p.strip()]
        try:
            sizes = tuple(int(p) for p in parts)
        except ValueError:
            raise KernsearchError(f"bad shape {shape!r}: expected {len(dims)} integers "
                                  f"{','.join(dims)}") from None
    else:
        sizes = tuple(int(s) for s in shape)
    if len(sizes) != len(dims):
        raise KernsearchError(f"bad shape {shape!r}: {family.name} needs {len(dims)} sizes "
                              f"({','.join(dims)}), got {len(sizes)}")
    huge = [f"{d}={s}" for d, s in zip(dims, sizes) if s > MAX_DIM]
    if huge:
        raise KernsearchError(f"impossible shape: {', '.join(huge)[:120]} (sizes are at most {MAX_DIM})")
    bad = [f"{d}={s}" for d, s in zip(dims, sizes) if s <= 0]
    if bad:
        raise KernsearchError(f"impossible shape: {', '.join(bad)} (sizes must be positive)")
    return sizes


@dataclass(frozen=True)
class Violation:
    constraint: str
    why: str

    def __str__(self) -> str:
        return f"{self.constraint} ({self.why})" if self.why else self.constraint


@dataclass
class SpaceSummary:
    total: int
    valid: list[Config]
    rejected: Counter[str] = field(default_factory=Counter)


class Space:
    """Knobs × constraints for one problem on one chip."""

    def __init__(self, problem: Problem, chip: Chip) -> None:
        self.problem = problem
        self.family = problem.family
        self.chip = chip
        self.base: dict[str, Any] = {**problem._ctx(), "chip": chip}
        self._plan = self._make_plan()

    @property
    def knobs(self) -> dict[str, list[KnobValue]]:
        return {name: list(k.values) for name, k in self.family.knobs.items()}

    @property
    def total(self) -> int:
        return math.prod(len(v) for v in self.knobs.values())

    def _make_plan(self) -> list[tuple[list[str], list[int]]]:
        """For each knob depth: derived values and constraints that become computable there."""
        fam = self.family
        bound = set(self.base)
        plan: list[tuple[list[str], list[int]]] = []
        pending_derived = list(fam.derived)
        pending_constraints = list(range(len(fam.constraints)))
        for knob in fam.knobs:
            bound.add(knob)
            ready_derived = []
            for name in list(pending_derived):
                if fam.derived[name].names <= bound:
                    ready_derived.append(name)
                    bound.add(name)
                    pending_derived.remove(name)
            ready = [i for i in pending_constraints if fam.constraints[i].expr.names <= bound]
            pending_constraints = [i for i in pending_constraints if i not in ready]
            plan.append((ready_derived, ready))
        return plan

    # -- one config ---------------------------------------------------------------------------------
    def context(self, config: Config) -> dict[str, Any]:
        """Everything an expression may read for ``config``: problem, chip, knobs, derived values."""
        ctx = {**self.base, **config}
        for name, expr in self.family.derived.items():
            ctx[name] = self._eval(expr, ctx, f"derived.{name}")
        return ctx

    def violations(self, config: Config) -> list[Violation]:
        ctx = self.context(config)
        return [Violation(c.name, c.why) for c in self.family.constraints
                if not self._eval(c.expr, ctx, f"constraint {c.name}")]

    def parse_config(self, text: str | Config | None) -> Config:
        """``"BM=64,BN=32"`` (knobs not given keep the family default) → a checked, complete config."""
        config: Config = dict(self.family.default)
        given = text if isinstance(text, dict) else _split_assignments(text or "")
        for name, raw in given.items():
            knob = self.family.knobs.get(name)
            if knob is None:
                raise ConfigError(f"unknown knob {name!r} for {self.family.name} "
                                  f"(knobs: {', '.join(self.family.knobs)})")
            try:
                value = knob.parse(raw) if isinstance(raw, str) else raw
            except ValueError:
                value = raw
            if value not in knob.values or type(value) is not type(knob.values[0]):
                raise ConfigError(f"invalid value {name}={raw} (allowed: "
                                  f"{', '.join(map(str, knob.values))})")
            config[name] = value
        return config

    def validate(self, config: Config) -> Config:
        bad = self.violations(config)
        if bad:
            raise ConfigError(f"config {format_config(config)} violates " + "; ".join(map(str, bad)))
        return config

    def is_valid(self, config: Config) -> bool:
        return not self.violations(config)

    # -- the whole space ----------------------------------------------------------------------------
    def enumerate(self) -> SpaceSummary:
        """Every valid config, and the rejected ones counted by constraint (a step: big spaces take seconds): found a
        depth at a time (``_enumerate``), or by :meth:`walk` where that gives up (an expression error, which the
        walk reports at the first config it meets it)."""
        from .._steps import step

        with step(f"enumerating the {self.total:,} configs of {self.family.name}", total=self.total) as progress:
            found = by_levels(self, progress.advance) if self.family.knobs else None
            if found is None:
                return self.walk(progress.advance)
            return SpaceSummary(total=self.total, valid=found[0], rejected=found[1])

    def walk(self, advance: Callable[[int], None]) -> SpaceSummary:
        """:meth:`enumerate` config by config: the knobs depth first, each constraint checked as soon as what it
        reads is bound; ``advance`` hears how many configs of the product are walked."""
        fam = self.family
        names = list(fam.knobs)
        sizes = [len(fam.knobs[n].values) for n in names]
        remaining = [math.prod(sizes[i + 1:]) for i in range(len(names))]
        summary = SpaceSummary(total=self.total, valid=[])
        bind = self._binder()

        ctx = dict(self.base)  # one context, set in place: what depth d binds reads only what depths <= d set
        last = len(names) - 1

        def walk(depth: int, start: int) -> None:
            """``start``: how many configs of the product come before this subtree's first one."""
            name, below = names[depth], remaining[depth]
            for n, value in enumerate(fam.knobs[name].values):
                ctx[name] = value
                failed = bind(depth, ctx)
                if failed is not None:
                    summary.rejected[fam.constraints[failed].name] += below
                elif depth == last:
                    summary.valid.append({k: ctx[k] for k in names})
                else:
                    walk(depth + 1, start + n * below)
                if depth < 3:  # this value's whole subtree is walked (or pruned): say how far the walk is
                    advance(start + (n + 1) * below)

        if names:
            walk(0, 0)
        else:
            summary.valid.append({})
        return summary

    def sample(self, n: int, rng: random.Random, found: Callable[[int], None] | None = None) -> list[Config]:
        """Up to ``n`` distinct valid configs, uniform over the valid ones (``rng`` seeded: the same every run).
        Each draw is a uniform config of the product, taken knob by knob in the walk's order and given up at the
        first constraint it fails: the same distribution as checking whole configs, for a fraction of the
        evaluations. A space whose new valid configs come too rarely for that is enumerated and sampled.
        ``found`` hears how many are drawn so far."""
        bind = self._binder()
        names = list(self.family.knobs)
        levels = [(depth, name, self.family.knobs[name].values) for depth, name in enumerate(names)]
        out: dict[tuple[KnobValue, ...], Config] = {}
        draws = 0
        ctx = dict(self.base)  # set in place, as the walk's: what depth d binds reads only what depths <= d set
        while len(out) < n and draws < DRAWS_PER_NEW_CONFIG * (len(out) + 10):
            draws += 1
            for depth, name, values in levels:
                ctx[name] = rng.choice(values)
                if bind(depth, ctx) is not None:
                    break
            else:
                key = tuple(ctx[k] for k in names)
                if key not in out:
                    out[key] = dict(zip(names, key))
                    if found is not None:
                        found(len(out))
        if len(out) >= n:
            return list(out.values())
        valid = self.enumerate().valid
        return rng.sample(valid, min(n, len(valid)))

    def _binder(self) -> Callable[[int, dict[str, Any]], int | None]:
        """``bind(depth, ctx)``, with the knob at ``depth`` just set in ``ctx``: adds the derived values computable
        from there on and returns the first constraint (its index) that then fails, or None. Each derived value and
        constraint is computed once per combination of the knobs and derived values it reads (the rest is fixed for
        this problem), not once per config of a walk."""
        fam = self.family
        varying = set(fam.knobs) | set(fam.derived)
        memos: dict[int, dict[Any, Any]] = {}  # id(expr) -> its values by the values of what it reads that vary

        def entry(expr: Any, where: str) -> tuple[Any, str, Callable[[dict[str, Any]], Any], dict[Any, Any]]:
            read = sorted(n for n in expr.names if n in varying)
            return (expr, where, operator.itemgetter(*read) if read else (lambda c: ()),
                    memos.setdefault(id(expr), {}))

        levels = [([(d, *entry(fam.derived[d], f"derived.{d}")) for d in derived],
                   [(i, *entry(fam.constraints[i].expr, fam.constraints[i].name)) for i in checks])
                  for derived, checks in self._plan]

        def value(expr: Any, where: str, get: Callable[[dict[str, Any]], Any], memo: dict[Any, Any],
                  ctx: dict[str, Any]) -> Any:
            key = get(ctx)
            try:
                return memo[key]
            except KeyError:
                memo[key] = found = self._eval(expr, ctx, where)
                return found
            except TypeError:  # an unhashable derived value (a list): evaluated every time
                return self._eval(expr, ctx, where)

        def bind(depth: int, ctx: dict[str, Any]) -> int | None:
            derived, checks = levels[depth]
            for name, expr, where, get, memo in derived:
                ctx[name] = value(expr, where, get, memo, ctx)
            for i, expr, where, get, memo in checks:
                if not value(expr, where, get, memo, ctx):
                    return i
            return None

        return bind

    def iter_all(self) -> Iterator[Config]:
        """Every config of the product, valid or not (for tests and brute force)."""
        names = list(self.family.knobs)
        for values in itertools.product(*(self.family.knobs[n].values for n in names)):
            yield dict(zip(names, values))

    def _eval(self, expr: Any, ctx: dict[str, Any], where: str) -> Any:
        try:
            return expr(ctx)
        except ExprError as exc:
            raise KernsearchError(f"{self.family.path}/family.toml: {where}: {exc}") from None


def _split_assignments(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ConfigError(f"bad config item {part!r}: expected KNOB=VALUE")
        out[name.strip()] = value.strip()
    return out


def format_config(config: Config) -> str:
    return ",".join([f"{k}={v}" for k, v in config.items()])  # a list: join builds one from a generator anyway

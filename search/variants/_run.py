"""``kernsearch.run``: one variant of a family run on the CPU Metal interpreter, its outputs as NumPy arrays.

The test API for a family's author: check a kernel against your own NumPy (edge cases, special values, a
second opinion on the spec's reference) without the search. It renders the variant exactly as a search
would, runs the whole grid on the interpreter (evidence: *interpreted*, correctness only, never a time) and
hands back every output by name with the inputs the kernel saw.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import KernsearchError
from .._rules import INTERPRETER_TARGET
from .._vocabulary import Evidence

if TYPE_CHECKING:
    from ..backends._base import Diagnostic
    from ..family._space import Config, Problem
    from ..family._spec import Family
    from ..hardware._chips import Chip


@dataclass(frozen=True)
class VariantRun:
    """One run of a variant on the interpreter.

    ``outputs`` maps each output name to its values (float32 arrays for float16, bfloat16 and float32
    outputs: exactly the values the kernel wrote in its dtype); ``inputs`` maps each input name to the array
    the kernel read, in the reference's layout and exact in the input's dtype (yours, rounded, or drawn from
    the spec's distribution); ``params`` the scalar parameters as the kernel saw them."""

    family: str
    config: Config
    shape: tuple[int, ...]
    dtype: str
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    params: dict[str, float | int]
    diagnostics: list[Diagnostic] = field(default_factory=list)
    evidence: str = Evidence.INTERPRETED


def run(family: str | Path | Family, config: str | Mapping[str, Any] | None = None,
        shape: str | tuple[int, ...] | None = None, dtype: str | None = None,
        inputs: Mapping[str, Any] | None = None, *, seed: int = 0, mode: str = "fast",
        chip: str | Chip | None = None, timeout: float = 30.0) -> VariantRun:
    """Run ``family``'s variant ``config`` (``"TG=64,VEC=4"`` or a dict; knobs not given keep the default) on the
    interpreter and return its outputs.

    ``inputs`` (by input name, the reference's layout) are converted to each input's dtype; inputs not given are
    drawn from the spec's distributions with ``seed``. ``shape`` defaults to the one ``inputs`` imply (else the
    family's default shape). ``mode``: ``fast``, ``check`` (threadgroup races, uninitialised and out-of-bounds
    threadgroup memory: ``diagnostics``) or ``sanitize``. ``chip`` decides which configs are valid (default: the GPU
    here where it runs Metal, else M2 Max, as ``kernsearch verify``). Bad input is a :class:`KernsearchError`; a
    variant that fails to compile, crashes or hangs raises
    :class:`~kernsearch.VariantFailure`."""
    from ..backends._cpu import CpuBackend
    from ..evaluation._verify import kernel_inputs
    from ..family._render import geometry, render
    from ..family._space import Space, make_problem
    from ..family._spec import Family, load_family
    from ..hardware._chips import resolve_chip
    from ..interp import template_lines

    fam = family if isinstance(family, Family) else load_family(family)
    the_chip = resolve_chip(chip, target=CpuBackend.target, default=True)  # as `kernsearch verify` resolves it
    given = dict(inputs or {})
    unknown = sorted(set(given) - {t.name for t in fam.inputs})
    if unknown:
        raise KernsearchError(f"{fam.name}: no input named {', '.join(unknown)} (inputs: "
                              f"{', '.join(t.name for t in fam.inputs)})")
    implied = _implied_shape(fam, given) if shape is None else None
    problem = make_problem(fam, shape if shape is not None else implied, dtype, the_chip)
    space = Space(problem, the_chip)
    cfg = space.validate(space.parse_config(dict(config) if isinstance(config, Mapping) else config))
    logical = _inputs_for(fam, problem, given, seed, shape_given=shape is not None)
    kernel = render(fam, cfg, problem.dtype, INTERPRETER_TARGET)
    geo = geometry(space, cfg)
    result = CpuBackend(mode=mode, timeout=timeout).run(
        kernel, geo, kernel_inputs(problem, logical, geo), problem.dtype, chip=the_chip,
        lines=template_lines(fam, cfg, problem.dtype, INTERPRETER_TARGET))
    return VariantRun(fam.name, cfg, tuple(problem.shape), problem.dtype, logical,
                      {t.name: out for t, out in zip(fam.outputs, result.outputs)}, dict(fam.param_values),
                      list(result.diagnostics))


def _implied_shape(fam: Family, given: dict[str, Any]) -> tuple[int, ...] | None:
    """The problem shape the given inputs imply (inputs shaped by plain dimension names), or None."""
    dims = _carried(fam, given)
    return tuple(dims[d] for d in fam.dims) if set(dims) == set(fam.dims) else None


def _inputs_for(fam: Family, problem: Problem, given: dict[str, Any], seed: int,
                shape_given: bool) -> dict[str, np.ndarray]:
    """:func:`_logical_inputs`; where the given inputs do not fit a default shape taken for a dimension none of
    them carries, the error says to pass the shape too."""
    try:
        return _logical_inputs(problem, given, seed)
    except KernsearchError as exc:
        missing = [d for d in fam.dims if d not in _carried(fam, given)]
        if not shape_given and given and missing:  # the default shape was taken for a dim no input carries
            raise KernsearchError(f"{exc}; no input given carries {', '.join(missing)}: pass shape=("
                                  f"{', '.join(fam.dims)}) too (the default shape {problem.shape_text} was taken)"
                                  ) from None
        raise


def _carried(fam: Family, given: dict[str, Any]) -> dict[str, int]:
    """The dimensions the given inputs carry (by plain dimension names in their shapes), with their sizes."""
    from jinja2 import nodes

    dims: dict[str, int] = {}
    for t in fam.inputs:
        node = t.shape.node
        if t.name not in given or not isinstance(node, nodes.List):
            continue
        actual = np.shape(given[t.name])
        if len(actual) != len(node.items):
            raise KernsearchError(f"{fam.name}: input {t.name} has {len(actual)} dimension(s), the spec says "
                                  f"{t.shape.text}")
        for item, size in zip(node.items, actual):
            if isinstance(item, nodes.Name) and item.name in fam.dims:
                dims.setdefault(item.name, int(size))
    return dims


def _logical_inputs(problem: Problem, given: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """Every input: the caller's (checked for shape, converted to its dtype as MLX would), else drawn (all are
    drawn, so the seed's stream is the same whichever the caller gives)."""
    from ..evaluation._verify import make_inputs, round_to_dtype

    out = make_inputs(problem, seed)
    for t in problem.family.inputs:
        if t.name not in given:
            continue
        shape, dtype = out[t.name].shape, t.resolved_dtype(problem.dtype)
        value = np.asarray(given[t.name])
        if value.shape != shape:
            raise KernsearchError(f"{problem.family.name}: input {t.name} has shape {value.shape}; at "
                                  f"{problem.shape_text} the spec says {t.shape.text} = {shape}")
        if dtype in ("uint32", "int32"):
            out[t.name] = value.astype(dtype)
        else:
            out[t.name] = round_to_dtype(value.astype(np.float64), dtype)
    return out

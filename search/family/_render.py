"""Rendering: a config becomes exactly what ``mx.fast.metal_kernel`` / ``mx.fast.cuda_kernel`` take.

The rendered source depends on the config (and dtype) only: problem sizes reach the kernel at run time
(``A_shape`` ...), so one rendering serves every shape. The launch geometry depends on the shape and is
computed separately by :func:`geometry`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from jinja2 import Template, TemplateError

from .._errors import KernsearchError
from .._options import MAX_GRID, MAX_SHARED_MEMORY, MAX_THREADGROUP, geometry_ints
from .._rules import DEFAULT_TARGET, source_sha256
from ._expr import BUILTINS, ExprError
from ._space import Config, Space, format_config
from ._spec import Family, template_env
from ._template import TemplateLimit, TemplateSandbox, bounded_join, render_deadline


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


@dataclass(frozen=True)
class KernelSource:
    """The arguments of ``mx.fast.metal_kernel`` (or ``cuda_kernel``) for one variant."""

    name: str
    target: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    header: str
    source: str
    #: MLX template arguments, e.g. ``(("T", "float16"),)``; dtypes are named by their MLX name.
    template: tuple[tuple[str, Any], ...] = ()
    #: The family's ``launch.persistent``: the interpreter holds every threadgroup resident at once.
    persistent: bool = False

    @property
    def sha256(self) -> str:
        """Hash of everything the back-end compiles (the source hash artifacts and exports check)."""
        return source_sha256(self.header, self.source, self.template, self.input_names, self.output_names)


@dataclass(frozen=True)
class Geometry:
    """How to launch a variant on one problem: grid in threads, threadgroup size, outputs."""

    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]
    #: Inputs the kernel takes transposed (contiguous), by name.
    transposed_inputs: tuple[str, ...] = ()
    shared_memory: int = 0
    #: The dtype of each kernel input (tensor inputs, then scalar parameters); empty: all the problem dtype.
    input_dtypes: tuple[str, ...] = ()
    #: The outputs must start zero-filled (the kernel accumulates into them): launched with init_value 0.
    zero_outputs: bool = False

    def input_dtype(self, index: int, dtype: str) -> str:
        """Kernel input ``index``'s dtype in a problem of dtype ``dtype``."""
        return self.input_dtypes[index] if index < len(self.input_dtypes) else dtype

    @property
    def init_value(self) -> float | None:
        """What the outputs must hold before a timed launch (``None``: anything)."""
        return 0.0 if self.zero_outputs else None


@lru_cache(maxsize=64)
def _template(folder: Path, filename: str) -> Template:
    return template_env(folder).get_template(filename)


def param_literals(family: Family) -> dict[str, str]:
    """The family's parameters as C literals (``PARAMS.eps`` in a template: ``1.000000000e-05f``).

    A kernel that reads a parameter from its 1-element input array reads it, on MLX's CUDA back-end, from host
    memory (arrays of at most 8 bytes live in a managed pool the GPU reaches over the bus): every thread's read is a
    round trip over it (measured on an H200: +18 µs in a 30 µs kernel). The values are the spec's, as the arrays
    are, so a template may compile them in instead. Formatted here from validated numbers: no text of the spec
    reaches the code."""
    out = {}
    for name, p in family.params.items():
        if p.dtype == "float32":
            out[name] = f"{float(np.float32(p.value)):.9e}f"
        else:
            out[name] = f"{int(p.value)}{'u' if p.dtype == 'uint32' else ''}"
    return out


def render_context(family: Family, config: Config, dtype: str) -> dict[str, Any]:
    """The names a template sees: the config, knob-only derived values, ``family``, ``dtype`` and ``PARAMS`` (the
    parameters as literals)."""
    ctx: dict[str, Any] = {"family": family.name, "dtype": dtype, "PARAMS": param_literals(family), **config}
    for name in family.static_derived:
        try:
            ctx[name] = family.derived[name](ctx | BUILTINS)
        except ExprError as exc:
            raise KernsearchError(f"{family.path}/family.toml: derived.{name}: {exc}") from None
    return ctx


def render_blocks(tmpl: Template, ctx: dict[str, Any]) -> tuple[str, str]:
    """The raw ``header`` and ``source`` blocks of ``tmpl``.

    The template's top level runs first so its macros, ``{% set %}`` names and imports (``{% import
    "_lib/qmatvec.metal.j2" as core with context %}``) exist inside the blocks.
    """
    with render_deadline():
        top = tmpl.new_context(ctx)
        bounded_join(tmpl.root_render_func(top))
        scope = {k: v for k, v in top.vars.items() if not k.startswith("_")}
        return (bounded_join(tmpl.blocks["header"](tmpl.new_context(ctx, locals=scope))),
                bounded_join(tmpl.blocks["source"](tmpl.new_context(ctx, locals=scope))))


def render(family: Family, config: Config, dtype: str, target: str = DEFAULT_TARGET, *,
           sandbox: TemplateSandbox | None = None) -> KernelSource:
    """Render one variant. Knob-only derived values are available to the template.

    ``sandbox``: a fresh environment of the family's folder to render in (its loader then lists every template
    the render read: what a publish keeps in the store); default: a cached one."""
    if target not in family.templates:
        raise KernsearchError(f"family {family.name} has no {target} template")
    ctx = render_context(family, config, dtype)
    try:
        tmpl = (sandbox.get_template(family.templates[target]) if sandbox is not None
                else _template(family.path, family.templates[target]))
        header, source = render_blocks(tmpl, ctx)
    except (TemplateError, TemplateLimit, ExprError, TypeError, ValueError, ArithmeticError) as exc:
        raise KernsearchError(f"{family.template_path(target)}: cannot render {format_config(config)}: "
                              f"{_one_line(exc)}") from None
    except RecursionError:
        raise KernsearchError(f"{family.template_path(target)}: cannot render {format_config(config)}: "
                              "recursion too deep") from None
    header, source = header.strip("\n") + "\n", source.rstrip() + "\n"
    digest = source_sha256(header, source)[:12]
    return KernelSource(
        name=f"kernsearch_{family.name}_{digest}",
        target=target,
        input_names=family.kernel_input_names,
        output_names=tuple(t.name for t in family.outputs),
        header=header,
        source=source,
        template=(("T", dtype),),
        persistent=family.launch.persistent,
    )


def geometry(space: Space, config: Config) -> Geometry:
    """Launch geometry and output shapes of ``config`` on the space's problem."""
    fam = space.family
    ctx = space.context(config)

    def ints(expr: Any, where: str, n: int | None = 3, low: int = 1, high: int = MAX_GRID) -> tuple[int, ...]:
        value = space._eval(expr, ctx, where)
        try:
            return geometry_ints(value, where, n, low, high)
        except ValueError as exc:
            raise KernsearchError(f"{fam.path}/family.toml: {exc}") from None

    transposed = tuple(t.name for t in fam.inputs
                       if t.transposed is not None and space._eval(t.transposed, ctx, f"{t.name}.transposed"))
    shared = 0
    if fam.launch.shared_memory is not None:
        try:
            shared = geometry_ints([space._eval(fam.launch.shared_memory, ctx, "launch.shared_memory")],
                                   "launch.shared_memory", 1, 0, MAX_SHARED_MEMORY)[0]
        except ValueError as exc:
            raise KernsearchError(f"{fam.path}/family.toml: {exc}") from None
    return Geometry(
        grid=ints(fam.launch.grid, "launch.grid"),  # type: ignore[arg-type]
        threadgroup=ints(fam.launch.threadgroup, "launch.threadgroup", 3, 1, MAX_THREADGROUP),  # type: ignore[arg-type]
        output_shapes=tuple(ints(t.shape, f"outputs.{t.name}.shape", None, 1, MAX_GRID) for t in fam.outputs),
        output_dtypes=fam.output_dtypes(space.problem.dtype),
        transposed_inputs=transposed,
        shared_memory=shared,
        # Recorded only where some input is not of the problem dtype (manifests of such families stay as they were).
        input_dtypes=(fam.kernel_input_dtypes(space.problem.dtype)
                      if fam.params or any(t.dtype != "T" for t in fam.inputs) else ()),
        zero_outputs=fam.launch.zero_outputs is not None
        and bool(space._eval(fam.launch.zero_outputs, ctx, "launch.zero_outputs")),
    )

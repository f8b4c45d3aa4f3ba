"""Kernel-family specs: the declarative ``family.toml`` beside each family's templates.

A family folder holds ``family.toml`` and one Jinja template per target (``metal``, ``cuda``). The spec
declares the problem (dimensions, dtypes, FLOP and byte counts), the kernel's inputs and outputs, the
knobs and their domains, derived values, constraints, launch geometry, the untuned default config, the
NumPy reference, the MLX baseline op and tolerances. Everything is validated on load; every error names
the file and the field. Expressions are compiled in Jinja's sandbox (see ``_expr``).
"""

from __future__ import annotations

import os
import re
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
from jinja2 import TemplateNotFound, TemplateSyntaxError, nodes
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from .. import _safeio
from .._errors import SpecError
from .._vocabulary import CONSUMER_MODES, ConsumerModeName, Dtype
from ..hardware._targets import TargetName
from ._expr import ARRAY_ATTRIBUTES, BUILTINS, Expr, ExprError
from ._extends import extended
from ._template import TEMPLATE_LIMIT, TemplateSandbox
from ._vocab import ARRAY_FUNCTIONS, MLX_NAMES

SPEC_FILE = "family.toml"
#: Problem dtypes (``T``): a family's kernels are rendered and tuned per problem dtype.
DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}
#: Dtypes an input, output or scalar parameter may declare besides ``T`` (the problem dtype).
TENSOR_DTYPES = {**DTYPES, "uint32": 4, "int32": 4}
TensorDtype = Literal["T", "float32", "float16", "bfloat16", "uint32", "int32"]
#: Names every geometry/constraint expression may read besides knobs, dimensions and derived values.
CONTEXT_NAMES = frozenset({"chip", "dtype", "dtype_size"}) | frozenset(BUILTINS)
__all__ = ["ARRAY_FUNCTIONS", "DTYPES", "Family", "load_family", "parse_family"]
#: Names the performance model supplies to ``[model]`` expressions (threadgroups resident at once, chip-wide).
MODEL_NAMES = frozenset({"concurrent"})
KnobValue = bool | int | str
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
#: Family names (they become folder names, package functions and kernel names).
NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,47}")
KnobKind = Literal["tile", "vector", "buffering", "layout", "threadgroup_memory", "threadgroup_size",
                   "inner_product", "other"]


def _expr(value: Any) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"expected an expression string, got {type(value).__name__}")
    try:
        return Expr(str(value))
    except ExprError as exc:
        raise ValueError(str(exc)) from None


class PerOutput(Expr):
    """A ``reference`` or ``baseline`` given one expression per output (a TOML table by output name, or a
    list by position): evaluated as the list literal of its items, in the order of ``[[outputs]]``."""

    __slots__ = ("items",)

    def __init__(self, items: list[str]) -> None:
        super().__init__("[" + ", ".join(items) + "]")
        self.items = tuple(items)


def value_count(expr: Expr) -> int:
    """How many values ``expr`` gives, read from its text: a list literal gives one per item, anything else
    one (a multi-output family therefore writes one expression per output)."""
    return len(expr.node.items) if isinstance(expr.node, (nodes.List, nodes.Tuple)) else 1


def _by_position(value: dict[Any, Any], outputs: list[str] | None) -> list[Any]:
    """A table of expressions by output name as the list by position: exactly the outputs' names, in their order
    (without the names known, the table's own order)."""
    if outputs is None:
        return list(value.values())
    missing = [n for n in outputs if n not in value]
    unknown = [str(k)[:40] for k in value if k not in outputs]
    if missing or unknown:
        raise ValueError("one expression per output, by name: " + "; ".join(
            ([f"no value for output(s) {', '.join(missing)}"] if missing else [])
            + ([f"{', '.join(unknown)} is not an output (outputs: {', '.join(outputs)})"] if unknown
               else [])))
    return [value[n] for n in outputs]


def per_output(value: Any, outputs: list[str] | None) -> Expr:
    """``reference`` / ``baseline`` as one expression: a string as it is; a list of strings (by position) or
    a table of strings by output name (ordered as ``outputs``) as the list literal of its items."""
    if isinstance(value, (str, Expr, int, float)) and not isinstance(value, bool):
        return _expr(value)
    if isinstance(value, dict):
        value = _by_position(value, outputs)
    if not isinstance(value, list) or not value:
        raise ValueError("expected an expression string, a list of them (one per output) or a table by output name")
    texts = []
    for i, item in enumerate(value):
        try:
            single = _expr(item)
        except ValueError as exc:
            raise ValueError(f"value {i + 1}: {exc}") from None
        if value_count(single) != 1:
            raise ValueError(f"value {i + 1}: {single.text[:80]!r} is a list, not one output's value")
        texts.append(single.text)
    try:
        return PerOutput(texts)
    except ExprError as exc:
        raise ValueError(str(exc)) from None


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class Knob(_Model):
    """One tunable parameter and its domain."""

    kind: KnobKind
    values: list[KnobValue] = Field(min_length=1)
    help: str = ""

    @field_validator("values")
    @classmethod
    def _homogeneous(cls, values: list[KnobValue]) -> list[KnobValue]:
        if len({type(v) for v in values}) != 1:
            raise ValueError("values must all have one type")
        if len(set(values)) != len(values):
            raise ValueError("values must be distinct")
        return values

    def parse(self, text: str) -> KnobValue:
        """A value typed like the domain, from command-line text."""
        kind = type(self.values[0])
        if kind is bool:
            lowered = text.strip().lower()
            if lowered in ("1", "true", "on", "yes"):
                return True
            if lowered in ("0", "false", "off", "no"):
                return False
            raise ValueError(f"{text!r} is not a boolean")
        return kind(text.strip())


class Tensor(_Model):
    """A kernel output (and the base of an input); ``shape`` is an expression of the problem dimensions.

    ``dtype`` is ``T`` (the problem dtype, default) or a fixed dtype (``float32``, ``uint32``...)."""

    name: str
    shape: Expr
    dtype: TensorDtype = "T"
    #: An output that is the kernel's working memory (``mlp_block``'s intermediates and counters), not a value its
    #: consumer reads: verified like any output, but the op the kernel is judged against computes only the others.
    scratch: bool = False
    _check_shape = field_validator("shape", mode="before")(lambda v: _expr(v))

    @field_validator("name")
    @classmethod
    def _ident(cls, name: str) -> str:
        if not _IDENT.fullmatch(name):
            raise ValueError(f"{name!r} is not an identifier")
        return name

    def resolved_dtype(self, dtype: str) -> str:
        """This tensor's dtype in a problem of dtype ``dtype``."""
        return dtype if self.dtype == "T" else self.dtype


class Distribution(_Model):
    """How verification and timing draw an input's values (always exact in the input's dtype).

    ``uniform`` in [low, high] (default [-1, 1]); ``positive``: uniform in [low, high] with 0 < low
    (default [0.5, 1.5]: scales, variances); ``integer``: whole numbers in [low, high] (indices, quantized
    values); ``packed``: uint32 words of ``bits``-wide unsigned fields, every field uniform (quantized
    weights as MLX packs them: low bits first).
    """

    kind: Literal["uniform", "positive", "integer", "packed"] = "uniform"
    low: float | None = None
    high: float | None = None
    bits: Literal[2, 4, 8] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Distribution:
        if self.kind == "packed":
            if self.bits is None or self.low is not None or self.high is not None:
                raise ValueError("a packed distribution takes bits (2, 4 or 8) and no low/high")
            return self
        if self.bits is not None:
            raise ValueError("bits is for packed distributions")
        low, high = self.bounds()
        if self.kind == "integer" and self._not_whole_32bit(low, high):
            raise ValueError("an integer distribution needs whole low and high (32-bit)")
        if not (low < high) or abs(low) > 1e30 or abs(high) > 1e30:
            raise ValueError(f"need low < high (finite), got [{low}, {high}]")
        if self.kind == "positive" and low <= 0:
            raise ValueError("a positive distribution needs low > 0")
        return self

    def _not_whole_32bit(self, low: float, high: float) -> bool:
        """An integer distribution's ``low``/``high`` missing, fractional or beyond 32 bits (its values are cast)."""
        return (self.low is None or self.high is None or abs(low) > 2**31 or abs(high) > 2**32 or low != int(low)
                or high != int(high))

    def bounds(self) -> tuple[float, float]:
        default = {"uniform": (-1.0, 1.0), "positive": (0.5, 1.5), "integer": (0.0, 0.0), "packed": (0.0, 0.0)}
        d_low, d_high = default[self.kind]
        return (d_low if self.low is None else self.low, d_high if self.high is None else self.high)




class Input(Tensor):
    """A kernel input: a tensor with a value distribution, possibly taken transposed by some variants.

    ``weight``: the consumer passes the same array across many calls (a model's weights): the final round times
    calls on rotating sets of it larger than the last-level cache (cold, as in a model with many layers), and
    the exported function offers ``.bind(weights...)``."""

    transposed: Expr | None = None
    weight: bool = False
    distribution: Distribution = Distribution()
    _check_transposed = field_validator("transposed", mode="before")(lambda v: v if v is None else _expr(v))

    @field_validator("distribution", mode="before")
    @classmethod
    def _short(cls, value: Any) -> Any:
        return {"kind": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _fits_dtype(self) -> Input:
        if self.scratch:
            raise ValueError("scratch is for outputs (working memory the kernel writes), not inputs")
        kind, integer = self.distribution.kind, self.dtype in ("uint32", "int32")
        if kind == "packed" and self.dtype != "uint32":
            raise ValueError("a packed distribution needs dtype = \"uint32\"")
        if integer and kind not in ("integer", "packed"):
            raise ValueError(f"an input of dtype {self.dtype} needs an integer or packed distribution")
        if kind == "integer" and self.dtype == "uint32" and self.distribution.bounds()[0] < 0:
            raise ValueError("a uint32 input cannot hold negative integers")
        return self


class Param(_Model):
    """A scalar the kernel takes (``eps``), passed as a 1-element input after the tensor inputs.

    In a spec: ``eps = 1e-5`` (a float32), or ``eps = { value = 3, dtype = "int32" }``. References,
    baselines and tolerances read it by name."""

    value: float | int
    dtype: Literal["float32", "int32", "uint32"] = "float32"

    @model_validator(mode="before")
    @classmethod
    def _short(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("a parameter is a number, not a boolean")
        if isinstance(value, (int, float)):
            return {"value": value, "dtype": "int32" if isinstance(value, int) else "float32"}
        return value

    @model_validator(mode="after")
    def _fits(self) -> Param:
        if isinstance(self.value, bool) or not np.isfinite(self.value):
            raise ValueError(f"value {self.value!r} is not a finite number")
        if self.dtype != "float32":
            if self.value != int(self.value):
                raise ValueError(f"{self.dtype} parameter with a fractional value {self.value}")
            low, high = (0, 2**32 - 1) if self.dtype == "uint32" else (-2**31, 2**31 - 1)
            if not low <= self.value <= high:
                raise ValueError(f"value {self.value} does not fit {self.dtype}")
        elif abs(self.value) > 3.4e38:
            raise ValueError(f"value {self.value} does not fit float32")
        return self

    @property
    def number(self) -> float | int:
        """The value as the kernel sees it (rounded to float32, or an integer)."""
        if self.dtype == "float32":
            return float(np.float32(self.value))
        return int(self.value)


class Constraint(_Model):
    """A rule every valid config obeys; ``why`` is shown when it is violated."""

    name: str
    expr: Expr
    why: str = ""
    _check = field_validator("expr", mode="before")(lambda v: _expr(v))


class ProblemSpec(_Model):
    dims: list[str] = Field(min_length=1)
    default_shape: list[int]
    dtypes: list[Dtype] = Field(min_length=1)
    default_dtype: Dtype
    flops: Expr
    bytes: Expr
    #: The small problem the interpreter verifies a tuned one on, as a list of sizes computed from the tuned
    #: problem's (default: every size cut to 96). For a family whose sizes depend on each other (a quantized
    #: matrix's words and groups follow K), where cutting each size alone makes no valid problem.
    verify_shape: Expr | None = None
    #: A problem near a given one whose sizes are off the tiles, computed from the given one's (default: every
    #: size cut by the same few units, the first cut that gives a valid problem).
    ragged_shape: Expr | None = None
    _check = field_validator("flops", "bytes", mode="before")(lambda v: _expr(v))
    _check_shapes = field_validator("verify_shape", "ragged_shape", mode="before")(
        lambda v: v if v is None else _expr(v))

    @model_validator(mode="after")
    def _consistent(self) -> ProblemSpec:
        for d in self.dims:
            if not _IDENT.fullmatch(d):
                raise ValueError(f"dimension {d!r} is not an identifier")
        if len(self.default_shape) != len(self.dims) or any(s <= 0 for s in self.default_shape):
            raise ValueError(f"default_shape must give {len(self.dims)} positive sizes")
        if self.default_dtype not in self.dtypes:
            raise ValueError(f"default_dtype {self.default_dtype!r} is not among dtypes")
        return self


class Launch(_Model):
    """Grid in threads (as ``mx.fast.metal_kernel`` counts it) and threadgroup size."""

    grid: Expr
    threadgroup: Expr
    shared_memory: Expr | None = None
    #: True where the kernel accumulates into its outputs (e.g. split-K adds partial sums atomically): the
    #: outputs must start zero-filled, so verification and timing launch with ``init_value = 0``.
    zero_outputs: Expr | None = None
    #: True for a persistent kernel, whose threadgroups wait for each other's work through device atomics: the
    #: interpreter then holds every threadgroup resident at once and switches at atomics (ks_pool), as the GPU runs
    #: its resident threadgroups side by side (one after another, a waiting threadgroup would wait forever).
    persistent: bool = False
    _check = field_validator("grid", "threadgroup", "shared_memory", "zero_outputs", mode="before")(
        lambda v: v if v is None else _expr(v))


class Tolerance(_Model):
    """Element-wise ``|out - ref| <= atol + rtol * |ref|``; either may be an expression of dimensions."""

    rtol: Expr
    atol: Expr
    _check = field_validator("rtol", "atol", mode="before")(lambda v: _expr(v))


class Family(_Model):
    """A validated kernel family."""

    name: str
    description: str = Field(max_length=2000)
    problem: ProblemSpec
    inputs: list[Input] = Field(min_length=1)
    outputs: list[Tensor] = Field(min_length=1)
    #: Scalars the kernel takes as 1-element inputs after ``inputs`` (``eps``), by name.
    params: dict[str, Param] = Field(default_factory=dict)
    reference: Expr
    #: The MLX op a kernel must beat, over the vocabulary of :mod:`kernsearch.family._vocab` (``rms_norm(x, w, eps)``).
    baseline: Expr
    #: Time the baseline as one ``mx.compile``d function (a composition MLX fuses, e.g. ``silu(a) * b``).
    compile_baseline: bool = False
    templates: dict[TargetName, str] = Field(min_length=1)
    knobs: dict[str, Knob] = Field(min_length=1)
    derived: dict[str, Expr] = Field(default_factory=dict)
    #: Inputs of the performance model (``search/backends/_model.py``, ``docs/model.md``); optional.
    model: dict[str, Expr] = Field(default_factory=dict)
    constraints: list[Constraint] = Field(default_factory=list)
    launch: Launch
    default: dict[str, KnobValue]
    tolerance: dict[Dtype, Tolerance]
    #: Whether the exported package may run a kernel tuned on one chip on another of the same generation
    #: (only when it beat the op on its own chip by the margin). Off unless the family says so.
    transfer: bool = False
    #: The consumer modes a measured kernel must beat the op in to be dispatched (docs/timing.md): ``graph`` (a
    #: chain of dependent calls) and ``eager`` by default; decode families say ``["graph"]``; ``batch``
    #: (independent calls in one evaluation) only where consumers call the family side by side. The first ranks
    #: the search and the final round; graph and eager are always timed and recorded, ``batch`` where declared.
    consumer_modes: list[ConsumerModeName] = Field(default_factory=lambda: list(CONSUMER_MODES), min_length=1)
    #: The chain's link (docs/timing.md): the inputs a ``graph``-mode chain feeds from the previous call's first
    #: output, each by the cheapest derivation that keeps its shape, the same for every candidate and the op. A
    #: decode chains its residual stream: ``["R", "X"]`` for a family that adds a residual R (the next call's R is
    #: the previous output). Empty (the default): the first input that is not a weight.
    chain_link: list[str] = Field(default_factory=list, max_length=8)
    path: Path
    #: The spec files merged under this one through ``extends`` (``_extends``), nearest first.
    bases: list[Path] = Field(default_factory=list)

    @field_validator("reference", "baseline", mode="before")
    @classmethod
    def _per_output(cls, value: Any, info: ValidationInfo) -> Expr:
        outputs = info.data.get("outputs")
        return per_output(value, [t.name for t in outputs] if outputs is not None else None)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not NAME_RE.fullmatch(name):
            raise ValueError(f"{name[:80]!r} is not a family name (lower-case letters, digits and _, "
                             "starting with a letter, at most 48 characters)")
        return name

    @field_validator("templates")
    @classmethod
    def _template_files(cls, files: dict[str, str]) -> dict[str, str]:
        for target, filename in files.items():
            if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", filename) or ".." in filename:
                raise ValueError(f"{target}: {filename[:80]!r} is not a plain file name in the family folder")
        return files

    @field_validator("derived", "model", mode="before")
    @classmethod
    def _derived(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {k: _expr(v) for k, v in value.items()}

    @model_validator(mode="after")
    def _cross_check(self) -> Family:
        if all(t.scratch for t in self.outputs):
            raise ValueError("every output is scratch: the op the kernel is judged against would compute nothing")
        if any(t.scratch for t in self.outputs) and not isinstance(self.baseline, PerOutput):
            raise ValueError("a family with a scratch output gives its baseline per output (the judged op computes "
                             "only the others)")
        _check_names(self)
        return self

    @property
    def judged_baseline(self) -> Expr:
        """The baseline of the outputs a consumer reads (every output but the scratch ones)."""
        if not isinstance(self.baseline, PerOutput) or not any(t.scratch for t in self.outputs):
            return self.baseline
        kept = [item for item, t in zip(self.baseline.items, self.outputs) if not t.scratch]
        return Expr(kept[0]) if len(kept) == 1 else PerOutput(kept)

    # -- views ------------------------------------------------------------------------------------
    @property
    def baseline_name(self) -> str:
        """The baseline op as users know it (``mx.matmul``, ``mx.fast.rms_norm``), for verdicts and ``explain``;
        one per output, joined, when the baseline gives each output its own expression."""
        judged = self.judged_baseline
        items = judged.items if isinstance(judged, PerOutput) else (judged.text,)
        name = " and ".join(dict.fromkeys(_op_name(text) for text in items))
        return f"mx.compile({name})" if self.compile_baseline else name

    @property
    def chain_inputs(self) -> tuple[str, ...]:
        """The inputs a chain feeds from the previous call (``chain_link``, else the first that is not a weight)."""
        if self.chain_link:
            return tuple(self.chain_link)
        return (next((t.name for t in self.inputs if not t.weight), self.inputs[0].name),)

    @property
    def kernel_input_names(self) -> tuple[str, ...]:
        """What the kernel takes, in order: the tensor inputs, then the scalar parameters."""
        return tuple(t.name for t in self.inputs) + tuple(self.params)

    def kernel_input_dtypes(self, dtype: str) -> tuple[str, ...]:
        """The dtype of each kernel input (inputs, then parameters) in a problem of dtype ``dtype``."""
        return tuple(t.resolved_dtype(dtype) for t in self.inputs) + tuple(p.dtype for p in self.params.values())

    def output_dtypes(self, dtype: str) -> tuple[str, ...]:
        return tuple(t.resolved_dtype(dtype) for t in self.outputs)

    @property
    def param_values(self) -> dict[str, float | int]:
        """Each parameter's value as the kernel sees it (references and baselines read these)."""
        return {name: p.number for name, p in self.params.items()}

    @property
    def dims(self) -> list[str]:
        return self.problem.dims

    @cached_property
    def static_derived(self) -> list[str]:
        """Derived values that depend on knobs only (so templates may use them)."""
        static: list[str] = []
        for name, expr in self.derived.items():
            if expr.names <= set(self.knobs) | set(BUILTINS) | set(static):
                static.append(name)
        return static

    def template_path(self, target: str) -> Path:
        return self.path / self.templates[target]  # type: ignore[index]


def _op_name(text: str) -> str:
    m = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]{0,47})\s*\([^()]*\)\s*", text)
    if m:
        return MLX_NAMES.get(m.group(1), f"mx.{m.group(1)}")
    text = " ".join(text.split())
    return f"MLX {text[:60]}" + ("..." if len(text) > 60 else "")


def _value_counts(fam: Family) -> list[str]:
    """The reference and the baseline give one value per output, or each is an error naming the outputs."""
    outputs = [t.name for t in fam.outputs]
    return [f"{field}: {count} value(s) for {len(outputs)} output(s) ({', '.join(outputs)}): give one expression per "
            f"output, as a table by output name ([{field}] {' '.join(f'{n} = ...' for n in outputs[:3])}) or a list "
            "in their order"
            for field, expr in (("reference", fam.reference), ("baseline", fam.baseline))
            if (count := value_count(expr)) != len(outputs)]


def _check_names(fam: Family) -> None:
    """Every name an expression reads must exist where it is evaluated; every problem is reported at once."""
    errors = _identifier_errors(fam)
    names = _Names(errors)
    full = _space_names(fam, names)
    _model_names(fam, names, full)
    _problem_names(fam, names, full)
    errors += _param_errors(fam)
    arrays = {t.name for t in fam.inputs} | set(fam.problem.dims) | set(fam.params) | set(ARRAY_FUNCTIONS)
    vocabulary = _array_vocabulary(fam)
    names.require("reference", fam.reference, arrays, vocabulary)
    names.require("baseline", fam.baseline, arrays, vocabulary)
    errors += _value_counts(fam)
    errors.extend(_array_attribute_errors(fam))
    for dtype, tol in fam.tolerance.items():
        scalars = set(fam.problem.dims) | set(fam.params) | set(BUILTINS)
        names.require(f"tolerance.{dtype}.rtol", tol.rtol, scalars)
        names.require(f"tolerance.{dtype}.atol", tol.atol, scalars)
    errors += _default_errors(fam)
    errors += _chain_link_errors(fam)
    if errors:
        raise ValueError(_CROSS + _CROSS.join(errors))


class _Names:
    """Collects the errors of expressions that read names not defined where they are evaluated."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors

    def require(self, where: str, expr: Expr, allowed: set[str], vocabulary: str = "") -> None:
        """``vocabulary``: what the error lists as the names known there (the reference's functions)."""
        unknown = sorted(expr.names - allowed)
        if unknown:
            known = f" (known: {vocabulary})" if vocabulary else ""
            self.errors.append(f"{where}: unknown name(s) {', '.join(unknown)} in {expr.text!r}{known}")


#: What a function of the reference's vocabulary means where its name alone does not say it.
_MEANINGS = {"gelu": "gelu (the exact, erf form)"}


def _array_vocabulary(fam: Family) -> str:
    """The names a reference or baseline may read, as an unknown-name error lists them."""
    functions = ", ".join(_MEANINGS.get(name, name) for name in sorted(ARRAY_FUNCTIONS))
    own = [t.name for t in fam.inputs] + list(fam.problem.dims) + list(fam.params)
    return f"the functions {functions}; the inputs, dimensions and parameters {', '.join(own)}"


def _chain_link_errors(fam: Family) -> list[str]:
    """``chain_link`` names activations of this family, each once: a weight is the same array in every call of a
    model (rotated cold by the timing), never made by the call before."""
    inputs = {t.name: t for t in fam.inputs}
    errors = []
    for name in fam.chain_link:
        shown = repr(name[:48]) + ("..." if len(name) > 48 else "")
        if name not in inputs:
            errors.append(f"chain_link: {shown} is not an input of this family (inputs: {', '.join(inputs)})")
        elif inputs[name].weight:
            errors.append(f"chain_link: {shown} is a weight; a chain feeds activations (inputs that are not weights)")
    if len(set(fam.chain_link)) != len(fam.chain_link):
        errors.append("chain_link: an input is named twice")
    return errors


def _identifier_errors(fam: Family) -> list[str]:
    """Knob and derived names: identifiers, not reserved, derived values not shadowing knobs."""
    errors = []
    knobs, dims = set(fam.knobs), set(fam.problem.dims)
    for name in list(knobs) + list(fam.derived):
        if not _IDENT.fullmatch(name):
            errors.append(f"{name!r} is not an identifier")
        elif name in dims or name in CONTEXT_NAMES:
            errors.append(f"name {name!r} is reserved (a dimension or a built-in)")
    clash = knobs & set(fam.derived)
    if clash:
        errors.append(f"derived value(s) {sorted(clash)} shadow knobs")
    return errors


def _space_names(fam: Family, names: _Names) -> set[str]:
    """Derived values (each may read the ones before it), constraints and launch geometry; returns every name a
    config's context holds."""
    base = set(fam.knobs) | set(fam.problem.dims) | set(CONTEXT_NAMES)
    seen: set[str] = set()
    for name, expr in fam.derived.items():
        names.require(f"derived.{name}", expr, base | seen)
        seen.add(name)
    full = base | seen
    for i, c in enumerate(fam.constraints):
        names.require(f"constraints[{i}] ({c.name})", c.expr, full)
    for field in ("grid", "threadgroup", "shared_memory", "zero_outputs"):
        expr = getattr(fam.launch, field)
        if expr is not None:
            names.require(f"launch.{field}", expr, full)
    return full


def _model_names(fam: Family, names: _Names, full: set[str]) -> None:
    """The performance model's terms: new identifiers, each reading the context and the terms before it."""
    model_base = full | set(MODEL_NAMES)
    for name, expr in fam.model.items():
        if not _IDENT.fullmatch(name):
            names.errors.append(f"model.{name}: not an identifier")
            continue
        if name in full or name in MODEL_NAMES:
            names.errors.append(f"model.{name}: name is taken (a knob, dimension, derived value or built-in)")
        names.require(f"model.{name}", expr, model_base)
        model_base = model_base | {name}


def _problem_names(fam: Family, names: _Names, full: set[str]) -> None:
    """The problem's figures and shapes read dimensions only; a tensor's layout may read the config's context."""
    dims = set(fam.problem.dims) | set(CONTEXT_NAMES)
    names.require("problem.flops", fam.problem.flops, dims)
    names.require("problem.bytes", fam.problem.bytes, dims)
    for field in ("verify_shape", "ragged_shape"):
        expr = getattr(fam.problem, field)
        if expr is not None:
            names.require(f"problem.{field}", expr, dims - {"chip"})
    for kind, tensors in (("inputs", fam.inputs), ("outputs", fam.outputs)):
        for i, t in enumerate(tensors):
            names.require(f"{kind}[{i}].shape", t.shape, dims)
            transposed = getattr(t, "transposed", None)
            if transposed is not None:
                names.require(f"{kind}[{i}].transposed", transposed, full)


def _param_errors(fam: Family) -> list[str]:
    """Tensor and parameter names distinct; parameters identifiers that take no other name."""
    errors = []
    all_names = [t.name for t in fam.inputs + fam.outputs] + list(fam.params)
    if len(set(all_names)) != len(all_names):
        errors.append("input, output and parameter names must be distinct")
    taken = set(fam.problem.dims) | set(fam.knobs) | set(fam.derived) | set(CONTEXT_NAMES) | set(ARRAY_FUNCTIONS)
    for name in fam.params:
        if not _IDENT.fullmatch(name):
            errors.append(f"params.{name[:40]!r}: not an identifier")
        elif name in taken:
            errors.append(f"params.{name}: name is taken (a dimension, knob, derived value or built-in)")
    return errors


def _default_errors(fam: Family) -> list[str]:
    """A tolerance for every dtype; the default config names every knob once, each in its domain."""
    errors = []
    missing_tol = [d for d in fam.problem.dtypes if d not in fam.tolerance]
    if missing_tol:
        errors.append(f"tolerance: no entry for dtype(s) {missing_tol}")
    knobs = set(fam.knobs)
    extra, missing = sorted(set(fam.default) - knobs), sorted(knobs - set(fam.default))
    if extra:
        errors.append(f"default: unknown knob(s) {extra}")
    if missing:
        errors.append(f"default: missing knob(s) {missing}")
    for knob, value in fam.default.items():
        if knob in fam.knobs and (value not in fam.knobs[knob].values
                                  or type(value) is not type(fam.knobs[knob].values[0])):
            errors.append(f"default.{knob}: {value!r} is not in its domain {fam.knobs[knob].values}")
    return errors


def _array_attribute_errors(fam: Family) -> list[str]:
    """Attributes the reference and baseline read that arrays do not offer (``A.T.T.T.ctypes``): caught at
    load, not when the expression first runs (after a search, or in an exported package)."""
    errors = []
    for where, expr in (("reference", fam.reference), ("baseline", fam.baseline)):
        odd = sorted({n.attr for n in expr.node.find_all(nodes.Getattr)} - ARRAY_ATTRIBUTES)
        if odd:
            errors.append(f"{where}: attribute(s) {', '.join(repr(a) for a in odd)} in {expr.text!r}: arrays offer "
                          f"only {', '.join('.' + a for a in sorted(ARRAY_ATTRIBUTES))}")
    return errors


#: Separates the cross-field errors of one spec inside a single ValueError (split again by parse_family).
_CROSS = "\x1f"


# -- loading -----------------------------------------------------------------------------------------

def builtin_families_dir() -> Path:
    return Path(str(resources.files("kernsearch.templates")))


def builtin_family_names() -> list[str]:
    root = builtin_families_dir()
    return sorted(p.name for p in root.iterdir() if (p / SPEC_FILE).is_file())


def load_family(name_or_path: str | Path) -> Family:
    """A built-in family by bare name (``gemm``), or a user's family folder by path (``./gemm``, ``/abs``).

    A bare name never reads the current directory: a folder called ``gemm`` here cannot shadow the
    built-in family; it is loaded only when given as a path.
    """
    text = str(name_or_path)
    if not text or "\x00" in text:
        raise SpecError("empty family name (give a built-in name or a path to a family folder)")
    if isinstance(name_or_path, Path) or "/" in text or text.startswith(".") or text.endswith(".toml"):
        path = Path(text)
        folder = path.parent if path.name == SPEC_FILE else path
        if not _safeio.is_regular(folder / SPEC_FILE):
            raise SpecError(f"{folder}: no {SPEC_FILE} file in this folder (not a kernel family)")
        return _load_folder(folder.resolve())
    if NAME_RE.fullmatch(text) and _safeio.is_regular(builtin_families_dir() / text / SPEC_FILE):
        return _load_folder(builtin_families_dir() / text)
    hint = ""
    if NAME_RE.fullmatch(text) and Path(text).is_dir():
        hint = f"; to use the folder {text!r} here, give it as a path: ./{text}"
    raise SpecError(f"unknown family {text[:80]!r} (built-in: {', '.join(builtin_family_names())}; "
                    f"a user's family is given as a path, e.g. ./myfamily){hint}")


def _load_folder(folder: Path) -> Family:
    spec_file = folder / SPEC_FILE
    try:
        data = _safeio.read_toml(spec_file)
    except _safeio.UnsafeFile as exc:
        raise SpecError(str(exc)) from None
    family = parse_family(data, spec_file)
    for target in family.templates:
        check_template(family, target)
    return family


def parse_family(data: Any, source: Path | str = "<spec>") -> Family:
    """Validate a spec mapping; every error names ``source`` and the offending field."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a family spec must be a table")
    folder = Path(source).parent if str(source) != "<spec>" else Path(".")
    own = folder if str(source) != "<spec>" else None
    data, bases = extended(data, source, lambda name: _base_spec(own, name),
                           lambda name: NAME_RE.fullmatch(name) is not None)
    try:
        return Family(**{**data, "path": folder, "bases": bases})
    except ValidationError as exc:
        problems: list[str] = []
        for err in exc.errors():
            message = str(err["msg"]).removeprefix("Value error, ")
            field = ".".join(str(p) for p in err["loc"])
            if message.startswith(_CROSS):  # every cross-field error, each named by its own field
                problems.extend(message.split(_CROSS)[1:])
            else:
                problems.append(f"{field or '(top level)'}: {message}")
        more = f" ({len(problems)} errors)" if len(problems) > 1 else ""
        raise SpecError(f"{source}{more}: " + "; ".join(p.replace("\n", " ") for p in problems)) from None
    except (TypeError, ValueError, ExprError) as exc:  # e.g. non-string keys from a hand-built mapping
        raise SpecError(f"{source}: {exc}") from None


#: A family folder's own copies of the specs it extends (a store's snapshot keeps them: ``_extends/NAME/family.toml``).
OWN_BASES = "_extends"


def _base_spec(folder: Path | None, name: str) -> tuple[dict[str, Any], Path]:
    """The spec ``extends = name`` reads: the folder's own copy when it has an ``_extends`` folder (a snapshot,
    as it was published), else the built-in family's."""
    own = folder / OWN_BASES if folder is not None else None
    if own is not None and os.path.lexists(own):
        path = own / name / SPEC_FILE
        if not (_safeio.is_real_dir(own) and _safeio.is_real_dir(own / name)):
            raise SpecError(f"{own.parent / SPEC_FILE}: extends: {path} is not in a plain folder (refused)")
    else:
        path = builtin_families_dir() / name / SPEC_FILE
        if not _safeio.is_regular(path):
            raise SpecError(f"{folder or '<spec>'}/{SPEC_FILE}: extends: unknown family {name!r} (built-in: "
                            f"{', '.join(builtin_family_names())})")
    try:
        return _safeio.read_toml(path), path
    except _safeio.UnsafeFile as exc:
        raise SpecError(f"extends: {exc}") from None


def template_env(folder: Path) -> TemplateSandbox:
    """The sandbox templates render in (``_template``): whitelisted filters/tests, no globals, bounded."""
    return TemplateSandbox(folder)


def check_template(family: Family, target: str) -> None:
    path = family.template_path(target)
    if not _safeio.is_regular(path):
        what = "no such file" if not path.exists() and not path.is_symlink() else "not a regular file (refused)"
        raise SpecError(f"{family.path / SPEC_FILE}: templates.{target}: {what}: {path.name}")
    try:
        tmpl = template_env(family.path).get_template(path.name)
    except TemplateSyntaxError as exc:
        raise SpecError(f"{path}:{exc.lineno}: template syntax error: {exc.message}") from None
    except RecursionError:
        raise SpecError(f"{path}: template nested too deeply") from None
    except TemplateNotFound:
        raise SpecError(f"{path}: cannot read the template (a link, special file or over "
                        f"{TEMPLATE_LIMIT} bytes)") from None
    missing = {"header", "source"} - set(tmpl.blocks)
    if missing:
        raise SpecError(f"{path}: template must define blocks 'header' and 'source' (missing {sorted(missing)})")

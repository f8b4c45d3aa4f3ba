"""The parts of a kernel-family spec (``family.toml``), as validated pydantic records: knobs, tensors and their value
distributions, scalar parameters, constraints, the problem, launch geometry and tolerances (the whole family is
``_spec.Family``). Every expression field is compiled in Jinja's sandbox (see ``_expr``).
"""

from __future__ import annotations

import re
from typing import Any, Literal

import numpy as np
from jinja2 import nodes
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .._vocabulary import Dtype
from ._expr import BUILTINS, Expr, ExprError

#: Problem dtypes (``T``): a family's kernels are rendered and tuned per problem dtype.
DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}
#: Dtypes an input, output or scalar parameter may declare besides ``T`` (the problem dtype).
TENSOR_DTYPES = {**DTYPES, "uint32": 4, "int32": 4}
TensorDtype = Literal["T", "float32", "float16", "bfloat16", "uint32", "int32"]
#: Names every geometry/constraint expression may read besides knobs, dimensions and derived values.
CONTEXT_NAMES = frozenset({"chip", "dtype", "dtype_size"}) | frozenset(BUILTINS)
#: Names the performance model supplies to ``[model]`` expressions (threadgroups resident at once, chip-wide).
MODEL_NAMES = frozenset({"concurrent"})
KnobValue = bool | int | str
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
#: Family names (they become folder names, package functions and kernel names).
NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,47}")
KnobKind = Literal["tile", "vector", "buffering", "layout", "threadgroup_memory", "threadgroup_size",
                   "inner_product", "other"]


def to_expr(value: Any) -> Expr:
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
        return to_expr(value)
    if isinstance(value, dict):
        value = _by_position(value, outputs)
    if not isinstance(value, list) or not value:
        raise ValueError("expected an expression string, a list of them (one per output) or a table by output name")
    texts = []
    for i, item in enumerate(value):
        try:
            single = to_expr(item)
        except ValueError as exc:
            raise ValueError(f"value {i + 1}: {exc}") from None
        if value_count(single) != 1:
            raise ValueError(f"value {i + 1}: {single.text[:80]!r} is a list, not one output's value")
        texts.append(single.text)
    try:
        return PerOutput(texts)
    except ExprError as exc:
        raise ValueError(str(exc)) from None


class SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class Knob(SpecModel):
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


class Tensor(SpecModel):
    """A kernel output (and the base of an input); ``shape`` is an expression of the problem dimensions.

    ``dtype`` is ``T`` (the problem dtype, default) or a fixed dtype (``float32``, ``uint32``...)."""

    name: str
    shape: Expr
    dtype: TensorDtype = "T"
    #: An output that is the kernel's working memory (``mlp_block``'s intermediates and counters), not a value its
    #: consumer reads: verified like any output, but the op the kernel is judged against computes only the others.
    scratch: bool = False
    _check_shape = field_validator("shape", mode="before")(lambda v: to_expr(v))

    @field_validator("name")
    @classmethod
    def _ident(cls, name: str) -> str:
        if not IDENT.fullmatch(name):
            raise ValueError(f"{name!r} is not an identifier")
        return name

    def resolved_dtype(self, dtype: str) -> str:
        """This tensor's dtype in a problem of dtype ``dtype``."""
        return dtype if self.dtype == "T" else self.dtype


class Distribution(SpecModel):
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
    _check_transposed = field_validator("transposed", mode="before")(lambda v: v if v is None else to_expr(v))

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


class Param(SpecModel):
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


class Constraint(SpecModel):
    """A rule every valid config obeys; ``why`` is shown when it is violated."""

    name: str
    expr: Expr
    why: str = ""
    _check = field_validator("expr", mode="before")(lambda v: to_expr(v))


class ProblemSpec(SpecModel):
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
    _check = field_validator("flops", "bytes", mode="before")(lambda v: to_expr(v))
    _check_shapes = field_validator("verify_shape", "ragged_shape", mode="before")(
        lambda v: v if v is None else to_expr(v))

    @model_validator(mode="after")
    def _consistent(self) -> ProblemSpec:
        for d in self.dims:
            if not IDENT.fullmatch(d):
                raise ValueError(f"dimension {d!r} is not an identifier")
        if len(self.default_shape) != len(self.dims) or any(s <= 0 for s in self.default_shape):
            raise ValueError(f"default_shape must give {len(self.dims)} positive sizes")
        if self.default_dtype not in self.dtypes:
            raise ValueError(f"default_dtype {self.default_dtype!r} is not among dtypes")
        return self


class Launch(SpecModel):
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
        lambda v: v if v is None else to_expr(v))


class Tolerance(SpecModel):
    """Element-wise ``|out - ref| <= atol + rtol * |ref|``; either may be an expression of dimensions."""

    rtol: Expr
    atol: Expr
    _check = field_validator("rtol", "atol", mode="before")(lambda v: to_expr(v))

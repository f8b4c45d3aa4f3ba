"""Kernel-family specs: the declarative ``family.toml`` beside each family's templates.

A family folder holds ``family.toml`` and one Jinja template per target (``metal``, ``cuda``). The spec
declares the problem (dimensions, dtypes, FLOP and byte counts), the kernel's inputs and outputs, the
knobs and their domains, derived values, constraints, launch geometry, the untuned default config, the
NumPy reference, the MLX baseline op and tolerances. Everything is validated on load; every error names
the file and the field. Expressions are compiled in Jinja's sandbox (see ``_expr``).
"""

from __future__ import annotations

import re
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from jinja2 import TemplateNotFound, TemplateSyntaxError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from . import _safeio
from ._errors import SpecError
from ._expr import BUILTINS, Expr, ExprError
from ._template import TEMPLATE_LIMIT, TemplateSandbox

SPEC_FILE = "family.toml"
TARGETS = ("metal", "cuda")
DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}
#: Array functions a reference (NumPy) or baseline (MLX) expression may call.
ARRAY_FUNCTIONS = ("matmul", "einsum", "transpose", "exp", "log", "sqrt", "tanh", "maximum", "minimum",
                   "sum", "max", "min", "mean", "where", "abs", "square", "reshape", "softmax")
#: Names every geometry/constraint expression may read besides knobs, dimensions and derived values.
CONTEXT_NAMES = frozenset({"chip", "dtype", "dtype_size"}) | frozenset(BUILTINS)
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
    """A kernel input or output; ``shape`` is an expression of the problem dimensions."""

    name: str
    shape: Expr
    transposed: Expr | None = None
    _check_shape = field_validator("shape", "transposed", mode="before")(lambda v: v if v is None else _expr(v))

    @field_validator("name")
    @classmethod
    def _ident(cls, name: str) -> str:
        if not _IDENT.fullmatch(name):
            raise ValueError(f"{name!r} is not an identifier")
        return name


class Constraint(_Model):
    """A rule every valid config obeys; ``why`` is shown when it is violated."""

    name: str
    expr: Expr
    why: str = ""
    _check = field_validator("expr", mode="before")(lambda v: _expr(v))


class ProblemSpec(_Model):
    dims: list[str] = Field(min_length=1)
    default_shape: list[int]
    dtypes: list[Literal["float32", "float16", "bfloat16"]] = Field(min_length=1)
    default_dtype: Literal["float32", "float16", "bfloat16"]
    flops: Expr
    bytes: Expr
    _check = field_validator("flops", "bytes", mode="before")(lambda v: _expr(v))

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
    _check = field_validator("grid", "threadgroup", "shared_memory", mode="before")(
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
    inputs: list[Tensor] = Field(min_length=1)
    outputs: list[Tensor] = Field(min_length=1)
    reference: Expr
    baseline: Expr
    templates: dict[Literal["metal", "cuda"], str] = Field(min_length=1)
    knobs: dict[str, Knob] = Field(min_length=1)
    derived: dict[str, Expr] = Field(default_factory=dict)
    #: Inputs of the performance model (``search/backends/_model.py``, ``docs/model.md``); optional.
    model: dict[str, Expr] = Field(default_factory=dict)
    constraints: list[Constraint] = Field(default_factory=list)
    launch: Launch
    default: dict[str, KnobValue]
    tolerance: dict[Literal["float32", "float16", "bfloat16"], Tolerance]
    #: Whether the exported package may run a kernel tuned on one chip on another of the same generation
    #: (only when it beat the op on its own chip by the margin). Off unless the family says so.
    transfer: bool = False
    path: Path
    _check = field_validator("reference", "baseline", mode="before")(lambda v: _expr(v))

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
        _check_names(self)
        return self

    # -- views ------------------------------------------------------------------------------------
    @property
    def baseline_name(self) -> str:
        """The baseline op as users know it (``mx.matmul``), for verdicts and ``explain``."""
        m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]{0,47})\s*\(", self.baseline.text)
        return f"mx.{m.group(1)}" if m else "the MLX op"

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


def _check_names(fam: Family) -> None:
    """Every name an expression reads must exist where it is evaluated."""
    knobs, dims = set(fam.knobs), set(fam.problem.dims)
    for name in list(knobs) + list(fam.derived):
        if not _IDENT.fullmatch(name):
            raise ValueError(f"{name!r} is not an identifier")
        if name in dims or name in CONTEXT_NAMES:
            raise ValueError(f"name {name!r} is reserved (a dimension or a built-in)")
    clash = knobs & set(fam.derived)
    if clash:
        raise ValueError(f"derived value(s) {sorted(clash)} shadow knobs")

    def require(where: str, expr: Expr, allowed: set[str]) -> None:
        unknown = sorted(expr.names - allowed)
        if unknown:
            raise ValueError(f"{where}: unknown name(s) {', '.join(unknown)} in {expr.text!r}")

    base = knobs | dims | set(CONTEXT_NAMES)
    seen: set[str] = set()
    for name, expr in fam.derived.items():
        require(f"derived.{name}", expr, base | seen)
        seen.add(name)
    full = base | seen
    for i, c in enumerate(fam.constraints):
        require(f"constraints[{i}] ({c.name})", c.expr, full)
    for field in ("grid", "threadgroup", "shared_memory"):
        expr = getattr(fam.launch, field)
        if expr is not None:
            require(f"launch.{field}", expr, full)
    model_base = full | set(MODEL_NAMES)
    for name, expr in fam.model.items():
        if not _IDENT.fullmatch(name):
            raise ValueError(f"model.{name}: not an identifier")
        if name in full or name in MODEL_NAMES:
            raise ValueError(f"model.{name}: name is taken (a knob, dimension, derived value or built-in)")
        require(f"model.{name}", expr, model_base)
        model_base = model_base | {name}
    require("problem.flops", fam.problem.flops, dims | set(CONTEXT_NAMES))
    require("problem.bytes", fam.problem.bytes, dims | set(CONTEXT_NAMES))
    for kind, tensors in (("inputs", fam.inputs), ("outputs", fam.outputs)):
        for i, t in enumerate(tensors):
            require(f"{kind}[{i}].shape", t.shape, dims | set(CONTEXT_NAMES))
            if t.transposed is not None:
                require(f"{kind}[{i}].transposed", t.transposed, full)
    names = [t.name for t in fam.inputs + fam.outputs]
    if len(set(names)) != len(names):
        raise ValueError("input and output names must be distinct")
    arrays = {t.name for t in fam.inputs} | dims | set(ARRAY_FUNCTIONS)
    require("reference", fam.reference, arrays)
    require("baseline", fam.baseline, arrays)
    for dtype, tol in fam.tolerance.items():
        require(f"tolerance.{dtype}.rtol", tol.rtol, dims | set(BUILTINS))
        require(f"tolerance.{dtype}.atol", tol.atol, dims | set(BUILTINS))
    missing_tol = [d for d in fam.problem.dtypes if d not in fam.tolerance]
    if missing_tol:
        raise ValueError(f"tolerance: no entry for dtype(s) {missing_tol}")
    if set(fam.default) != knobs:
        extra, missing = sorted(set(fam.default) - knobs), sorted(knobs - set(fam.default))
        raise ValueError(f"default: unknown knob(s) {extra}" if extra else f"default: missing knob(s) {missing}")
    for knob, value in fam.default.items():
        if value not in fam.knobs[knob].values or type(value) is not type(fam.knobs[knob].values[0]):
            raise ValueError(f"default.{knob}: {value!r} is not in its domain {fam.knobs[knob].values}")


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
    try:
        return Family(**{**data, "path": folder})
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        message = err["msg"].removeprefix("Value error, ")
        raise SpecError(f"{source}: {field}: {message}") from None
    except (TypeError, ValueError, ExprError) as exc:  # e.g. non-string keys from a hand-built mapping
        raise SpecError(f"{source}: {exc}") from None


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

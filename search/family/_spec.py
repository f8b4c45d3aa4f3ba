"""Kernel-family specs: the declarative ``family.toml`` beside each family's templates.

A family folder holds ``family.toml`` and one Jinja template per target (``metal``, ``cuda``). The spec
declares the problem (dimensions, dtypes, FLOP and byte counts), the kernel's inputs and outputs, the
knobs and their domains, derived values, constraints, launch geometry, the untuned default config, the
NumPy reference, the MLX baseline op and tolerances. Everything is validated on load; every error names
the file and the field. Expressions are compiled in Jinja's sandbox (see ``_expr``).

Here: the whole family (:class:`Family`) and its loading; its parts are records of ``_spec_models``, its
cross-field checks ``_spec_checks`` (every name is importable from here).
"""

from __future__ import annotations

import os
import re
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

from jinja2 import TemplateNotFound, TemplateSyntaxError
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from .. import _safeio
from .._errors import SpecError
from .._vocabulary import CONSUMER_MODES, ConsumerModeName, Dtype
from ..hardware._targets import TargetName
from ._expr import BUILTINS, Expr, ExprError
from ._extends import extended
from ._spec_checks import CROSS, check_names
from ._spec_models import (
    CONTEXT_NAMES,
    DTYPES,
    MODEL_NAMES,
    NAME_RE,
    TENSOR_DTYPES,
    Constraint,
    Distribution,
    Input,
    Knob,
    KnobKind,
    KnobValue,
    Launch,
    Param,
    PerOutput,
    ProblemSpec,
    SpecModel,
    Tensor,
    TensorDtype,
    Tolerance,
    per_output,
    to_expr,
    value_count,
)
from ._template import TEMPLATE_LIMIT, TemplateSandbox
from ._vocab import ARRAY_FUNCTIONS, MLX_NAMES

__all__ = [
    "ARRAY_FUNCTIONS", "CONTEXT_NAMES", "DTYPES", "MODEL_NAMES", "NAME_RE", "OWN_BASES", "SPEC_FILE", "TENSOR_DTYPES",
    "Constraint", "Distribution", "Family", "Input", "Knob", "KnobKind", "KnobValue", "Launch", "Param", "PerOutput",
    "ProblemSpec", "Tensor", "TensorDtype", "Tolerance", "builtin_families_dir", "builtin_family_names",
    "check_template", "load_family", "parse_family", "per_output", "template_env", "value_count",
]

SPEC_FILE = "family.toml"


class Family(SpecModel):
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
        return {k: to_expr(v) for k, v in value.items()}

    @model_validator(mode="after")
    def _cross_check(self) -> Family:
        if all(t.scratch for t in self.outputs):
            raise ValueError("every output is scratch: the op the kernel is judged against would compute nothing")
        if any(t.scratch for t in self.outputs) and not isinstance(self.baseline, PerOutput):
            raise ValueError("a family with a scratch output gives its baseline per output (the judged op computes "
                             "only the others)")
        check_names(self)
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
            if message.startswith(CROSS):  # every cross-field error, each named by its own field
                problems.extend(message.split(CROSS)[1:])
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

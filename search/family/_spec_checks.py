"""The cross-field checks of a kernel-family spec: every name an expression reads exists where it is evaluated, the
reference and baseline give one value per output, the default config and the chain link fit the family. Every
problem is reported at once (``CROSS`` separates them inside one error, split again by ``_spec.parse_family``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jinja2 import nodes

from ._expr import ARRAY_ATTRIBUTES, BUILTINS, Expr
from ._spec_models import CONTEXT_NAMES, IDENT, MODEL_NAMES, value_count
from ._vocab import ARRAY_FUNCTIONS

if TYPE_CHECKING:
    from ._spec import Family


def _value_counts(fam: Family) -> list[str]:
    """The reference and the baseline give one value per output, or each is an error naming the outputs."""
    outputs = [t.name for t in fam.outputs]
    return [f"{field}: {count} value(s) for {len(outputs)} output(s) ({', '.join(outputs)}): give one expression per "
            f"output, as a table by output name ([{field}] {' '.join(f'{n} = ...' for n in outputs[:3])}) or a list "
            "in their order"
            for field, expr in (("reference", fam.reference), ("baseline", fam.baseline))
            if (count := value_count(expr)) != len(outputs)]


def check_names(fam: Family) -> None:
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
        raise ValueError(CROSS + CROSS.join(errors))


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
        if not IDENT.fullmatch(name):
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
        if not IDENT.fullmatch(name):
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
        if not IDENT.fullmatch(name):
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
CROSS = "\x1f"

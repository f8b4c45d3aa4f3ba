"""The expression-tree evaluator, a shared rule (``_rules``): spec expressions as small JSON trees, evaluated by a
closed set of operators and functions (never Python's ``eval``). kernsearch parses a spec's expressions into these
trees and evaluates them here, bounded by its :class:`Guard` (``family/_expr.py``: hostile specs); the exported
package evaluates the trees of its dispatch table here too.

Standard library only, Python >= 3.9 (shipped verbatim in every exported package, beside ``_rules.py``).
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Dict, List, Optional, Set


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


#: Functions every spec expression may call (all total on numbers, none reaches the system).
FUNCTIONS: Dict[str, Callable[..., Any]] = {
    "ceil_div": ceil_div, "round_up": round_up, "is_pow2": is_pow2, "min": min, "max": max, "abs": abs,
    "int": int, "float": float, "len": len, "sqrt": math.sqrt, "log2": math.log2,
}
#: Keyword arguments a function may take (never ``out=``, which would write into an input).
KEYWORDS = frozenset({"axis", "axes", "keepdims", "group_size", "bits", "transpose"})
#: Attributes an expression may read from an array (NumPy or MLX): data, never methods.
ARRAY_ATTRIBUTES = frozenset({"T", "shape", "ndim", "dtype", "size"})
#: ``a ** b`` of integers is refused where the result would have more bits than this.
MAX_INT_BITS = 256
_CONSTANTS = (bool, int, float, str, type(None))

BINARY: Dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "//": operator.floordiv,
    "%": operator.mod, "**": operator.pow,
}
COMPARE: Dict[str, Callable[[Any, Any], Any]] = {
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "lteq": operator.le, "gt": operator.gt,
    "gteq": operator.ge, "in": lambda a, b: a in b, "notin": lambda a, b: a not in b,
}
UNARY: Dict[str, Callable[[Any], Any]] = {"not": operator.not_, "neg": operator.neg, "pos": operator.pos}


class ExpressionError(ValueError):
    """An expression could not be evaluated (a name is missing, an operator does not apply...)."""


class Guard:
    """Bounds on an evaluation, asked before and after the operations that could exhaust memory. This one bounds
    nothing: the exported package evaluates the trees of its own dispatch table. kernsearch's spec loader passes
    its own (``family/_expr.py``): a hostile spec's expression must never hang or exhaust memory."""

    def binary(self, op: str, left: Any, right: Any) -> None:
        """Before ``left op right`` (operands of a known kind, ``**`` of integers already bounded)."""

    def call(self, name: str, args: List[Any], kwargs: Dict[str, Any]) -> None:
        """Before calling the function ``name``."""

    def value(self, value: Any) -> Any:
        """A result (of an operator, a call, a subscript, ``~``), returned, or refused by raising."""
        return value


NO_GUARD = Guard()


def is_array(value: Any) -> bool:
    """A NumPy/MLX array or scalar (data with a shape and dtype), not a function."""
    kind = type(value)
    known = _ARRAY_TYPES.get(kind)
    if known is None:  # asked once per type: the exported op evaluates its expression on every call
        known = _ARRAY_TYPES[kind] = hasattr(kind, "shape") and hasattr(kind, "dtype") and not callable(value)
    return known


_ARRAY_TYPES: Dict[type, bool] = {}
#: The exact types of most operands, checked first (the isinstance checks after them admit the rest).
_OPERANDS = frozenset((int, float, bool, str, list, tuple))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float))


def evaluate(tree: Any, names: Dict[str, Any], functions: Optional[Dict[str, Callable[..., Any]]] = None,
             guard: Guard = NO_GUARD) -> Any:
    """Evaluate an expression tree: ``["const", v]``, ``["name", n]``, ``["bin", op, a, b]``, ... (:data:`NODES`).

    A call looks its function up in ``functions`` (default :data:`FUNCTIONS`), then among ``names``; a name that
    is a function must be called. ``guard`` bounds the evaluation (:class:`Guard`)."""
    return _Evaluation(names, FUNCTIONS if functions is None else functions, guard).of(tree)


class _Evaluation:
    """One evaluation's names, functions and guard; :meth:`of` evaluates a node by its kind (:data:`NODES`)."""

    __slots__ = ("names", "functions", "guard")

    def __init__(self, names: Dict[str, Any], functions: Dict[str, Callable[..., Any]], guard: Guard) -> None:
        self.names, self.functions, self.guard = names, functions, guard

    def of(self, tree: Any) -> Any:
        try:
            node = NODES[tree[0]]
        except (KeyError, TypeError, IndexError):
            raise ExpressionError(f"unknown expression node {str(tree)[:40]!r}") from None
        return node(self, tree)


def _const(e: _Evaluation, t: Any) -> Any:
    return t[1]


def _name(e: _Evaluation, t: Any) -> Any:
    if t[1] not in e.names:
        raise ExpressionError(f"unknown name {t[1]!r}")
    value = e.names[t[1]]
    if callable(value):
        raise ExpressionError(f"{t[1]!r} is a function; call it")
    return value


def _list(e: _Evaluation, t: Any) -> Any:
    return [e.of(item) for item in t[1]]


def _tuple(e: _Evaluation, t: Any) -> Any:
    return tuple(e.of(item) for item in t[1])


def _binary(e: _Evaluation, t: Any) -> Any:
    op, left, right = t[1], e.of(t[2]), e.of(t[3])
    if op == "**" and isinstance(left, int) and isinstance(right, int):
        _check_power(left, right)
    elif op == "%" and isinstance(left, str):
        raise ExpressionError("string formatting with % is not part of the expression language")
    for value in (left, right):
        _check_operand(value)
    if e.guard is NO_GUARD:  # the exported op's call: nothing to bound
        return BINARY[op](left, right)
    e.guard.binary(op, left, right)
    return e.guard.value(BINARY[op](left, right))


def _check_power(left: int, right: int) -> None:
    """An integer power is refused before it is computed where its result would be too large to hold."""
    if right > 0 and abs(left) > 1 and right * left.bit_length() > MAX_INT_BITS:
        raise ExpressionError(f"{left}**{right} is larger than 2**{MAX_INT_BITS}")
    if right < 0 and abs(right) > MAX_INT_BITS * 4:
        raise ExpressionError(f"exponent {right} is out of range")


def _check_operand(value: Any) -> None:
    if type(value) not in _OPERANDS and not (_number(value) or isinstance(value, (str, list, tuple))
                                             or is_array(value)):
        raise ExpressionError(f"cannot apply an operator to a {type(value).__name__}")


def _unary(e: _Evaluation, t: Any) -> Any:
    value = e.of(t[1])
    if t[0] != "not" and not (_number(value) or is_array(value)):
        raise ExpressionError(f"cannot negate a {type(value).__name__}")
    return UNARY[t[0]](value)


def _and(e: _Evaluation, t: Any) -> Any:
    return e.of(t[1]) and e.of(t[2])


def _or(e: _Evaluation, t: Any) -> Any:
    return e.of(t[1]) or e.of(t[2])


def _concat(e: _Evaluation, t: Any) -> Any:
    parts = [e.of(item) for item in t[1]]
    if not all(isinstance(p, (str, int, float, bool)) for p in parts):
        raise ExpressionError("~ joins numbers and strings only")
    return e.guard.value("".join(str(p) for p in parts))


def _compare(e: _Evaluation, t: Any) -> Any:
    """A chain ``a < b <= c``: false at the first comparison that fails (an array result is elementwise and
    does not stop the chain)."""
    left = e.of(t[1])
    result: Any = True
    for op, operand in t[2]:
        right = e.of(operand)
        result = COMPARE[op](left, right)
        if not is_array(result) and not result:
            return False
        left = right
    return result


def _if(e: _Evaluation, t: Any) -> Any:
    if e.of(t[1]):
        return e.of(t[2])
    return e.of(t[3]) if t[3] is not None else None


def _call(e: _Evaluation, t: Any) -> Any:
    name = t[1]
    fn = e.functions.get(name)
    if fn is None:
        fn = e.names.get(name)
        if fn is None or not callable(fn):
            raise ExpressionError(f"unknown function {name!r}")
    if t[3] and not KEYWORDS.issuperset(t[3]):
        bad = sorted(set(t[3]) - KEYWORDS)
        raise ExpressionError(f"keyword argument(s) {', '.join(bad)} not allowed (only {', '.join(sorted(KEYWORDS))})")
    args = [e.of(a) for a in t[2]]
    kwargs = {k: e.of(v) for k, v in t[3].items()} if t[3] else {}
    if e.guard is NO_GUARD:  # the exported op's call: nothing to bound
        return fn(*args, **kwargs)
    e.guard.call(name, args, kwargs)
    return e.guard.value(fn(*args, **kwargs))


def _attribute(e: _Evaluation, t: Any) -> Any:
    """``chip.simd_width``: a field of a record (a mapping or a pydantic model), never a method; of an array, only
    its data (:data:`ARRAY_ATTRIBUTES`)."""
    obj, attr = e.of(t[1]), t[2]
    if is_array(obj):
        if attr not in ARRAY_ATTRIBUTES:
            allowed = ", ".join(sorted(ARRAY_ATTRIBUTES))
            raise ExpressionError(f"array attribute {attr!r} is not allowed (only {allowed})")
        value = getattr(obj, attr)
        return tuple(value) if attr == "shape" else value
    if isinstance(obj, dict):
        if attr not in obj:
            raise ExpressionError(f"no field {attr!r}")
        value = obj[attr]
    else:
        fields = getattr(type(obj), "model_fields", None)
        if not isinstance(fields, dict) or attr not in fields:
            raise ExpressionError(f"{type(obj).__name__} has no field {attr!r}")
        value = getattr(obj, attr)
    if not isinstance(value, (*_CONSTANTS, tuple, list, dict)):
        raise ExpressionError(f"field {attr!r} is not plain data")
    return value


def _item(e: _Evaluation, t: Any) -> Any:
    obj, key = e.of(t[1]), e.of(t[2])
    if not (isinstance(obj, (list, tuple, str, dict)) or is_array(obj)):
        raise ExpressionError(f"cannot index a {type(obj).__name__}")
    return e.guard.value(obj[key])


def _slice(e: _Evaluation, t: Any) -> Any:
    return slice(*(None if part is None else e.of(part) for part in t[1:4]))


#: The evaluator, one function per node kind of the tree.
NODES: Dict[str, Callable[[_Evaluation, Any], Any]] = {
    "const": _const, "name": _name, "list": _list, "tuple": _tuple, "bin": _binary, "not": _unary, "neg": _unary,
    "pos": _unary, "and": _and, "or": _or, "concat": _concat, "cmp": _compare, "if": _if, "call": _call,
    "attr": _attribute, "item": _item, "slice": _slice,
}


def names_in(tree: Any) -> Set[str]:
    """The names an expression tree reads (function names of calls excluded). A node is a list that starts with
    its kind (a string); a list of nodes (a call's arguments, a list's items) is read from its first element."""
    if isinstance(tree, list) and tree:
        if tree[0] == "name" and len(tree) > 1 and isinstance(tree[1], str):
            return {tree[1]}
        parts = tree[1:] if isinstance(tree[0], str) else tree
        return set().union(*(names_in(t) for t in parts)) if parts else set()
    if isinstance(tree, dict):
        return set().union(*(names_in(t) for t in tree.values())) if tree else set()
    return set()

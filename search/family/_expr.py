"""The spec expression language: a small, closed language evaluated by a whitelist interpreter.

Spec files are written by others and may be hostile. Their expressions (constraints, launch geometry,
shapes, references) are parsed with Jinja's expression grammar but never compiled or run by Jinja or
Python: :func:`_evaluate` walks the syntax tree and knows only

- constants, names from the evaluation context, lists and tuples;
- arithmetic (``+ - * / // % **``), comparisons, ``and or not``, ``a if c else b``, ``~`` (concatenate);
- calls of a *named* function: :data:`FUNCTIONS`, or an array function the context supplies
  (``matmul``...); never a method;
- attributes: :data:`ARRAY_ATTRIBUTES` of arrays (``.T``, ``.shape``...), fields of records (``chip.X``);
- subscripts and slices.

Everything else (filters, tests, Jinja's globals such as ``range``/``cycler``/``lipsum``, private or
unlisted attributes, method calls) is an :class:`ExprError`. Parsing is bounded (length, nesting,
tokens), and so is evaluation: integers stay below :data:`MAX_INT_BITS` bits, strings and lists below
:data:`MAX_ITEMS` items, and ``**`` is refused before it would exceed either, so no expression can hang
or exhaust memory (``10**(10**8)`` is an error, not a constant folded at load).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from jinja2 import TemplateSyntaxError, nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


#: Functions every spec expression may call (all total on numbers, none touches the system).
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "ceil_div": ceil_div,
    "round_up": round_up,
    "is_pow2": is_pow2,
    "min": min,
    "max": max,
    "abs": abs,
    "int": int,
    "float": float,
    "len": len,
    "sqrt": math.sqrt,
    "log2": math.log2,
}
#: Older name of :data:`FUNCTIONS` (evaluation contexts spread it in).
BUILTINS = FUNCTIONS
#: Attributes an expression may read from an array (NumPy or MLX): data, never methods.
ARRAY_ATTRIBUTES = frozenset({"T", "shape", "ndim", "dtype", "size"})
#: Bounds on one expression: source length, bracket nesting, tokens, tree depth.
MAX_LENGTH = 4000
MAX_NESTING = 32
MAX_TOKENS = 1500
MAX_DEPTH = 64
MAX_UNARY_RUN = 16
#: Bounds on values: integer size in bits, items in a string, list or tuple, and array elements.
MAX_INT_BITS = 256
MAX_ITEMS = 10_000
MAX_ARRAY_ELEMENTS = 1 << 28
#: ``einsum`` loops over every combination of its indices (NumPy's default, no BLAS): at most this many steps.
MAX_EINSUM_STEPS = 1 << 37
#: Keyword arguments array functions may take (never ``out=``, which would write into an input).
KEYWORDS = frozenset({"axis", "axes", "keepdims", "group_size", "bits", "transpose"})

#: Jinja's parser only (for its grammar); nothing is compiled or rendered with it.
_ENV = ImmutableSandboxedEnvironment()


class ExprError(ValueError):
    """An expression failed to parse or to evaluate; the message says why."""


class Expr:
    """A parsed spec expression that knows which names it reads."""

    __slots__ = ("text", "names", "node")

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text.strip():
            raise ExprError("empty expression")
        self.text = text
        self.node, self.names = _parse(text)

    def __call__(self, context: dict[str, Any]) -> Any:
        try:
            return _evaluate(self.node, context)
        except ExprError as exc:
            raise ExprError(f"{self.text!r}: {exc}") from None
        except RecursionError:
            raise ExprError(f"{self.text!r}: too deeply nested") from None
        except Exception as exc:  # noqa: BLE001 - any failure of user text is reported, not raised raw
            raise ExprError(f"{self.text!r}: {type(exc).__name__}: {_short(exc)}") from None

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:197] + "..."


# -- parsing ---------------------------------------------------------------------------------------------



def _precheck(text: str) -> None:
    """Refuse input whose parse alone would be expensive or recurse deeply (before Jinja's parser runs)."""
    if len(text) > MAX_LENGTH:
        raise ExprError(f"expression longer than {MAX_LENGTH} characters")
    depth = tokens = run = 0
    try:
        for _, kind, value in _ENV.lex("{{ " + text + " }}"):
            tokens += 1
            if tokens > MAX_TOKENS:
                raise ExprError(f"expression has more than {MAX_TOKENS} tokens")
            if kind == "whitespace":
                continue
            if kind == "operator" and value in "([{":
                depth += 1
                if depth > MAX_NESTING:
                    raise ExprError(f"brackets nested deeper than {MAX_NESTING}")
            elif kind == "operator" and value in ")]}":
                depth -= 1
            unary = (kind == "operator" and value in ("-", "+")) or (kind == "name" and value == "not")
            run = run + 1 if unary else 0
            if run > MAX_UNARY_RUN:
                raise ExprError(f"more than {MAX_UNARY_RUN} operators in a row")
    except TemplateSyntaxError as exc:
        raise ExprError(f"syntax error: {exc.message}") from None


@lru_cache(maxsize=4096)
def _parse(text: str) -> tuple[nodes.Expr, frozenset[str]]:
    try:
        _precheck(text)
        body = _ENV.parse("{{ " + text + " }}").body
    except ExprError as exc:
        raise ExprError(f"{_clip(text)}: {exc}") from None
    except TemplateSyntaxError as exc:
        raise ExprError(f"{_clip(text)}: syntax error: {exc.message}") from None
    except RecursionError:
        raise ExprError(f"{_clip(text)}: too deeply nested") from None
    if len(body) != 1 or not isinstance(body[0], nodes.Output) or len(body[0].nodes) != 1 \
            or not isinstance(body[0].nodes[0], nodes.Expr):
        raise ExprError(f"{_clip(text)}: not a single expression")
    node = body[0].nodes[0]
    names: set[str] = set()
    try:
        _check(node, 0, names)
    except ExprError as exc:
        raise ExprError(f"{_clip(text)}: {exc}") from None
    return node, frozenset(names)


def _clip(text: str) -> str:
    return repr(text if len(text) <= 120 else text[:117] + "...")


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    nodes.Add: operator.add, nodes.Sub: operator.sub, nodes.Mul: operator.mul, nodes.Div: operator.truediv,
    nodes.FloorDiv: operator.floordiv, nodes.Mod: operator.mod, nodes.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {nodes.Neg: operator.neg, nodes.Pos: operator.pos,
                                            nodes.Not: operator.not_}
_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "lteq": operator.le, "gt": operator.gt,
    "gteq": operator.ge, "in": lambda a, b: a in b, "notin": lambda a, b: a not in b,
}
_CONST_TYPES = (bool, int, float, str, type(None))


def _check(node: nodes.Node, depth: int, names: set[str]) -> None:
    """Refuse every construct outside the language; collect the names read."""
    if depth > MAX_DEPTH:
        raise ExprError(f"expression nested deeper than {MAX_DEPTH}")
    d = depth + 1
    if isinstance(node, nodes.Const):
        if not isinstance(node.value, _CONST_TYPES):
            raise ExprError(f"constant {node.value!r} is not a number, string or boolean")
        if isinstance(node.value, int):
            _bound_int(node.value)
    elif isinstance(node, nodes.Name):
        if node.ctx != "load":
            raise ExprError(f"cannot assign {node.name!r}")
        names.add(node.name)
    elif isinstance(node, (nodes.List, nodes.Tuple)):
        for item in node.items:
            _check(item, d, names)
    elif type(node) in _BINARY:
        _check(node.left, d, names)  # type: ignore[attr-defined]
        _check(node.right, d, names)  # type: ignore[attr-defined]
    elif type(node) in _UNARY:
        _check(node.node, d, names)  # type: ignore[attr-defined]
    elif isinstance(node, (nodes.And, nodes.Or)):
        _check(node.left, d, names)
        _check(node.right, d, names)
    elif isinstance(node, nodes.Concat):
        for item in node.nodes:
            _check(item, d, names)
    elif isinstance(node, nodes.Compare):
        _check(node.expr, d, names)
        for op in node.ops:
            if op.op not in _COMPARE:
                raise ExprError(f"unknown comparison {op.op!r}")
            _check(op.expr, d, names)
    elif isinstance(node, nodes.CondExpr):
        _check(node.test, d, names)
        _check(node.expr1, d, names)
        if node.expr2 is not None:
            _check(node.expr2, d, names)
    elif isinstance(node, nodes.Call):
        if not isinstance(node.node, nodes.Name):
            raise ExprError("only named functions can be called (no methods)")
        if node.dyn_args is not None or node.dyn_kwargs is not None:
            raise ExprError("*args and **kwargs are not part of the expression language")
        names.add(node.node.name)
        for arg in node.args:
            _check(arg, d, names)
        for kw in node.kwargs:
            _check(kw.value, d, names)
    elif isinstance(node, nodes.Getattr):
        if node.attr.startswith("_"):
            raise ExprError(f"attribute {node.attr!r} is not accessible")
        _check(node.node, d, names)
    elif isinstance(node, nodes.Getitem):
        _check(node.node, d, names)
        _check(node.arg, d, names)
    elif isinstance(node, nodes.Slice):
        for part in (node.start, node.stop, node.step):
            if part is not None:
                _check(part, d, names)
    else:
        named: dict[type[nodes.Node], str] = {nodes.Filter: "filters (|)", nodes.Test: "tests (is)"}
        kind = named.get(type(node), type(node).__name__)
        raise ExprError(f"{kind} are not part of the expression language")


# -- evaluation ------------------------------------------------------------------------------------------

def _bound_int(value: int) -> None:
    if value.bit_length() > MAX_INT_BITS:
        raise ExprError(f"integer larger than 2**{MAX_INT_BITS}")


def _bound(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        _bound_int(value)
    elif isinstance(value, (str, list, tuple)):
        if len(value) > MAX_ITEMS:
            raise ExprError(f"value with more than {MAX_ITEMS} items")
    elif isinstance(value, float) and math.isnan(value):
        return value
    else:
        size = getattr(value, "size", None)
        if isinstance(size, int) and size > MAX_ARRAY_ELEMENTS:
            raise ExprError(f"array with more than {MAX_ARRAY_ELEMENTS} elements")
    return value


def _is_array(value: Any) -> bool:
    """A NumPy/MLX array or scalar (data with a shape and dtype), not a function."""
    kind = type(value)
    return hasattr(kind, "shape") and hasattr(kind, "dtype") and not callable(value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) or isinstance(value, bool)


def _binary(kind: type, left: Any, right: Any) -> Any:
    # Size checks happen *before* the operation for the operators that can blow up.
    if kind is nodes.Pow:
        if isinstance(left, int) and isinstance(right, int):
            if right > 0 and abs(left) > 1 and right * left.bit_length() > MAX_INT_BITS:
                raise ExprError(f"{left}**{right} is larger than 2**{MAX_INT_BITS}")
            if right < 0 and abs(right) > MAX_INT_BITS * 4:
                raise ExprError(f"exponent {right} is out of range")
    elif kind is nodes.Mul:
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(count, int) and len(seq) * count > MAX_ITEMS:
                raise ExprError(f"value with more than {MAX_ITEMS} items")
    elif kind is nodes.Mod and isinstance(left, str):
        raise ExprError("string formatting with % is not part of the expression language")
    for value in (left, right):
        if not (_number(value) or isinstance(value, (str, list, tuple)) or _is_array(value)):
            raise ExprError(f"cannot apply an operator to a {type(value).__name__}")
    if _is_array(left) or _is_array(right):
        _bound_broadcast(left, right)
    return _bound(_BINARY[kind](left, right))


def _shape_of(value: Any) -> tuple[int, ...]:
    """The shape an operand of an array operation has (a nested list's, read from its first items)."""
    if _is_array(value):
        return tuple(int(d) for d in value.shape)
    dims: list[int] = []
    while isinstance(value, (list, tuple)) and len(dims) < 32:
        dims.append(len(value))
        value = value[0] if value else None
    return tuple(dims)


def _bound_size(elements: int) -> None:
    if elements > MAX_ARRAY_ELEMENTS:
        raise ExprError(f"array with more than {MAX_ARRAY_ELEMENTS} elements")


def _broadcast_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The shape NumPy broadcasts ``shapes`` to (an incompatible pair is left for the operation to report)."""
    width = max((len(s) for s in shapes), default=0)
    padded = [(1,) * (width - len(s)) + s for s in shapes]
    return tuple(next((d for d in dims if d != 1), 1) for dims in zip(*padded))


def _bound_broadcast(*operands: Any) -> None:
    """Refuse an array operation whose operands or result would exceed :data:`MAX_ARRAY_ELEMENTS`, from
    their shapes alone (before NumPy converts a nested list or fills a broadcast result)."""
    shapes = [_shape_of(x) for x in operands]
    for shape in shapes:
        _bound_size(math.prod(shape))
    _bound_size(math.prod(_broadcast_shape(shapes)))


def _bound_call(name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
    """Refuse, from the arguments' shapes, an array function whose result (or loop) would be too big, before
    it runs: the functions that can make more than they are given (outer products, broadcasts, expansion)."""
    listed = [x for a in args if isinstance(a, (list, tuple)) for x in a if _is_array(x)]
    _bound_size(sum(int(x.size) for x in listed))  # concatenate([A] * 10000)
    shapes = [_shape_of(a) for a in args if _is_array(a) or isinstance(a, (list, tuple))]
    if name == "einsum" and args and isinstance(args[0], str):
        _bound_einsum(args[0], [_shape_of(a) for a in args[1:]])
    elif name == "matmul" and len(shapes) == 2 and all(shapes):
        a, b = shapes
        batch = _broadcast_shape([a[:-2], b[:-2]])
        _bound_size(math.prod(batch) * (a[-2] if len(a) > 1 else 1) * (b[-1] if len(b) > 1 else 1))
    elif name in ("dequantize", "quantized_matmul") and shapes:
        bits = kwargs.get("bits", 4)
        per_word = 32 // bits if isinstance(bits, int) and bits in (2, 4, 8) else 32
        w = shapes[0] if name == "dequantize" else shapes[1] if len(shapes) > 1 else ()
        _bound_size(math.prod(w) * per_word)  # the weights unpacked
        if name == "quantized_matmul" and shapes[0] and len(w) == 2:  # rows of x times the product's columns
            _bound_size(math.prod(shapes[0][:-1]) * max(w[0], w[1] * per_word))
    elif len(shapes) > 1:  # maximum, minimum, where...: elementwise over the broadcast shape
        _bound_size(math.prod(_broadcast_shape(shapes)))


def _bound_einsum(subscripts: str, shapes: list[tuple[int, ...]]) -> None:
    """``einsum``'s result (its output indices) and its loop (all its indices), from the subscripts."""
    inputs, _, output = subscripts.replace(" ", "").partition("->")
    sizes: dict[str, int] = {}
    for letters, shape in zip(inputs.split(","), shapes):
        if "." in letters or len(letters) != len(shape):
            return  # ellipses and mismatches: NumPy checks (and refuses) them
        for letter, dim in zip(letters, shape):
            sizes[letter] = max(sizes.get(letter, 1), dim)
    if "->" not in subscripts:
        output = "".join(c for c in sizes if inputs.count(c) == 1)
    _bound_size(math.prod(sizes.get(c, 1) for c in output))
    if math.prod(sizes.values()) > MAX_EINSUM_STEPS:
        raise ExprError(f"einsum over more than {MAX_EINSUM_STEPS} index combinations (use matmul)")


def _record_field(obj: Any, attr: str) -> Any:
    """``chip.simd_width``: a data field of a record (pydantic model or mapping), never a method."""
    if _is_array(obj):
        if attr not in ARRAY_ATTRIBUTES:
            raise ExprError(f"array attribute {attr!r} is not allowed (only {', '.join(sorted(ARRAY_ATTRIBUTES))})")
        value = getattr(obj, attr)
        return tuple(value) if attr == "shape" else value
    if isinstance(obj, dict):
        if attr not in obj:
            raise ExprError(f"no field {attr!r}")
        value = obj[attr]
    else:
        fields = getattr(type(obj), "model_fields", None)
        if not isinstance(fields, dict) or attr not in fields:
            raise ExprError(f"{type(obj).__name__} has no field {attr!r}")
        value = getattr(obj, attr)
    if not isinstance(value, (*_CONST_TYPES, tuple, list, dict)):
        raise ExprError(f"field {attr!r} is not plain data")
    return value


def _evaluate(node: nodes.Node, ctx: dict[str, Any]) -> Any:
    if isinstance(node, nodes.Const):
        return node.value
    if isinstance(node, nodes.Name):
        if node.name not in ctx:
            raise ExprError(f"unknown name {node.name!r}")
        value = ctx[node.name]
        if callable(value):
            raise ExprError(f"{node.name!r} is a function; call it")
        return value
    if isinstance(node, nodes.List):
        return [_evaluate(n, ctx) for n in node.items]
    if isinstance(node, nodes.Tuple):
        return tuple(_evaluate(n, ctx) for n in node.items)
    kind = type(node)
    if kind in _BINARY:
        return _binary(kind, _evaluate(node.left, ctx), _evaluate(node.right, ctx))  # type: ignore[attr-defined]
    if kind in _UNARY:
        value = _evaluate(node.node, ctx)  # type: ignore[attr-defined]
        if not (_number(value) or _is_array(value)) and kind is not nodes.Not:
            raise ExprError(f"cannot negate a {type(value).__name__}")
        return _UNARY[kind](value)
    if isinstance(node, nodes.And):
        return _evaluate(node.left, ctx) and _evaluate(node.right, ctx)
    if isinstance(node, nodes.Or):
        return _evaluate(node.left, ctx) or _evaluate(node.right, ctx)
    if isinstance(node, nodes.Concat):
        parts = [_evaluate(n, ctx) for n in node.nodes]
        if not all(isinstance(p, (str, int, float, bool)) for p in parts):
            raise ExprError("~ joins numbers and strings only")
        return _bound("".join(str(p) for p in parts))
    if isinstance(node, nodes.Compare):
        left = _evaluate(node.expr, ctx)
        result: Any = True
        for op in node.ops:
            right = _evaluate(op.expr, ctx)
            result = _COMPARE[op.op](left, right)
            if not _is_array(result) and not result:
                return False
            left = right
        return result
    if isinstance(node, nodes.CondExpr):
        if _evaluate(node.test, ctx):
            return _evaluate(node.expr1, ctx)
        return _evaluate(node.expr2, ctx) if node.expr2 is not None else None
    if isinstance(node, nodes.Call):
        name = node.node.name  # type: ignore[attr-defined]
        fn = ctx.get(name)  # the context is built by kernsearch: its callables are the language's functions
        if fn is None or not callable(fn):
            raise ExprError(f"unknown function {name!r}")
        bad = sorted({kw.key for kw in node.kwargs} - KEYWORDS)
        if bad:
            raise ExprError(f"keyword argument(s) {', '.join(bad)} not allowed (only {', '.join(sorted(KEYWORDS))})")
        args = [_evaluate(a, ctx) for a in node.args]
        kwargs = {kw.key: _evaluate(kw.value, ctx) for kw in node.kwargs}
        if name == "int" and args and isinstance(args[0], str) and len(args[0]) > 100:
            raise ExprError("int() of a long string")
        _bound_call(name, args, kwargs)
        return _bound(fn(*args, **kwargs))
    if isinstance(node, nodes.Getattr):
        return _record_field(_evaluate(node.node, ctx), node.attr)
    if isinstance(node, nodes.Getitem):
        obj = _evaluate(node.node, ctx)
        key = _evaluate(node.arg, ctx)
        if not (isinstance(obj, (list, tuple, str, dict)) or _is_array(obj)):
            raise ExprError(f"cannot index a {type(obj).__name__}")
        return _bound(obj[key])
    if isinstance(node, nodes.Slice):
        return slice(*(None if p is None else _evaluate(p, ctx) for p in (node.start, node.stop, node.step)))
    raise ExprError(f"{type(node).__name__} is not part of the expression language")


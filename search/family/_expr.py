"""The spec expression language: a small, closed language evaluated by a whitelist interpreter.

Spec files are written by others and may be hostile. Their expressions (constraints, launch geometry,
shapes, references) are parsed with Jinja's expression grammar but never compiled or run by Jinja or
Python: each is turned into the small JSON tree of the shared rules (``kernsearch._rules``, the evaluator the
exported package runs too), refusing every construct outside the language, and evaluated there. It knows only

- constants, names from the evaluation context, lists and tuples;
- arithmetic (``+ - * / // % **``), comparisons, ``and or not``, ``a if c else b``, ``~`` (concatenate);
- calls of a *named* function: :data:`FUNCTIONS`, or an array function the context supplies
  (``matmul``...); never a method;
- attributes: :data:`ARRAY_ATTRIBUTES` of arrays (``.T``, ``.shape``...), fields of records (``chip.X``);
- subscripts and slices.

Everything else (filters, tests, Jinja's globals such as ``range``/``cycler``/``lipsum``, private or
unlisted attributes, method calls) is an :class:`ExprError`. Parsing is bounded (length, nesting,
tokens), and so is evaluation (:class:`Bounds`, the guard kernsearch evaluates with): integers stay below
:data:`MAX_INT_BITS` bits, strings and lists below :data:`MAX_ITEMS` items, arrays below
:data:`MAX_ARRAY_ELEMENTS` elements (checked from the operands' shapes before NumPy allocates), and ``**`` is
refused before it would exceed them, so no expression can hang or exhaust memory (``10**(10**8)`` is an error, not
a constant folded at load).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from jinja2 import TemplateSyntaxError, nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .._rules import (
    ARRAY_ATTRIBUTES,
    BINARY,
    COMPARE,
    FUNCTIONS,
    KEYWORDS,
    MAX_INT_BITS,
    ExpressionError,
    Guard,
    ceil_div,
    evaluate,
    is_array,
    is_pow2,
    round_up,
)

__all__ = ["ARRAY_ATTRIBUTES", "BUILTINS", "FUNCTIONS", "KEYWORDS", "MAX_INT_BITS", "Bounds", "Expr", "ExprError",
           "binary", "ceil_div", "is_pow2", "round_up"]

#: Older name of :data:`FUNCTIONS` (evaluation contexts spread it in).
BUILTINS = FUNCTIONS
#: Bounds on one expression: source length, bracket nesting, tokens, tree depth.
MAX_LENGTH = 4000
MAX_NESTING = 32
MAX_TOKENS = 1500
MAX_DEPTH = 64
MAX_UNARY_RUN = 16
#: Bounds on values: items in a string, list or tuple, and array elements (integers: ``MAX_INT_BITS`` bits).
MAX_ITEMS = 10_000
MAX_ARRAY_ELEMENTS = 1 << 28
#: ``einsum`` loops over every combination of its indices (NumPy's default, no BLAS): at most this many steps.
MAX_EINSUM_STEPS = 1 << 37
#: Jinja's parser only (for its grammar); nothing is compiled or rendered with it.
_ENV = ImmutableSandboxedEnvironment()


#: An expression failed to parse or to evaluate; the message says why (the shared rules' error).
ExprError = ExpressionError


class Expr:
    """A parsed spec expression: its text, the names it reads, Jinja's syntax tree (for introspection) and the
    shared rules' expression tree it is evaluated as."""

    __slots__ = ("text", "names", "node", "tree")

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text.strip():
            raise ExprError("empty expression")
        self.text = text
        self.node, self.tree, self.names = _parse(text)

    def __call__(self, context: dict[str, Any]) -> Any:
        try:
            return evaluate(self.tree, context, _CONTEXT_ONLY, BOUNDS)
        except ExprError as exc:
            raise ExprError(f"{self.text!r}: {exc}") from None
        except RecursionError:
            raise ExprError(f"{self.text!r}: too deeply nested") from None
        except Exception as exc:  # noqa: BLE001 - any failure of user text is reported, not raised raw
            raise ExprError(f"{self.text!r}: {type(exc).__name__}: {_short(exc)}") from None

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"


#: Functions come from the evaluation context (kernsearch builds it: :data:`BUILTINS`, array functions).
_CONTEXT_ONLY: dict[str, Callable[..., Any]] = {}


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
            depth += _nesting(kind, value)
            if depth > MAX_NESTING:
                raise ExprError(f"brackets nested deeper than {MAX_NESTING}")
            run = run + 1 if _unary(kind, value) else 0
            if run > MAX_UNARY_RUN:
                raise ExprError(f"more than {MAX_UNARY_RUN} operators in a row")
    except TemplateSyntaxError as exc:
        raise ExprError(f"syntax error: {exc.message}") from None


def _nesting(kind: str, value: str) -> int:
    """How a token changes the depth of brackets: +1 opens, -1 closes, 0 neither."""
    if kind != "operator":
        return 0
    return 1 if value in "([{" else -1 if value in ")]}" else 0


def _unary(kind: str, value: str) -> bool:
    return (kind == "operator" and value in ("-", "+")) or (kind == "name" and value == "not")


@lru_cache(maxsize=4096)
def _parse(text: str) -> tuple[nodes.Expr, list[Any], frozenset[str]]:
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
        tree = _tree(node, 0, names)
    except ExprError as exc:
        raise ExprError(f"{_clip(text)}: {exc}") from None
    return node, tree, frozenset(names)


def _clip(text: str) -> str:
    return repr(text if len(text) <= 120 else text[:117] + "...")


# -- Jinja's syntax tree as the rules' expression tree -----------------------------------------------------

def _tree(node: nodes.Node, depth: int, names: set[str]) -> list[Any]:
    """The expression tree of ``node`` (:data:`kernsearch._rules.NODES`); every construct outside the language is
    refused; the names it reads are collected into ``names``."""
    if depth > MAX_DEPTH:
        raise ExprError(f"expression nested deeper than {MAX_DEPTH}")
    convert = _CONVERT.get(type(node))
    if convert is None:
        named: dict[type[nodes.Node], str] = {nodes.Filter: "filters (|)", nodes.Test: "tests (is)"}
        raise ExprError(f"{named.get(type(node), type(node).__name__)} are not part of the expression language")
    return convert(node, depth + 1, names)


def _const(node: Any, d: int, names: set[str]) -> list[Any]:
    if not isinstance(node.value, (bool, int, float, str, type(None))):
        raise ExprError(f"constant {node.value!r} is not a number, string or boolean")
    if isinstance(node.value, int):
        _bound_int(node.value)
    return ["const", node.value]


def _name(node: Any, d: int, names: set[str]) -> list[Any]:
    if node.ctx != "load":
        raise ExprError(f"cannot assign {node.name!r}")
    names.add(node.name)
    return ["name", node.name]


def _items(kind: str) -> Callable[[Any, int, set[str]], list[Any]]:
    return lambda node, d, names: [kind, [_tree(item, d, names) for item in node.items]]


def _binary_node(symbol: str) -> Callable[[Any, int, set[str]], list[Any]]:
    return lambda node, d, names: ["bin", symbol, _tree(node.left, d, names), _tree(node.right, d, names)]


def _unary_node(kind: str) -> Callable[[Any, int, set[str]], list[Any]]:
    return lambda node, d, names: [kind, _tree(node.node, d, names)]


def _logic_node(kind: str) -> Callable[[Any, int, set[str]], list[Any]]:
    return lambda node, d, names: [kind, _tree(node.left, d, names), _tree(node.right, d, names)]


def _concat(node: Any, d: int, names: set[str]) -> list[Any]:
    return ["concat", [_tree(item, d, names) for item in node.nodes]]


def _compare(node: Any, d: int, names: set[str]) -> list[Any]:
    ops = []
    for op in node.ops:
        if op.op not in COMPARE:
            raise ExprError(f"unknown comparison {op.op!r}")
        ops.append([op.op, _tree(op.expr, d, names)])
    return ["cmp", _tree(node.expr, d, names), ops]


def _cond(node: Any, d: int, names: set[str]) -> list[Any]:
    otherwise = _tree(node.expr2, d, names) if node.expr2 is not None else None
    return ["if", _tree(node.test, d, names), _tree(node.expr1, d, names), otherwise]


def _call(node: Any, d: int, names: set[str]) -> list[Any]:
    if not isinstance(node.node, nodes.Name):
        raise ExprError("only named functions can be called (no methods)")
    if node.dyn_args is not None or node.dyn_kwargs is not None:
        raise ExprError("*args and **kwargs are not part of the expression language")
    names.add(node.node.name)
    return ["call", node.node.name, [_tree(a, d, names) for a in node.args],
            {kw.key: _tree(kw.value, d, names) for kw in node.kwargs}]


def _getattr(node: Any, d: int, names: set[str]) -> list[Any]:
    if node.attr.startswith("_"):
        raise ExprError(f"attribute {node.attr!r} is not accessible")
    return ["attr", _tree(node.node, d, names), node.attr]


def _getitem(node: Any, d: int, names: set[str]) -> list[Any]:
    return ["item", _tree(node.node, d, names), _tree(node.arg, d, names)]


def _slice(node: Any, d: int, names: set[str]) -> list[Any]:
    return ["slice", *(None if p is None else _tree(p, d, names) for p in (node.start, node.stop, node.step))]


_SYMBOLS: dict[type[nodes.Node], str] = {
    nodes.Add: "+", nodes.Sub: "-", nodes.Mul: "*", nodes.Div: "/", nodes.FloorDiv: "//", nodes.Mod: "%",
    nodes.Pow: "**"}
#: The language: one converter per Jinja node type; anything else is refused.
_CONVERT: dict[type[nodes.Node], Callable[[Any, int, set[str]], list[Any]]] = {
    nodes.Const: _const, nodes.Name: _name, nodes.List: _items("list"), nodes.Tuple: _items("tuple"),
    **{kind: _binary_node(symbol) for kind, symbol in _SYMBOLS.items()},
    nodes.Neg: _unary_node("neg"), nodes.Pos: _unary_node("pos"), nodes.Not: _unary_node("not"),
    nodes.And: _logic_node("and"), nodes.Or: _logic_node("or"), nodes.Concat: _concat, nodes.Compare: _compare,
    nodes.CondExpr: _cond, nodes.Call: _call, nodes.Getattr: _getattr, nodes.Getitem: _getitem,
    nodes.Slice: _slice,
}


# -- bounds ----------------------------------------------------------------------------------------------

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


class Bounds(Guard):
    """What kernsearch evaluates a spec's expressions with: sizes checked before the operations that could exhaust
    memory (from the operands' shapes, before NumPy allocates) and every result bounded."""

    def binary(self, op: str, left: Any, right: Any) -> None:
        if op == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(count, int) and len(seq) * count > MAX_ITEMS:
                    raise ExprError(f"value with more than {MAX_ITEMS} items")
        if is_array(left) or is_array(right):
            _bound_broadcast(left, right)

    def call(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        if name == "int" and args and isinstance(args[0], str) and len(args[0]) > 100:
            raise ExprError("int() of a long string")
        _bound_call(name, args, kwargs)

    def value(self, value: Any) -> Any:
        return _bound(value)


BOUNDS = Bounds()


def binary(op: str, left: Any, right: Any) -> Any:
    """``left op right`` (``op`` one of ``+ - * / // % **``) as the language evaluates it, bounded: the template
    sandbox's arithmetic is the expressions' own."""
    if op not in BINARY:
        raise ExprError(f"unknown operator {op!r}")
    if type(left) is int and type(right) is int and op != "**":
        # Nearly every template operation (millions in a sweep's renders): what evaluating the tree does for two
        # ints (no operand or size check applies to them), without building and walking it.
        return _bound(BINARY[op](left, right))
    return evaluate(["bin", op, ["const", left], ["const", right]], {}, _CONTEXT_ONLY, BOUNDS)


def _shape_of(value: Any) -> tuple[int, ...]:
    """The shape an operand of an array operation has (a nested list's, read from its first items)."""
    if is_array(value):
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


def _bound_listed(args: list[Any]) -> None:
    """The arrays inside list arguments together (``concatenate([A] * 10000)`` is as big as all of them)."""
    listed = [x for a in args if isinstance(a, (list, tuple)) for x in a if is_array(x)]
    _bound_size(sum(int(x.size) for x in listed))  # concatenate([A] * 10000)


def _bound_matmul(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    """``matmul``'s result: the broadcast batch times ``a``'s rows times ``b``'s columns."""
    batch = _broadcast_shape([a[:-2], b[:-2]])
    _bound_size(math.prod(batch) * (a[-2] if len(a) > 1 else 1) * (b[-1] if len(b) > 1 else 1))


def _bound_quantized(name: str, shapes: list[tuple[int, ...]], kwargs: dict[str, Any]) -> None:
    """``dequantize`` / ``quantized_matmul``: the packed weights unpacked, and the product's rows times its
    columns."""
    bits = kwargs.get("bits", 4)
    per_word = 32 // bits if isinstance(bits, int) and bits in (2, 4, 8) else 32
    w = shapes[0] if name == "dequantize" else shapes[1] if len(shapes) > 1 else ()
    _bound_size(math.prod(w) * per_word)  # the weights unpacked
    if name == "quantized_matmul" and shapes[0] and len(w) == 2:  # rows of x times the product's columns
        _bound_size(math.prod(shapes[0][:-1]) * max(w[0], w[1] * per_word))


def _bound_call(name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
    """Refuse, from the arguments' shapes, an array function whose result (or loop) would be too big, before
    it runs: the functions that can make more than they are given (outer products, broadcasts, expansion)."""
    _bound_listed(args)
    shapes = [_shape_of(a) for a in args if is_array(a) or isinstance(a, (list, tuple))]
    if name == "einsum" and args and isinstance(args[0], str):
        _bound_einsum(args[0], [_shape_of(a) for a in args[1:]])
    elif name == "matmul" and len(shapes) == 2 and all(shapes):
        _bound_matmul(*shapes)
    elif name in ("dequantize", "quantized_matmul") and shapes:
        _bound_quantized(name, shapes, kwargs)
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

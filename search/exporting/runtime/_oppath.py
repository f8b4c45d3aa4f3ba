"""The op path: a family's MLX baseline planned once per shape as the closures of ``_opforms`` (:func:`op_call`),
called as a consumer writes the ops. Part of the run-time dispatcher, copied verbatim into every exported
package; the expressions are evaluated by the shared rules (``_rules.evaluate``)."""

from __future__ import annotations

import json
import operator
from typing import Any, Callable, Dict, List, Optional, Tuple

try:  # an exported package: the shared modules sit beside this file
    from ._rules import (  # type: ignore[import-not-found,unused-ignore]
        BINARY,
        KEYWORDS,
        UNARY,
        ExpressionError,
        evaluate,
        names_in,
    )
except ImportError:  # kernsearch itself: the same modules, at the bottom of its package
    from ..._rules import (
        BINARY,
        KEYWORDS,
        UNARY,
        ExpressionError,
        evaluate,
        names_in,
    )

from ._opforms import (
    _arg_call,
    _each_callable,
    _entry,
    _Leaf,
    _node_then_slots,
    _plain_call,
    _plus_call,
    _sequence,
    _silu_node,
    _silu_times,
    _slot_call,
    _spelled_binary,
    _star_root,
    _swiglu_of_calls,
    _with_ext,
    _with_lets,
)

_REQUIRED = object()


#: Vocabulary functions called as MLX's own function, every argument positional (no wrapper frame, no keyword
#: merging): name -> (MLX attribute, the vocabulary function's parameters with their defaults, keywords MLX takes
#: by name only). Arguments named ``eps`` are passed as floats, as the vocabulary does.
_DIRECT: Dict[str, Tuple[str, Tuple[Tuple[str, Any], ...], Dict[str, Any]]] = {
    "quantized_matmul": ("quantized_matmul", (("x", _REQUIRED), ("w", _REQUIRED), ("scales", _REQUIRED),
                                              ("biases", _REQUIRED), ("transpose", True), ("group_size", 64),
                                              ("bits", 4)), {}),
    "rms_norm": ("fast.rms_norm", (("x", _REQUIRED), ("w", _REQUIRED), ("eps", _REQUIRED)), {}),
    "layer_norm": ("fast.layer_norm", (("x", _REQUIRED), ("w", _REQUIRED), ("b", _REQUIRED), ("eps", _REQUIRED)), {}),
    "softmax": ("softmax", (("x", _REQUIRED), ("axis", -1)), {"precise": True}),
}


def op_call(fam: Dict[str, Any], dims: Optional[Dict[str, int]], functions: Dict[str, Callable[..., Any]],
            mx: Any, fixed: Optional[Dict[str, Any]] = None) -> Callable[..., Any]:
    """The family's MLX baseline as a function of its inputs' arrays (of the inputs not in ``fixed``, in order,
    where :meth:`Dispatcher.bind` fixes the weights), planned once for one shape: the MLX ops the baseline names,
    called as a consumer writes them — never ``mx.compile``d (a compiled call costs more in a chain of dependent
    calls than the plain ops, measured on an H200), each shared subexpression once (``rms_norm(X)`` feeding two
    projections), constants (parameters, values of the dimensions) evaluated here, not per call. A baseline that
    is a single call of inputs in order is the MLX function itself or one frame around it."""
    fixed = fixed or {}
    order = [spec["name"] for spec in fam["inputs"] if spec["name"] not in fixed]
    names: Dict[str, Any] = {**(dims or {}), **{p["name"]: p["value"] for p in fam.get("params", [])}}
    tree = fam["baseline"]
    try:
        return _Program(order, fixed, names, functions, mx).build(tree)
    except (ExpressionError, ArithmeticError, TypeError, ValueError, KeyError, RecursionError):
        pass  # a constant that does not evaluate: the whole expression per call (which says why)
    bound = {**names, **fixed}

    def run(*arrays: Any) -> Any:
        return _outputs(evaluate(tree, {**bound, **dict(zip(order, arrays))}, functions))

    return run


class _Program:
    """A baseline tree as nested closures of ``ext``, the call's arrays followed by its shared values (each
    computed once per call, in order). An operand is ``("slot", i)`` (``ext[i]``), ``("const", v)`` (evaluated
    here) or ``("fn", f)`` (``f(ext)``); a node the closures do not cover is evaluated by ``evaluate`` per call."""

    def __init__(self, order: List[str], fixed: Dict[str, Any], names: Dict[str, Any],
                 functions: Dict[str, Callable[..., Any]], mx: Any) -> None:
        self.slots = {n: i for i, n in enumerate(order)}
        self.fixed, self.names, self.functions, self.mx = fixed, names, functions, mx
        self.arrays = set(order) | set(fixed)
        self.uses: Dict[str, int] = {}
        self.memo: Dict[str, Tuple[str, Any]] = {}
        self.lets: List[Callable[[Any], Any]] = []
        #: id of a closure that is one MLX call of values and constants -> (function, slots, constants): a parent
        #: may make that call itself (:func:`_swiglu_of_calls`, :func:`_plus_call`).
        self.leaves: Dict[int, _Leaf] = {}
        #: The root's parts where it is a two-operand node or a call of a node and inputs, so that the op takes the
        #: call's arrays itself (no frame around the root).
        self.pieces: Optional[Tuple[str, Any]] = None
        #: (function, slots, constants, keywords) where the whole baseline is one call of arrays, then constants.
        self.simple: Optional[Tuple[Callable[..., Any], List[int], Tuple[Any, ...], Dict[str, Any]]] = None

    def build(self, tree: Any) -> Callable[..., Any]:
        self._count(tree)
        root = self._operand(tree, top=True)
        n_in, lets = len(self.slots), tuple(self.lets)
        if lets:
            ext = _with_lets(lets, self._fn(root))
            return _with_ext(_entry(ext), ext)
        if self.simple is not None and self.simple[1] == list(range(n_in)):
            fn, _, consts, kw = self.simple
            return _plain_call(fn, consts, kw, n_in)
        if root[0] == "const":
            value = root[1]
            return lambda *xs: value
        f = self._fn(root)
        return _with_ext(_star_root(self.pieces) or _entry(f), f)

    # -- pass 1: what is shared ------------------------------------------------------------------------
    def _count(self, t: Any) -> None:
        if not self._reads(t) or t[0] == "name":
            return
        key = json.dumps(t)
        self.uses[key] = self.uses.get(key, 0) + 1
        if self.uses[key] == 1:  # a shared subtree's parts are computed once with it
            for child in _children(t):
                self._count(child)

    def _reads(self, t: Any) -> bool:
        return bool(names_in(t) & self.arrays)

    # -- pass 2: closures -------------------------------------------------------------------------------
    def _operand(self, t: Any, top: bool = False) -> Tuple[str, Any]:
        if not self._reads(t):
            return ("const", evaluate(t, self.names, self.functions))
        if t[0] == "name":
            return ("slot", self.slots[t[1]]) if t[1] in self.slots else ("const", self.fixed[t[1]])
        key = json.dumps(t)
        if key in self.memo:
            return self.memo[key]
        node = self._node(t, top)
        if self.uses.get(key, 0) > 1:
            self.lets.append(self._fn(node))
            node = ("slot", len(self.slots) + len(self.lets) - 1)
        self.memo[key] = node
        return node

    def _node(self, t: Any, top: bool) -> Tuple[str, Any]:
        kind = t[0]
        if kind == "call":
            return self._call(t, top)
        swiglu = self._swiglu(t) if kind == "bin" and t[1] == "*" else None
        if swiglu is not None:
            return swiglu
        if kind == "bin" and t[1] in BINARY:
            return self._binary(BINARY[t[1]], self._operand(t[2]), self._operand(t[3]), t, top)
        if kind in ("neg", "pos"):
            f, neg = self._fn(self._operand(t[1])), UNARY[kind]
            return ("fn", lambda ext: neg(f(ext)))
        if kind in ("list", "tuple"):
            # a baseline's outputs (top) are a tuple: one array per output (``_outputs``)
            return ("fn", _sequence([self._fn(self._operand(item)) for item in t[1]], top or kind == "tuple"))
        if kind == "item" and not self._reads(t[2]):
            base, index = self._operand(t[1]), evaluate(t[2], self.names, self.functions)
            if base[0] == "slot":
                i = base[1]
                return ("fn", lambda ext: ext[i][index])
            f = self._fn(base)
            return ("fn", lambda ext: f(ext)[index])
        return self._opaque(t)

    def _call(self, t: Any, top: bool) -> Tuple[str, Any]:
        fn = self.functions.get(t[1])
        kwargs = t[3] or {}
        if fn is None or not KEYWORDS.issuperset(kwargs) or any(self._reads(v) for v in kwargs.values()):
            return self._opaque(t)
        args = [self._operand(a) for a in t[2]]
        kw = {k: evaluate(v, self.names, self.functions) for k, v in kwargs.items()}
        if t[1] == "silu" and len(args) == 1 and not kw:  # the vocabulary's silu, x * sigmoid(x), without its frame
            return ("fn", _silu_node(self._fn(args[0]), self.mx.sigmoid))
        direct = _direct(t[1], args, kw, self.mx)
        if direct is not None:
            fn, args, kw = direct
        return ("fn", self._closure(fn, args, kw, top))

    def _closure(self, fn: Callable[..., Any], args: List[Tuple[str, Any]], kw: Dict[str, Any],
                 top: bool) -> Callable[[Any], Any]:
        """A call's closure, by the shape of its arguments: arrays then constants (the constants bound), a nested
        call then arrays (``qmm(rms_norm(X), W...)``), or each argument a callable (constants between arrays)."""
        split = next((i for i, a in enumerate(args) if a[0] == "const"), len(args))
        if any(a[0] != "const" for a in args[split:]):  # constants between arrays: each argument a callable
            return _each_callable(fn, [self._fn(a) for a in args], kw)
        consts = tuple(a[1] for a in args[split:])
        heads = args[:split]
        if all(a[0] == "slot" for a in heads):
            return self._leaf(fn, [a[1] for a in heads], consts, kw, top)
        if not kw and heads[0][0] == "fn" and all(a[0] == "slot" for a in heads[1:]):  # qmm(rms_norm(X), W...)
            return self._nested(fn, heads, consts, top)
        return _arg_call(fn, [self._fn(a) for a in heads], consts, kw)

    def _nested(self, fn: Callable[..., Any], heads: List[Tuple[str, Any]], consts: Tuple[Any, ...],
                top: bool) -> Callable[[Any], Any]:
        """A call whose first argument is a call and the rest arrays (``qmm(rms_norm(X), W, S, B)``)."""
        slots = [a[1] for a in heads[1:]]
        if top:
            self.pieces = ("call", (fn, heads[0][1], slots, consts))
        return _node_then_slots(fn, heads[0][1], slots, consts)

    def _leaf(self, fn: Callable[..., Any], slots: List[int], consts: Tuple[Any, ...], kw: Dict[str, Any],
              top: bool) -> Callable[[Any], Any]:
        """A call of arrays only (then constants): the closure a plain call and ``_plus_call`` recognise."""
        if top:
            self.simple = (fn, slots, consts, kw)
        leaf = _slot_call(fn, slots, consts, kw)
        if not kw:
            self.leaves[id(leaf)] = (fn, slots, consts)
        return leaf

    def _swiglu(self, t: Any) -> Tuple[str, Any] | None:
        """``silu(a) * b`` (SwiGLU's gate) in one frame, or None where ``t`` is another product."""
        if not self._silu_once(t[2]):
            return None
        x, g = self._fn(self._operand(t[2][2][0])), self._operand(t[3])
        if g[0] not in ("slot", "fn"):
            return None
        both = _swiglu_of_calls(self.leaves.get(id(x)), self.leaves.get(id(g[1])), self.mx.sigmoid)
        return ("fn", both or _silu_times(x, self._fn(g), self.mx.sigmoid))

    def _silu_once(self, t: Any) -> bool:
        """Whether ``t`` is a call of the vocabulary's silu used once (not a shared value)."""
        return (t[0] == "call" and t[1] == "silu" and len(t[2]) == 1 and not t[3] and "silu" in self.functions
                and self.uses.get(json.dumps(t), 0) <= 1)

    def _binary(self, op: Callable[[Any, Any], Any], left: Tuple[str, Any], right: Tuple[str, Any],
                t: Any, top: bool) -> Tuple[str, Any]:
        if any(side[0] == "const" and type(side[1]) not in (int, float, bool) for side in (left, right)):
            return self._opaque(t)  # an operand the evaluator checks (a string, a list): evaluated per call
        spelled = _plus_call(t[1], left, right, self.leaves) or _spelled_binary(t[1], left, right)
        if spelled is not None:
            return ("fn", spelled)
        if left[0] == "const":
            c, g = left[1], self._fn(right)
            return ("fn", lambda ext: op(c, g(ext)))
        f = self._fn(left)
        if right[0] == "const":
            c = right[1]
            return ("fn", lambda ext: op(f(ext), c))
        g = self._fn(right)
        if top:
            self.pieces = ("bin", (op, f, g))
        return ("fn", lambda ext: op(f(ext), g(ext)))

    def _opaque(self, t: Any) -> Tuple[str, Any]:
        """A node outside the closures' forms: evaluated per call, with the call's arrays by name."""
        names, functions, slots = {**self.names, **self.fixed}, self.functions, list(self.slots.items())
        return ("fn", lambda ext: evaluate(t, {**names, **{n: ext[i] for n, i in slots}}, functions))

    @staticmethod
    def _fn(operand: Tuple[str, Any]) -> Callable[[Any], Any]:
        kind, value = operand
        if kind == "slot":
            return operator.itemgetter(value)
        if kind == "const":
            return lambda ext: value
        return value  # type: ignore[no-any-return]


def _children(t: Any) -> List[Any]:
    """The sub-expressions of a node (a call's arguments and keyword values, a list's items...)."""
    kind = t[0]
    if kind == "call":
        return [*t[2], *(t[3] or {}).values()]
    if kind in ("list", "tuple"):
        return list(t[1])
    return [c for c in t[1:] if isinstance(c, list) and c and isinstance(c[0], str)]


def _direct(name: str, args: List[Tuple[str, Any]], kw: Dict[str, Any],
            mx: Any) -> Optional[Tuple[Callable[..., Any], List[Tuple[str, Any]], Dict[str, Any]]]:
    """(MLX function, every argument positional, its keyword-only arguments) for a call of a vocabulary function
    :data:`_DIRECT` knows; None where the call does not fit its parameters."""
    entry = _DIRECT.get(name)
    if entry is None:
        return None
    path, params, only_kw = entry
    if len(args) > len(params):
        return None
    given = dict(zip([p for p, _ in params], args))
    for k, v in kw.items():
        if k in given or k not in dict(params):
            return None
        given[k] = ("const", v)
    full: List[Tuple[str, Any]] = []
    for p, default in params:
        arg = given.get(p, ("const", default) if default is not _REQUIRED else None)
        if arg is None:
            return None
        if p == "eps":
            if arg[0] != "const":
                return None
            arg = ("const", float(arg[1]))
        full.append(arg)
    target: Any = mx
    for part in path.split("."):
        target = getattr(target, part)
    return target, full, dict(only_kw)


def _outputs(value: Any) -> Any:
    """The op's result as the kernel path returns it: one array, or a tuple with one array per output."""
    return tuple(value) if isinstance(value, list) else value

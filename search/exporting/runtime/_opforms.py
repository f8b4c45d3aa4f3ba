"""The op path's closures, spelled out: each form a planned baseline takes (a call of inputs then constants, a
call of a call, ``silu(a) * b``, a residual plus a projection...) as one frame, no ``*`` call and no loop
where a built-in baseline needs none (host cost per call: benchmarks/op_path_host.py). Part of the
run-time dispatcher, copied verbatim into every exported package; standard library only."""

from __future__ import annotations

import operator
from typing import Any, Callable, Dict, List, Optional, Tuple


def _each_callable(fn: Callable[..., Any], fs: List[Callable[[Any], Any]], kw: Dict[str, Any]) -> Callable[[Any], Any]:
    """``fn`` of its arguments' closures, each evaluated per call (constants between arrays)."""
    return lambda ext: fn(*[f(ext) for f in fs], **kw)


def _silu_node(f: Callable[[Any], Any], sigmoid: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The vocabulary's silu, ``x * sigmoid(x)``, of a sub-expression, in one frame."""
    def silu(ext: Any) -> Any:
        x = f(ext)
        return x * sigmoid(x)
    return silu


def _silu_times(f: Callable[[Any], Any], g: Callable[[Any], Any],
                sigmoid: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``silu(f) * g`` (the vocabulary's silu, ``x * sigmoid(x)``) in one frame."""
    def silu_times(ext: Any) -> Any:
        x = f(ext)
        return x * sigmoid(x) * g(ext)
    return silu_times


#: One MLX call of values (``ext[i]`` of the slots) then constants: (function, slots, constants).
_Leaf = Tuple[Callable[..., Any], List[int], Tuple[Any, ...]]


def _swiglu_of_calls(a: Optional[_Leaf], b: Optional[_Leaf],
                     sigmoid: Callable[[Any], Any]) -> Optional[Callable[[Any], Any]]:
    """``silu(A) * B`` of two calls of the same form (SwiGLU's gate and up projections: four values and three
    constants, or, bound, one value and six) in one frame; None for other forms."""
    if a is None or b is None or len(a[1]) != len(b[1]) or len(a[2]) != len(b[2]):
        return None
    (f, i, c), (g, j, d) = a, b
    if len(i) == 4 and len(c) == 3:
        i0, i1, i2, i3, j0, j1, j2, j3 = *i, *j
        c0, c1, c2, d0, d1, d2 = *c, *d

        def swiglu4(ext: Any) -> Any:
            x = f(ext[i0], ext[i1], ext[i2], ext[i3], c0, c1, c2)
            return x * sigmoid(x) * g(ext[j0], ext[j1], ext[j2], ext[j3], d0, d1, d2)
        return swiglu4
    if len(i) == 1 and len(c) == 6:
        i0, j0 = i[0], j[0]
        c0, c1, c2, c3, c4, c5 = c
        d0, d1, d2, d3, d4, d5 = d

        def swiglu1(ext: Any) -> Any:
            x = f(ext[i0], c0, c1, c2, c3, c4, c5)
            return x * sigmoid(x) * g(ext[j0], d0, d1, d2, d3, d4, d5)
        return swiglu1
    return None


def _plus_call(sym: str, left: Tuple[str, Any], right: Tuple[str, Any],
               leaves: Dict[int, _Leaf]) -> Optional[Callable[[Any], Any]]:
    """``R + call`` (a residual added to a quantized projection: four values and three constants, or, bound, one
    value and six) in one frame; None for other forms."""
    if sym != "+" or left[0] != "slot" or right[0] != "fn" or id(right[1]) not in leaves:
        return None
    r, (f, i, c) = left[1], leaves[id(right[1])]
    if len(i) == 4 and len(c) == 3:
        i0, i1, i2, i3 = i
        c0, c1, c2 = c
        return lambda ext: ext[r] + f(ext[i0], ext[i1], ext[i2], ext[i3], c0, c1, c2)
    if len(i) == 1 and len(c) == 6:
        i0 = i[0]
        c0, c1, c2, c3, c4, c5 = c
        return lambda ext: ext[r] + f(ext[i0], c0, c1, c2, c3, c4, c5)
    return None


def _with_lets(lets: Tuple[Callable[[Any], Any], ...], f: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The op of a baseline with shared values, as a function of the call's arrays (a sequence): each shared value
    computed once, in order, after them (spelled out up to three: a loop costs more than the op's own calls)."""
    if len(lets) == 1:
        (a,) = lets

        def op1(xs: Any) -> Any:
            return f((*xs, a(xs)))
        return op1
    if len(lets) == 2:
        a, b = lets

        def op2(xs: Any) -> Any:
            ext = list(xs)
            ext.append(a(ext))
            ext.append(b(ext))
            return f(ext)
        return op2
    if len(lets) == 3:
        a, b, c = lets

        def op3(xs: Any) -> Any:
            ext = list(xs)
            ext.append(a(ext))
            ext.append(b(ext))
            ext.append(c(ext))
            return f(ext)
        return op3

    def op(xs: Any) -> Any:
        ext = list(xs)
        for let in lets:
            ext.append(let(ext))
        return f(ext)
    return op


def _with_ext(op: Callable[..., Any], ext: Callable[[Any], Any]) -> Callable[..., Any]:
    """``op`` (a function of the call's arrays) with ``op.ext``, the same op as a function of their tuple: the
    package's fast paths pass the tuple they hold (no ``*`` call, no frame that takes ``*arrays``)."""
    op.ext = ext  # type: ignore[attr-defined]
    return op


def _sequence(fs: List[Callable[[Any], Any]], as_tuple: bool) -> Callable[[Any], Any]:
    """A list (or the outputs' tuple) of sub-expressions, spelled out for two and three items."""
    if len(fs) == 2:
        f, g = fs
        return (lambda ext: (f(ext), g(ext))) if as_tuple else (lambda ext: [f(ext), g(ext)])
    if len(fs) == 3:
        f, g, h = fs
        return (lambda ext: (f(ext), g(ext), h(ext))) if as_tuple else (lambda ext: [f(ext), g(ext), h(ext)])
    if as_tuple:
        return lambda ext: tuple([f(ext) for f in fs])
    return lambda ext: [f(ext) for f in fs]


def _spelled_binary(sym: str, left: Tuple[str, Any], right: Tuple[str, Any]) -> Optional[Callable[[Any], Any]]:
    """``left + right`` or ``left * right`` of inputs, shared values (``ext[i]``), sub-expressions and numbers as
    Python spells them (no operator call); None for the other forms."""
    kinds, a, b = (left[0], right[0]), left[1], right[1]
    if sym == "+":
        if kinds == ("slot", "fn"):
            return lambda ext: ext[a] + b(ext)
        if kinds == ("fn", "slot"):
            return lambda ext: a(ext) + ext[b]
        if kinds == ("fn", "fn"):
            return lambda ext: a(ext) + b(ext)
        if kinds == ("slot", "slot"):
            return lambda ext: ext[a] + ext[b]
    if sym == "*":
        if kinds == ("const", "fn"):
            return lambda ext: a * b(ext)
        if kinds == ("fn", "fn"):
            return lambda ext: a(ext) * b(ext)
        if kinds == ("fn", "slot"):
            return lambda ext: a(ext) * ext[b]
        if kinds == ("slot", "fn"):
            return lambda ext: ext[a] * b(ext)
        if kinds == ("slot", "slot"):
            return lambda ext: ext[a] * ext[b]
    return None


def _spelled_call(fn: Callable[..., Any], slots: List[int], consts: Tuple[Any, ...]) -> Optional[Callable[[Any], Any]]:
    """``fn(ext[slots]..., constants...)`` spelled out for the calls the built-in baselines make (a call through
    ``*`` costs an MLX function ~0.1 us more than a plain positional one); None for the others."""
    n, k = len(slots), len(consts)
    c0, c1, c2, c3, c4, c5 = (*consts, None, None, None, None, None, None)[:6]
    if n == 1:
        i = slots[0]
        if k == 0:
            return lambda ext: fn(ext[i])
        if k == 1:
            return lambda ext: fn(ext[i], c0)
        if k == 2:
            return lambda ext: fn(ext[i], c0, c1)
        if k == 3:
            return lambda ext: fn(ext[i], c0, c1, c2)
        if k == 6:
            return lambda ext: fn(ext[i], c0, c1, c2, c3, c4, c5)
    if n == 2 and k <= 1:
        i, j = slots
        if k == 0:
            return lambda ext: fn(ext[i], ext[j])
        return lambda ext: fn(ext[i], ext[j], c0)
    if n == 3 and k == 1:
        i, j, m = slots
        return lambda ext: fn(ext[i], ext[j], ext[m], c0)
    if n == 4 and k == 3:
        i, j, m, o = slots
        return lambda ext: fn(ext[i], ext[j], ext[m], ext[o], c0, c1, c2)
    return None


def _node_then_slots(fn: Callable[..., Any], f: Callable[[Any], Any], slots: List[int],
                     consts: Tuple[Any, ...]) -> Callable[[Any], Any]:
    """``fn(f(ext), ext[slots]..., constants...)``: a call of a sub-expression and inputs, one frame."""
    if len(slots) == 3 and len(consts) == 3:  # qmm(rms_norm(X), W, S, B, transpose, group size, bits)
        i, j, k = slots
        c, d, e = consts
        return lambda ext: fn(f(ext), ext[i], ext[j], ext[k], c, d, e)
    if not slots and len(consts) == 6:  # the same with the weights bound
        c, d, e, g, h, m = consts
        return lambda ext: fn(f(ext), c, d, e, g, h, m)
    if not slots:
        return lambda ext: fn(f(ext), *consts)
    if len(slots) == 1:
        i = slots[0]
        return lambda ext: fn(f(ext), ext[i], *consts)
    get = operator.itemgetter(*slots)
    return lambda ext: fn(f(ext), *get(ext), *consts)


def _star_root(pieces: Optional[Tuple[str, Any]]) -> Optional[Callable[..., Any]]:
    """The root node as a function of the call's arrays themselves (its frame is the op's): a two-operand
    node, or a call of a sub-expression and inputs; None for other roots."""
    if pieces is None:
        return None
    kind, parts = pieces
    if kind == "bin":
        op, f, g = parts

        def op_bin(*ext: Any) -> Any:
            return op(f(ext), g(ext))
        return op_bin
    fn, f, slots, consts = parts
    if not slots:  # the others constants (a bound call's weights)
        def op_node(*ext: Any) -> Any:
            return fn(f(ext), *consts)
        return op_node
    if len(slots) == 1:
        i = slots[0]

        def op_one(*ext: Any) -> Any:
            return fn(f(ext), ext[i], *consts)
        return op_one
    get = operator.itemgetter(*slots)

    def op_call_node(*ext: Any) -> Any:
        return fn(f(ext), *get(ext), *consts)
    return op_call_node


def _plain_call(fn: Callable[..., Any], consts: Tuple[Any, ...], kw: Dict[str, Any], n: int = 0) -> Callable[..., Any]:
    """``fn(inputs in order..., constants...)``: the MLX function itself, or one frame around it."""
    if not consts and not kw:
        return fn
    if kw == {"precise": True} and n == 1 and len(consts) == 1:  # softmax(x, axis, precise=True), spelled out
        (axis,) = consts

        def op_precise(x: Any) -> Any:
            return fn(x, axis, precise=True)
        return _with_ext(op_precise, lambda xs: fn(xs[0], axis, precise=True))
    if not kw:
        op = _spelled_plain(fn, consts, n)
        op.direct = (fn, consts)  # type: ignore[attr-defined]
        return op

    def op_kw(*xs: Any) -> Any:
        return fn(*xs, *consts, **kw)
    return op_kw


def _spelled_plain(fn: Callable[..., Any], consts: Tuple[Any, ...], n: int) -> Callable[..., Any]:
    """``fn(arrays..., constants...)`` as a function of the arrays: spelled out for one array and up to three
    constants (a bound weight, a norm's epsilon), which is what a bound call of a one-call op runs per call."""
    k = len(consts)
    if n == 1 and k == 1:
        (c0,) = consts

        def op1(x: Any) -> Any:
            return fn(x, c0)
        return op1
    if n == 1 and k == 2:
        c0, c1 = consts

        def op2(x: Any) -> Any:
            return fn(x, c0, c1)
        return op2
    if n == 1 and k == 3:
        c0, c1, c2 = consts

        def op3(x: Any) -> Any:
            return fn(x, c0, c1, c2)
        return op3

    def op(*xs: Any) -> Any:
        return fn(*xs, *consts)
    return op


def _slot_call(fn: Callable[..., Any], slots: List[int], consts: Tuple[Any, ...],
               kw: Dict[str, Any]) -> Callable[[Any], Any]:
    """A call whose array arguments are the call's inputs (or shared values) and whose others are constants."""
    if kw:
        get = operator.itemgetter(*slots) if len(slots) > 1 else (lambda ext, i=slots[0]: (ext[i],))
        return lambda ext: fn(*get(ext), *consts, **kw)
    spelled = _spelled_call(fn, slots, consts)
    if spelled is not None:
        return spelled
    if len(slots) == 1:
        i = slots[0]
        return (lambda ext: fn(ext[i], *consts)) if consts else (lambda ext: fn(ext[i]))
    get = operator.itemgetter(*slots)
    return (lambda ext: fn(*get(ext), *consts)) if consts else (lambda ext: fn(*get(ext)))


def _arg_call(fn: Callable[..., Any], fs: List[Callable[[Any], Any]], consts: Tuple[Any, ...],
              kw: Dict[str, Any]) -> Callable[[Any], Any]:
    """A call whose array arguments are sub-expressions (one frame each), then constants."""
    if len(fs) == 1 and not kw:
        f = fs[0]
        return lambda ext: fn(f(ext), *consts)
    if len(fs) == 2 and not kw:
        f, g = fs
        return lambda ext: fn(f(ext), g(ext), *consts)
    if len(fs) == 1 and not consts and list(kw) == ["axis"]:  # concatenate([...], axis=0)
        f, axis = fs[0], kw["axis"]
        return lambda ext: fn(f(ext), axis=axis)
    return lambda ext: fn(*[f(ext) for f in fs], *consts, **kw)


def _direct_form(op: Callable[..., Any]) -> Tuple[Callable[..., Any], Optional[Tuple[Any, ...]]]:
    """(function, constants) with ``function(*arrays, *constants)`` the same call as ``op(*arrays)``: a planned
    op of one MLX call (:func:`_plain_call`) is called without its frame; or (function, None) with
    ``function(arrays)`` the same call, the arrays' tuple passed as it is (``op.ext``: no ``*`` call)."""
    direct: Optional[Tuple[Callable[..., Any], Tuple[Any, ...]]] = getattr(op, "direct", None)
    if direct is not None:
        return direct
    ext: Optional[Callable[[Any], Any]] = getattr(op, "ext", None)
    return (ext, None) if ext is not None else (op, ())


def _entry(f: Callable[[Any], Any]) -> Callable[..., Any]:
    def op(*xs: Any) -> Any:
        return f(xs)
    return op

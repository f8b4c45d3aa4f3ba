"""Run-time dispatch of an exported kernsearch package (copied verbatim into every exported package).

Depends on ``mlx`` only (plus the standard library): it must import and give correct results anywhere
MLX does, GPU or not. For each call it picks, for the running chip, the kernel through a fallback chain
— exact chip → same generation and die → same generation → the family's default config → the plain MLX
op — and, within a chip level, an artifact judged at the call's shape whose config is valid for it (the
family's constraints, evaluated here). A level is taken only with measured evidence that the kernel beats the
MLX op on that chip as consumers call it, through this file's own planned calls, in graph and eager use (see
LEVELS below); otherwise the MLX op runs, called directly with its constant arguments bound. Spec expressions arrive
pre-parsed as small JSON trees and are evaluated by ``_rules.evaluate`` (a closed set of operators and
functions; never Python's ``eval``).

The rules this file applies (targets, beating the op, the timing identity, chip identification, hashes, the
expression evaluator, the baseline vocabulary) are kernsearch's own: ``_rules.py`` and ``_vocabulary.py`` ship
beside this file, byte for byte the modules kernsearch itself imports, so nothing here restates them.
Every kernel file's hash is checked before it is used; each kernel is built once per process. Before an
artifact is first used, its shipped manifest and files must hash to the content hash the store recorded at
publish and its dispatch record must say what its manifest says (:func:`artifact_mismatch`).
"""

from __future__ import annotations

import functools
import json
import math
import operator
import os
import re
import warnings
import weakref
from dataclasses import dataclass, field
from itertools import chain as _chain
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

try:  # an exported package: the shared modules sit beside this file
    from ._rules import (  # type: ignore[import-not-found,unused-ignore]
        BINARY,
        DEFAULT_MARGIN,
        FUNCTIONS,
        KEYWORDS,
        SHARED_MEMORY_AT_BUILD,
        UNARY,
        VENDOR_TARGETS,
        ExpressionError,
        beats_op,
        consumer_low,
        content_sha256,
        cuda_driver_version,
        dispatch_figures,
        evaluate,
        identify,
        identity_changes,
        kernel_factory,
        kernel_text,
        lineage,
        mlx_namespace,
        modes_text,
        names_in,
        nvrtc_version,
        source_sha256,
        speedup_text,
        timing_identity,
    )
    from ._vocabulary import CONSUMER_MODES, Evidence  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # kernsearch itself: the same modules, at the bottom of its package
    from ..._rules import (
        BINARY,
        DEFAULT_MARGIN,
        FUNCTIONS,
        KEYWORDS,
        SHARED_MEMORY_AT_BUILD,
        UNARY,
        VENDOR_TARGETS,
        ExpressionError,
        beats_op,
        consumer_low,
        content_sha256,
        cuda_driver_version,
        dispatch_figures,
        evaluate,
        identify,
        identity_changes,
        kernel_factory,
        kernel_text,
        lineage,
        mlx_namespace,
        modes_text,
        names_in,
        nvrtc_version,
        source_sha256,
        speedup_text,
        timing_identity,
    )
    from ..._vocabulary import CONSUMER_MODES, Evidence

#: 3: each artifact record carries ``manifest`` and ``content_sha256``, checked before first use.
FORMAT = 3
#: ``off`` (or 0/no/false): every call uses the plain MLX op; ``modeled``: modeled artifacts may be used too.
DISABLE_VAR = "KERNSEARCH_KERNELS"
#: Names kernsearch and its tests read off this module (defined in ``_rules``).
__all__ = ["CONSUMER_MODES", "DEFAULT_MARGIN", "FUNCTIONS", "SHARED_MEMORY_AT_BUILD", "VENDOR_TARGETS",
           "Decision", "Dispatcher", "ExpressionError", "artifact_mismatch", "beats_op", "consumer_low",
           "content_sha256", "cuda_driver_version", "decision_fields", "evaluate", "identify", "kernel_call",
           "lineage", "mlx_vocabulary", "modes_text", "nvrtc_version", "op_call", "shape_refusal", "source_sha256",
           "speedup_text", "timing_identity", "violation", "weights_refusal"]
#: The MLX meaning of the names a baseline may call (``_rules.mlx_namespace``).
mlx_vocabulary = mlx_namespace


def kernel_call(kernel: Any, template: Sequence[Any], grid: Tuple[int, ...], threadgroup: Tuple[int, ...],
                output_shapes: Sequence[Tuple[int, ...]], output_dtypes: Sequence[Any], params: Sequence[Any] = (),
                transpose: Sequence[bool] = (), init_value: Optional[float] = None) -> Callable[..., Any]:
    """The call of a built kernel object as a function of the inputs' arrays, everything else bound, compiled
    once with ``mx.compile``: a call re-runs a recorded graph instead of building the kernel's arguments (and
    its generated source) again, a few microseconds of host time per call. ``transpose``: inputs the kernel
    takes transposed (its layout differs from the caller's), transposed inside the call (so it is paid)."""
    import mlx.core as mx

    extra = {} if init_value is None else {"init_value": float(init_value)}
    template, grid, threadgroup = list(template), tuple(grid), tuple(threadgroup)
    output_shapes, output_dtypes, params = [tuple(s) for s in output_shapes], list(output_dtypes), list(params)
    flips = list(transpose)
    single = len(output_shapes) == 1

    def launch(*arrays: Any) -> Any:
        inputs = [mx.transpose(a) if i < len(flips) and flips[i] else a for i, a in enumerate(arrays)] + params
        outputs = kernel(inputs=inputs, template=template, grid=grid, threadgroup=threadgroup,
                         output_shapes=output_shapes, output_dtypes=output_dtypes, **extra)
        return outputs[0] if single else tuple(outputs)

    compiled: Callable[..., Any] = mx.compile(launch)
    return compiled


# -- the op path: the baseline's MLX ops, called as a consumer writes them --------------------------------

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


def _each_callable(fn: Callable[..., Any], fs: List[Callable[[Any], Any]], kw: Dict[str, Any]) -> Callable[[Any], Any]:
    """``fn`` of its arguments' closures, each evaluated per call (constants between arrays)."""
    return lambda ext: fn(*[f(ext) for f in fs], **kw)


#: What :func:`_planned` answers where the call's arrays are not those its entry planned for.
_MISS = object()


def _planned(entry: List[Any], arrays: Sequence[Any], a0: int, a1: int) -> Any:
    """The planned call's result where the call's weights are the entry's and its activations' shapes (and dtypes)
    those it was planned for; :data:`_MISS` otherwise (or for arrays that are not MLX's: the call converts them)."""
    for i, ref in entry[0]:
        if ref() is not arrays[i]:
            return _MISS
    shapes = entry[5]
    try:
        if shapes is None:  # more than two activations
            same = all(arrays[i].shape == shape and (dtype is None or arrays[i].dtype == dtype)
                       for i, shape, dtype in entry[1])
        else:
            same = ((arrays[a0].shape == shapes) if a1 < 0 else
                    (arrays[a0].shape == shapes[0] and arrays[a1].shape == shapes[1])) and \
                (entry[6] is None or _same_dtypes(arrays, a0, a1, entry[6]))
        if not same:
            return _MISS
        consts = entry[3]
        return entry[2](arrays) if consts is None else entry[2](*arrays, *consts)
    except (AttributeError, TypeError):  # not MLX arrays: converted there
        return _MISS


def _file_activations(entry: List[Any], fam: Dict[str, Any], arrays: Sequence[Any], dtypes: bool) -> None:
    """An entry's activations: (position, shape, dtype) each, and for one or two of them their shapes (and dtypes,
    where a kernel may run) as :func:`_planned` compares them without a loop."""
    entry[1] = tuple((i, arrays[i].shape, arrays[i].dtype if dtypes else None)
                     for i, spec in enumerate(fam["inputs"]) if not spec.get("weight"))
    one = len(entry[1]) == 1
    entry[5] = (entry[1][0][1] if one else tuple(s for _, s, _ in entry[1])) if len(entry[1]) <= 2 else None
    entry[6] = (entry[1][0][2] if one else tuple(t for _, _, t in entry[1])) if dtypes else None


def _children(t: Any) -> List[Any]:
    """The sub-expressions of a node (a call's arguments and keyword values, a list's items...)."""
    kind = t[0]
    if kind == "call":
        return [*t[2], *(t[3] or {}).values()]
    if kind in ("list", "tuple"):
        return list(t[1])
    return [c for c in t[1:] if isinstance(c, list) and c and isinstance(c[0], str)]


def _reachable(a: Dict[str, Any], fam: Dict[str, Any], chip: Dict[str, Any]) -> bool:
    """Whether a level of the chain could take artifact ``a`` on ``chip`` at all: its own chip's, or, where the
    family allows transferring a kernel, one of the same generation (the default config's proof is this chip's)."""
    if a["chip"] == chip["name"]:
        return True
    running, theirs = lineage(chip), tuple(a["lineage"])
    return bool(fam.get("transfer")) and any(r is not None and r == t for r, t in zip(running[:2], theirs[:2]))


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


MAX_DECISIONS = 4096
LEVELS = ("exact chip", "same generation and die", "same generation", "family default", "mlx op")
# Dispatch rules (docs/artifacts.md): a level uses an artifact only with measured evidence, on that chip, that
# it beats the MLX op by more than the margin (modeled ones only when the consumer opts in; interpreted ones
# never); other chips' artifacts only for families that allow the transfer; a kernel only at a shape it was judged
# at (timed against the op as consumers call it); the family default only where a measured artifact shows the
# default config beating the op on this chip at this shape; a measured artifact is void when the toolchain that
# timed it changed.


def _outputs(value: Any) -> Any:
    """The op's result as the kernel path returns it: one array, or a tuple with one array per output."""
    return tuple(value) if isinstance(value, list) else value


# -- decisions -------------------------------------------------------------------------------------------

@dataclass
class Decision:
    """Which kernel (or fallback) a call uses, and why."""

    family: str
    level: str
    chip: str
    shape: Tuple[int, ...]
    dtype: str
    entry: Optional[Dict[str, Any]] = None  # the artifact or default kernel chosen (None: the MLX op)
    why: List[str] = field(default_factory=list)

    @property
    def artifact(self) -> Optional[str]:
        """``key/version`` of the chosen artifact, None for the default config or the MLX op."""
        if self.entry and "key" in self.entry:
            return f"{self.entry['key']}/{self.entry['version']}"
        return None

    @property
    def config(self) -> Optional[Dict[str, Any]]:
        return dict(self.entry["config"]) if self.entry else None

    def __str__(self) -> str:
        what = self.artifact or ("default config" if self.entry else "plain MLX op")
        lines = [f"{self.family} {'x'.join(map(str, self.shape))} {self.dtype} on {self.chip}: "
                 f"{self.level} -> {what}"]
        return "\n".join(lines + [f"  - {w}" for w in self.why])


class Dispatcher:
    """Loads an exported package's dispatch table and runs its families."""

    def __init__(self, root: Path, device_info: Optional[Dict[str, Any]] = None) -> None:
        self.root = Path(root)
        self.table = json.loads((self.root / "dispatch.json").read_text(encoding="utf-8"))
        if self.table.get("format") != FORMAT:
            raise RuntimeError(f"{self.root}: dispatch table format {self.table.get('format')!r} is not {FORMAT}")
        self._device_info = device_info
        self._decisions: Dict[Any, Decision] = {}
        self._plans: Dict[Any, Callable[..., Any]] = {}
        #: family -> [mode, op]: how its calls with no chip run on this chip (:meth:`_mode`), decided on the first.
        self._how: Dict[str, List[Any]] = {}
        self._sources: Dict[Tuple[str, str, str], Optional[Dict[str, Any]]] = {}
        self._kernels: Dict[Any, Any] = {}
        self._refused: Dict[Tuple[str, str, str], str] = {}
        #: id(artifact record) -> (the record, '' or why its integrity check failed): :meth:`_integrity`.
        self._verdicts: Dict[int, Tuple[Dict[str, Any], str]] = {}
        self.margin = float(self.table.get("margin", DEFAULT_MARGIN))
        #: This process's timing identity (``timing_identity(...)``); None: detected on first use.
        self.toolchain: Optional[Dict[str, Optional[str]]] = None
        #: Builds a kernel object from a source record; tests may replace it.
        self.kernel_factory: Callable[[Dict[str, Any], int], Any] = _mlx_kernel
        #: Families with weights and activations -> the last weight's position: a plain call with weight arrays seen
        #: before is planned by its activations alone (:meth:`_remember_weights`).
        self._keyed = {name: max(i for i, spec in enumerate(fam["inputs"]) if spec.get("weight"))
                       for name, fam in self.table["families"].items()
                       if any(spec.get("weight") for spec in fam["inputs"])
                       and not all(spec.get("weight") for spec in fam["inputs"])}
        #: family -> {id of the last weight: [((position, weak reference) of each other weight), ((position, shape,
        #: dtype or None) of each activation last planned with them), that plan as (function, constants appended to
        #: the call's arrays), weak reference to the last weight, the activations' shapes (one, or two; else None),
        #: their dtypes where a kernel may run (else None), the other weights' references alone, in order (the
        #: fronts')]} (a table per family: a call's key is one integer).
        #: The entry goes when any of its weights dies, so a live entry's key is its last weight's identity: only
        #: the others are compared.
        self._by_weights: Dict[str, Dict[int, List[Any]]] = {}

    # -- the running chip --------------------------------------------------------------------------------
    def running_chip(self, chip: Any = None) -> Tuple[Dict[str, Any], str]:
        """(chip record, target) for an injected identity or the device MLX runs on; target "" = none."""
        registry = self.table["chips"]
        if isinstance(chip, dict):
            record = identify(chip, registry)
        elif isinstance(chip, str):
            wanted = re.sub(r"[\s_\-]+", "", chip).lower()
            found = next((dict(c) for c in registry
                          if re.sub(r"[\s_\-]+", "", c["name"]).lower() == wanted), None)
            if found is None:
                raise ValueError(f"unknown chip {chip!r}")
            record = found
        else:
            info = self._device_info
            if info is None:
                info = _device_info()
            record = identify(info if _gpu_available() else {}, registry)
        target = VENDOR_TARGETS.get(record.get("vendor", ""), "")
        return record, target

    # -- choosing --------------------------------------------------------------------------------------
    def decide(self, family: str, shapes: Sequence[Sequence[int]], dtype: str, chip: Any = None,
               modeled: bool = False) -> Decision:
        """``modeled``: also use modeled (never measured) artifacts, as ``KERNSEARCH_KERNELS=modeled`` does."""
        fam = self._family(family)
        record, target = self.running_chip(chip)
        modeled = modeled or os.environ.get(DISABLE_VAR, "").lower() == Evidence.MODELED
        if os.environ.get(DISABLE_VAR, "").lower() in ("0", "off", "no", "false"):
            dims, _ = _bind_dims(fam, shapes)
            decision = Decision(family, LEVELS[4], record["name"], tuple((dims or {}).values()), dtype)
            decision.why.append(f"tuned kernels switched off ({DISABLE_VAR}={os.environ[DISABLE_VAR]})")
            return decision
        cache_key = (family, tuple(tuple(s) for s in shapes), dtype, record["name"], target, modeled)
        if cache_key in self._decisions:
            return self._decisions[cache_key]
        decision = self._decide(fam, family, shapes, dtype, record, target, modeled)
        if len(self._decisions) >= MAX_DECISIONS:  # many distinct shapes: start over rather than grow
            self._decisions.clear()
        self._decisions[cache_key] = decision
        return decision

    def _decide(self, fam: Dict[str, Any], family: str, shapes: Sequence[Sequence[int]], dtype: str,
                chip: Dict[str, Any], target: str, modeled: bool = False) -> Decision:
        dims, problem = _bind_dims(fam, shapes)
        shape = tuple(dims[d] for d in fam["dims"]) if dims else tuple()
        decision = Decision(family, LEVELS[4], chip["name"], shape, dtype)
        why = decision.why
        if dims is None:
            why.append(f"inputs do not match the family's inputs ({problem})")
            return decision
        if dtype not in fam["dtypes"]:
            why.append(f"dtype {dtype} is not one the family supports ({', '.join(fam['dtypes'])})")
            return decision
        if not target:
            why.append(f"no GPU back-end here (chip {chip['name']}): custom kernels need Metal or CUDA")
            return decision
        op = fam.get("baseline_name", "the MLX op")
        pool = [a for a in fam["artifacts"] if a["dtype"] == dtype and a["target"] == target]
        running = lineage(chip)
        tests: Tuple[Callable[[Dict[str, Any]], bool], ...] = (
            lambda a: bool(a["chip"] == chip["name"]),
            lambda a: running[1] is not None and tuple(a["lineage"])[1] == running[1],
            lambda a: running[0] is not None and tuple(a["lineage"])[0] == running[0])
        seen: Set[int] = set()
        for level, matches in zip(LEVELS[:3], tests):
            here = [a for a in pool if matches(a) and id(a) not in seen]
            seen.update(id(a) for a in here)
            if not here:
                why.append(f"{level}: no {target} {dtype} artifact")
                continue
            if level != LEVELS[0] and not fam.get("transfer"):
                why.append(f"{level}: {len(here)} artifact(s) of other chips skipped: the family does not allow "
                           "transferring a kernel between chips")
                continue
            valid, reasons = [], []
            for a in here:
                bad = self._unusable(a, fam, dims, shape, chip, dtype, op, modeled)
                (reasons.append(f"{a['key']}/{a['version']} skipped: {bad}") if bad else valid.append(a))
            if not valid:
                why.append(f"{level}: " + "; ".join(reasons))
                continue
            best = min(valid, key=lambda a: a.get("median_ms") or math.inf)
            decision.level, decision.entry = level, best
            why.append(f"{level}: {best['key']}/{best['version']} taken: {self._evidence_text(best, op, fam)}, tuned "
                       f"for {'x'.join(map(str, best['shape']))}, nearest valid of {len(valid)}"
                       + (f"; passed over: {'; '.join(reasons)}" if reasons else ""))
            self._layout_note(decision, fam, dims, chip)
            return decision
        # The untuned default config runs only where a measured artifact shows it beating the op here.
        default = fam["default"]["kernels"].get(f"{target}:{dtype}")
        proof = [a for a in pool if a["chip"] == chip["name"] and a["config"] == fam["default"]["config"]
                 and not self._unusable(a, fam, None, shape, chip, dtype, op, False)]  # at this shape
        if default is None:
            why.append(f"family default: no {target} {dtype} kernel in this package")
        elif not proof:
            why.append(f"family default: skipped: no measured evidence that the default config beats {op} on "
                       f"{chip['name']}")
        else:
            bad = violation(fam, fam["default"]["config"], dims, chip, dtype) or self._refusal(default)
            if bad:
                why.append(f"family default: skipped: {bad}")
            else:
                decision.level, decision.entry = LEVELS[3], default
                why.append(f"family default: taken: {proof[0]['key']}/{proof[0]['version']} measured the default "
                           f"config at {self._evidence_text(proof[0], op, fam)}")
                self._layout_note(decision, fam, dims, chip)
                return decision
        why.append(f"mlx op: {op}")
        return decision

    @staticmethod
    def _layout_note(decision: Decision, fam: Dict[str, Any], dims: Optional[Dict[str, int]],
                     chip: Dict[str, Any]) -> None:
        """Which layout the chosen kernel expects: the inputs it takes pre-transposed (e.g. qmatvec's
        LAYOUT_Q=cols: packed words, scales and biases as [K*BITS/32, N]) and the packing applied to them."""
        if decision.entry is None or dims is None:
            return
        try:
            names = _context(fam, decision.entry["config"], dims, chip, decision.dtype)
            moved = [spec["name"] for spec in fam["inputs"]
                     if spec["transposed"] is not None and bool(evaluate(spec["transposed"], names))]
        except Exception:  # noqa: BLE001 - the note is informative; the launch re-evaluates and reports
            return
        layout = ", ".join(f"{k}={v}" for k, v in decision.entry["config"].items() if "LAYOUT" in k)
        if moved:
            decision.why.append(f"layout ({layout}): the kernel takes {', '.join(moved)} transposed (contiguous); "
                                "packing: mx.transpose of each, applied by this package on every call (pack once "
                                "and cache the result where the weights are constant)")
        elif layout:
            decision.why.append(f"layout ({layout}): inputs as given (MLX's own layout)")

    def _unusable(self, a: Dict[str, Any], fam: Dict[str, Any], dims: Optional[Dict[str, int]],
                  shape: Tuple[int, ...], chip: Dict[str, Any], dtype: str, op: str, modeled: bool) -> str:
        """'' if artifact ``a`` may run this call, else why not (the rules of docs/artifacts.md)."""
        if a.get("invalidated"):  # declined before anything is read: its kernel files were never shipped
            return f"invalidated: {a['invalidated']}"
        tampered = self._integrity(a)
        if tampered:
            return f"refused: {tampered}"
        evidence = a.get("evidence")
        if evidence == Evidence.INTERPRETED:
            return "interpreted (correctness only): never dispatched"
        if evidence == Evidence.MODELED and not modeled:
            return (f"modeled, not measured: never shown to beat {op} (opt in with {DISABLE_VAR}=modeled)")
        if evidence == Evidence.MEASURED:
            low = consumer_low(a.get("modes"), fam.get("modes") or CONSUMER_MODES)
            if low is None and a.get("modes"):
                judged = " and ".join(fam.get("modes") or CONSUMER_MODES)
                return (f"not timed in {judged} mode, which judges this family (it has "
                        f"{modes_text(a['modes'], sorted(a['modes']))}): re-time it (benchmarks/gpu_rejudge.py)")
            if low is None:
                old = speedup_text(a.get("speedup"), a.get("speedup_low"), a.get("speedup_high"))
                return (f"measured by separate launches, not as consumers call it ({old}): re-judge it "
                        "(kernsearch artifacts rejudge)")
            if not beats_op(low, self.margin):
                return self._evidence_text(a, op, fam)
            changed = self._toolchain_change(a.get("timing_identity") or {})
            if changed:
                return f"measured with another toolchain ({changed}): its timing no longer holds"
        elif evidence != Evidence.MODELED:
            return f"unknown evidence kind {evidence!r}"
        if shape and tuple(a["shape"]) != tuple(shape):
            return (f"judged at {'x'.join(map(str, a['shape']))}, not at {'x'.join(map(str, shape))} (a kernel runs "
                    "only at a shape it was measured to win at)")
        if dims is not None:
            bad = violation(fam, a["config"], dims, chip, dtype) or self._refusal(a)
            if bad:
                return bad
        return ""

    @staticmethod
    def _evidence_text(a: Dict[str, Any], op: str, fam: Optional[Dict[str, Any]] = None) -> str:
        if a.get("evidence") == Evidence.MEASURED:
            modes = (fam or {}).get("modes") or CONSUMER_MODES
            return f"{modes_text(a.get('modes'), modes)} of {op} (measured as consumers call it)"
        return f"{a.get('evidence')} (opted in; not measured)"

    def _toolchain_change(self, recorded: Dict[str, Any]) -> str:
        """What differs between the toolchain an artifact was timed with and this process's ('' if nothing)."""
        here = self.toolchain if self.toolchain is not None else _running_toolchain()
        return ", ".join(identity_changes(recorded, here))

    def _integrity(self, a: Dict[str, Any]) -> str:
        """'' if artifact ``a`` is what the store recorded at publish (:func:`artifact_mismatch`), checked on its
        first use in this process; else why not (with a ``RuntimeWarning``): a forged record is never used."""
        seen = self._verdicts.get(id(a))
        if seen is None or seen[0] is not a:
            why = artifact_mismatch(self.root, a)
            if why:
                warnings.warn(f"artifact {str(a.get('key'))[:200]}/{str(a.get('version'))[:20]}: {why}; not used",
                              RuntimeWarning, stacklevel=5)
            seen = self._verdicts[id(a)] = (a, why)
        return seen[1]

    def _refusal(self, entry: Dict[str, Any]) -> str:
        """'' if the entry's kernel files are intact, else why it is refused."""
        return "" if self._source(entry) is not None else f"refused: {self._refused[_files(entry)]}"

    def _source(self, entry: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """The kernel's source record, read once per pair of files and hash-checked; None (with a
        warning) if tampered. The verdict belongs to the files: one tampered copy of a kernel never
        refuses an intact copy elsewhere, and a tampered copy is never shown usable."""
        sha = entry["sha256"]
        where = _files(entry)
        if where not in self._sources:
            record = None
            try:
                header = _read_inside(self.root, entry["header"])
                source = _read_inside(self.root, entry["source"])
                k = entry["kernel"]
                actual = source_sha256(header, source, k["template"], k["input_names"], k["output_names"])
                if actual != sha:
                    self._refused[where] = f"source hash mismatch ({actual[:12]}, expected {sha[:12]})"
                else:
                    record = {**k, "header": header, "source": source, "sha256": sha}
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                self._refused[where] = f"cannot read kernel files ({exc})"
            if record is None:
                warnings.warn(f"kernel {entry.get('key', 'default')} {sha[:12]}: {self._refused[where]}; "
                              "falling back", RuntimeWarning, stacklevel=4)
            self._sources[where] = record
        return self._sources[where]

    # -- running ---------------------------------------------------------------------------------------
    def explain(self, family: str, *arrays: Any, chip: Any = None, modeled: bool = False) -> Decision:
        """Which artifact (or fallback) ``family(*arrays)`` would use here (or on ``chip``), and why."""
        return self.decide(family, [tuple(a.shape) for a in arrays], _dtype_name(arrays, self._family(family)),
                           chip, modeled)

    def call(self, family: str, *arrays: Any, chip: Any = None, modeled: bool = False) -> Any:
        """``family(*arrays)`` with the kernel :meth:`explain` names (or the MLX op).

        The decision and everything the launch needs (grid, templates, output shapes, the built kernel) are
        planned once per (family, shapes, dtypes, chip, opt-ins) and reused: a call that was planned before
        costs a dictionary look-up on top of the op or kernel it runs (the exported functions, :meth:`function`,
        skip even that where they can). Where no kernel of the family can run on this chip (:meth:`_mode`), a
        call with no chip is the op, whatever the opt-ins say.
        """
        flag = _ENV.get(_ENV_KEY)  # raw: no decoding here
        plain = flag is None and chip is None and not modeled
        mode = None
        if chip is None:
            mode, op, consts = self._mode(family)
            if op is not None:  # the op for every call: without building a key
                try:
                    return op(arrays) if consts is None else op(*arrays, *consts)
                except TypeError:  # not MLX arrays (the op takes only those): the planned path converts them
                    pass
            plain = plain or mode is _OP_PLANNED
        key = _call_key(family, chip, modeled, flag, arrays)
        plan = self._plans.get(key) if key is not None else None
        if plan is None:
            plan = self._plan(family, arrays, chip, modeled)
            if key is not None:
                if len(self._plans) >= MAX_DECISIONS:
                    self._plans.clear()
                self._plans[key] = plan
        if key is not None and plain and family in self._keyed:
            self._remember_weights(family, arrays, plan, mode is not _OP_PLANNED)  # (the fast path missed)
        return plan(*arrays)

    def _mode(self, family: str) -> List[Any]:
        """``[mode, op, constants]``: how a call of ``family`` with no chip runs here, decided on its first call,
        once per process. ``_OP``: no artifact of the family can run on this chip, under any opt-in (every level and
        the default-config proof draw from those), and its op needs nothing of the shape: ``op(*arrays,
        *constants)`` is the MLX op for every call. ``_OP_PLANNED``: no artifact can run either, but the op's
        constants or the family's range depend on the shape: planned per shape (the range checked once per shape),
        the opt-ins never read.
        ``_KERNELS``: an artifact may run at some shape: every call is planned and reads the opt-ins."""
        how = self._how_cell(family)
        if how[0] is None:
            import mlx.core as mx

            fam = self._family(family)
            record, target = self.running_chip()
            name = fam.get("baseline_name", "the MLX op")
            if target and any(not self._unusable(a, fam, None, (), record, a["dtype"], name, True)
                              for a in fam["artifacts"] if a["target"] == target and _reachable(a, fam, record)):
                how[:] = [_KERNELS, None, ()]
            elif names_in(fam["baseline"]) & set(fam["dims"]) or _range_rules(fam):
                how[:] = [_OP_PLANNED, None, ()]
            else:
                how[:] = [_OP, *_direct_form(op_call(fam, None, self._functions(fam, mx), mx))]
        return how

    def function(self, family: str) -> Callable[..., Any]:
        """``family`` as the package exports it: :meth:`call`, with its fast paths in one closure (no bound method,
        no attribute look-ups): where no kernel of the family can run here, the op (no opt-in read); with weights
        seen before, the plan of their last activation shapes (a check of the activations alone); else
        :meth:`call`. How a family runs here is decided on its first call (:meth:`_mode`)."""
        fam = self._family(family)
        call, env, env_key = self.call, _ENV, _ENV_KEY
        table = self._by_weights.setdefault(family, {})
        arity = len(fam["inputs"])
        last = self._keyed.get(family, 0)  # the last weight's position (no weights and activations: its table is empty)
        how = self._how_cell(family)
        acts = [i for i, spec in enumerate(fam["inputs"]) if not spec.get("weight")] + [-1, -1]
        a0, a1 = acts[0], (acts[1] if len(acts) == 4 else -1)  # one or two activations: checked without a loop

        def run(*arrays: Any, modeled: bool = False) -> Any:
            mode = how[0]
            if mode is not _OP_PLANNED:
                if mode is _OP:
                    consts = how[2]
                    try:
                        return how[1](arrays) if consts is None else how[1](*arrays, *consts)
                    except TypeError:  # not MLX arrays: the planned path converts them
                        return call(family, *arrays, modeled=modeled)
                if modeled or env.get(env_key) is not None:
                    return call(family, *arrays, modeled=modeled)
            if len(arrays) == arity:
                entry = table.get(id(arrays[last]))
                if entry is not None:  # the weights' identity, then the activations' shapes (and dtypes)
                    out = _planned(entry, arrays, a0, a1)
                    if out is not _MISS:
                        return out
            return call(family, *arrays, modeled=modeled)

        run.__name__ = family
        return _fronted(run, how, table, env, env_key, (a0, a1, last, arity))

    def _how_cell(self, family: str) -> List[Any]:
        """The family's ``[mode, op, constants]`` list (:meth:`_mode` fills it in place on the first call)."""
        how = self._how.get(family)
        if how is None:
            how = self._how[family] = [None, None, ()]
        return how

    def _remember_weights(self, family: str, arrays: Sequence[Any], plan: Callable[..., Any],
                          dtypes: bool = True) -> None:
        """File ``plan`` under the identity of the call's weights (held weakly: a dead weight drops its entry),
        so a later call with the same weight arrays is planned by its activations' shapes (and dtypes, where a
        kernel may run) alone."""
        fam = self._family(family)
        if len(arrays) != len(fam["inputs"]):  # not a call of the family's arity: nothing filed
            return
        last = self._keyed[family]
        try:
            key = id(arrays[last])  # all the weights are checked (weakly held) on every hit
            table = self._by_weights.setdefault(family, {})
            if len(table) >= MAX_DECISIONS:
                table.clear()
            forget = functools.partial(_forget, table, key)
            entry = table.get(key)
            weights = [i for i, spec in enumerate(fam["inputs"]) if spec.get("weight") and i != last]
            if entry is None or not _same(entry[0], arrays) or entry[4]() is not arrays[last]:
                entry = table[key] = [tuple((i, weakref.ref(arrays[i], forget)) for i in weights), (), None, (),
                                      weakref.ref(arrays[last], forget), None, None, ()]
                entry[7] = tuple(r for _, r in entry[0])
            _file_activations(entry, fam, arrays, dtypes)
            entry[2:4] = _direct_form(plan)
        except (TypeError, AttributeError):  # weights that take no weak reference (not MLX arrays): no entry
            pass

    def _plan(self, family: str, arrays: Sequence[Any], chip: Any, modeled: bool,
              prepacked: Sequence[int] = ()) -> Callable[..., Any]:
        """A function of the call's arrays (``plan(*arrays)``) that runs what the decision for them chose.

        Everything is planned here, once: the op with its constant arguments bound (:func:`op_call`), or the
        kernel's launch compiled (:func:`kernel_call`). ``prepacked``: inputs the caller already passed in the
        kernel's layout (:meth:`bind` transposes constant weights once)."""
        import mlx.core as mx

        fam = self._family(family)
        native = all(isinstance(a, mx.array) for a in arrays)
        arrays = tuple(a if isinstance(a, mx.array) else mx.array(a) for a in arrays)
        out_of_range = shape_refusal(family, fam, [tuple(a.shape) for a in arrays])
        if out_of_range:  # checked once per planned shape: the op itself may crash there (M = 0: SIGFPE)
            raise ValueError(out_of_range)
        decision = self.explain(family, *arrays, chip=chip, modeled=modeled)
        if decision.entry is None:
            dims, _ = _bind_dims(fam, [tuple(a.shape) for a in arrays])
            return _native(mx, op_call(fam, dims, self._functions(fam, mx), mx), native)
        record, _ = self.running_chip(chip)
        dims = dict(zip(fam["dims"], decision.shape))
        names = _context(fam, decision.entry["config"], dims, record, decision.dtype)
        launch = fam["launch"]
        shared = int(evaluate(launch["shared_memory"], names)) if launch.get("shared_memory") else 0
        # A kernel that accumulates into its outputs (split-K) needs them zero-filled.
        zero = launch.get("zero_outputs") and bool(evaluate(launch["zero_outputs"], names))
        transpose = [t and i not in prepacked for i, t in enumerate(self._transposes(fam, names))]
        source = self._source(decision.entry)
        assert source is not None  # checked while deciding
        call = kernel_call(
            self._kernel(source, shared),
            [(k, getattr(mx, v) if isinstance(v, str) and hasattr(mx, v) else v) for k, v in source["template"]],
            tuple(int(v) for v in evaluate(launch["grid"], names)),
            tuple(int(v) for v in evaluate(launch["threadgroup"], names)),
            [tuple(int(s) for s in evaluate(o["shape"], names)) for o in fam["outputs"]],
            [_out_dtype(o, decision.dtype) for o in fam["outputs"]],
            [mx.array([p["value"]], dtype=getattr(mx, p["dtype"])) for p in fam.get("params", [])],
            transpose, 0.0 if zero else None)
        return _native(mx, call, native)

    @staticmethod
    def _transposes(fam: Dict[str, Any], names: Dict[str, Any]) -> List[bool]:
        """Which inputs the chosen config takes transposed (its layout knob)."""
        return [spec["transposed"] is not None and bool(evaluate(spec["transposed"], names)) for spec in fam["inputs"]]

    @staticmethod
    def _functions(fam: Dict[str, Any], mx: Any) -> Dict[str, Callable[..., Any]]:
        return {name: fn for name, fn in mlx_vocabulary(mx).items() if name in fam["array_functions"]}

    def bind(self, family: str, *weights: Any, chip: Any = None, modeled: bool = False) -> Callable[..., Any]:
        """``family`` with its weight inputs fixed (``qmatvec.bind(W, S, Bq)(X)``): a call passes the other
        inputs only and is planned once per their shapes; a kernel whose layout differs from the weights' gets
        them packed (transposed) here, once, instead of on every call. Where no kernel of the family can run on
        this chip (:meth:`_mode`), the op with the weights fixed (:meth:`_Binding.op_bound`): the weights'
        shapes are checked here, once."""
        binding = _Binding(self, family, weights, chip, modeled)
        if chip is None and self._mode(family)[0] is not _KERNELS:
            return binding.op_bound(self._mode(family)[0] is _OP)
        env, env_key, last, planned = _ENV, _ENV_KEY, binding.last, binding.planned

        def bound(*acts: Any) -> Any:
            if len(acts) == 1 and env.get(env_key) is None:
                x = acts[0]
                try:
                    if x.shape == last[0] and x.dtype == last[1]:  # decode repeats the last activation shape
                        return last[2](x, *last[3])  # the plan of all inputs, the weights appended: no frame
                except AttributeError:
                    pass
            return planned(*acts)

        bound.__name__ = f"{family}_bound"
        return bound

    def _kernel(self, source: Dict[str, Any], shared_memory: int) -> Any:
        key = (source["sha256"], shared_memory if source["target"] in SHARED_MEMORY_AT_BUILD else 0)
        if key not in self._kernels:
            self._kernels[key] = self.kernel_factory(source, key[1])
        return self._kernels[key]

    def _family(self, family: str) -> Dict[str, Any]:
        try:
            entry: Dict[str, Any] = self.table["families"][family]
            return entry
        except KeyError:
            raise ValueError(f"unknown family {family!r} (this package has: "
                             f"{', '.join(self.table['families'])})") from None


class _Binding:
    """One family with its weights fixed (:meth:`Dispatcher.bind`): a plan per activation signature, the weights
    packed once where the chosen kernel takes another layout, and the last single activation's plan."""

    def __init__(self, d: Dispatcher, family: str, weights: Sequence[Any], chip: Any, modeled: bool) -> None:
        import mlx.core as mx

        self.d, self.family, self.chip, self.modeled, self.mx = d, family, chip, modeled, mx
        self.fam = d._family(family)
        self.slots = [i for i, spec in enumerate(self.fam["inputs"]) if spec.get("weight")]
        if not self.slots:
            raise ValueError(f"{family} has no weight inputs to bind")
        if len(weights) != len(self.slots):
            names = ", ".join(self.fam["inputs"][i]["name"] for i in self.slots)
            raise TypeError(f"{family}.bind takes {len(self.slots)} weight(s) ({names}), {len(weights)} given")
        self.held = [w if isinstance(w, mx.array) else mx.array(w) for w in weights]
        self.free = [i for i in range(len(self.fam["inputs"])) if i not in self.slots]
        self.plans: Dict[Any, Callable[..., Any]] = {}
        #: The last single activation's shape and dtype, the plan of all inputs and the weights it appends.
        self.last: List[Any] = [None, None, None, ()]
        #: Plans of all inputs with their weights, by activation signature (single-activation bindings).
        self.whole: Dict[Any, Tuple[Callable[..., Any], Tuple[Any, ...]]] = {}

    def merged(self, acts: Sequence[Any], ws: Sequence[Any]) -> List[Any]:
        out: List[Any] = [None] * len(self.fam["inputs"])
        for i, a in zip(self.free, acts):
            out[i] = a
        for i, w in zip(self.slots, ws):
            out[i] = w
        return out

    def packed(self, decision: Decision) -> Tuple[List[Any], List[int]]:
        """The weights as the chosen kernel takes them (transposed copies, made once) and which were packed."""
        ws, packed = list(self.held), []
        if decision.entry is not None:
            record, _ = self.d.running_chip(self.chip)
            names = _context(self.fam, decision.entry["config"], dict(zip(self.fam["dims"], decision.shape)), record,
                             decision.dtype)
            flips = self.d._transposes(self.fam, names)
            for j, i in enumerate(self.slots):
                if flips[i]:
                    ws[j] = self.mx.contiguous(self.mx.transpose(self.held[j]))
                    packed.append(i)
            self.mx.eval(ws)
        return ws, packed

    def op_bound(self, shape_free: bool) -> Callable[..., Any]:
        """The op with the weights fixed, where no kernel of the family can run on this chip (any opt-in): the
        weights' shapes are checked here, once (:func:`weights_refusal`). ``shape_free`` (the op needs nothing of
        the shape and the family has no range): the op itself, nothing checked per call. Else the op is planned
        per activation shape (its constants, e.g. qmatvec's group size and bits, are read off X's width; the
        range, e.g. 1 to 16 rows, checked once per shape: MLX's quantized_matmul kills the process at 0 rows), and a
        call compares its activations' shapes with the last planned ones, then calls the op."""
        d, fam, mx = self.d, self.fam, self.mx
        why = weights_refusal(self.family, fam, self.slots, [tuple(w.shape) for w in self.held])
        if why:
            raise ValueError(why)
        fixed = {fam["inputs"][i]["name"]: w for i, w in zip(self.slots, self.held)}
        functions = d._functions(fam, mx)
        if shape_free:
            op = op_call(fam, None, functions, mx, fixed)
            if getattr(op, "__name__", "") in ("op", "op_kw", "op1", "op2", "op3", "op_precise"):
                op.__name__ = f"{self.family}_bound"
            return op
        last, planned = self._op_planner(functions, fixed)
        family, free = self.family, self.free
        if len(free) == 1:
            def bound(x: Any) -> Any:
                try:
                    if x.shape == last[0]:
                        consts = last[3]
                        return last[2]((x,)) if consts is None else last[2](x, *consts)
                except (AttributeError, TypeError):  # not an MLX array: converted by the planned path
                    pass
                return planned(x)
        elif len(free) == 2:
            def bound(x: Any, y: Any) -> Any:  # type: ignore[misc]
                try:
                    if x.shape == last[0] and y.shape == last[1]:
                        consts = last[3]
                        return last[2]((x, y)) if consts is None else last[2](x, y, *consts)
                except (AttributeError, TypeError):
                    pass
                return planned(x, y)
        else:
            bound = planned
        bound.__name__ = f"{family}_bound"
        return bound

    def _op_planner(self, functions: Dict[str, Callable[..., Any]],
                    fixed: Dict[str, Any]) -> Tuple[List[Any], Callable[..., Any]]:
        """(last, planned) of :meth:`op_bound`: ``planned(*acts)`` checks the activations' shapes with the weights
        (the family's range, refused in the consumer's words), plans the op once per shape and files it in
        ``last`` = [first activation's shape, second's (or None), function, constants appended to the call (None:
        the function takes the activations' tuple)]."""
        fam, mx, family = self.fam, self.mx, self.family
        last: List[Any] = [None, None, None, ()]
        plans: Dict[Any, Tuple[Callable[..., Any], Optional[Tuple[Any, ...]]]] = {}

        def planned(*acts: Any) -> Any:
            acts = tuple(_as_mx(mx, acts))
            shapes = tuple(tuple(a.shape) for a in acts)
            plan = plans.get(shapes)
            if plan is None:
                whole = [tuple(s) for s in self.merged(shapes, [w.shape for w in self.held])]
                out_of_range = shape_refusal(family, fam, whole)
                if out_of_range:
                    raise ValueError(out_of_range)
                dims, _ = _bind_dims(fam, whole)
                plan = _direct_form(op_call(fam, dims, functions, mx, fixed))
                if len(plans) >= MAX_DECISIONS:
                    plans.clear()
                plans[shapes] = plan
            last[:] = [shapes[0], shapes[1] if len(shapes) > 1 else None, *plan]
            return plan[0](acts) if plan[1] is None else plan[0](*acts, *plan[1])

        return last, planned

    def make(self, acts: Sequence[Any], key: Any = None) -> Callable[..., Any]:
        acts = _as_mx(self.mx, acts)
        decision = self.d.explain(self.family, *self.merged(acts, self.held), chip=self.chip, modeled=self.modeled)
        ws, packed = self.packed(decision)
        plan = self.d._plan(self.family, self.merged(acts, ws), self.chip, self.modeled, prepacked=packed)
        if self.free == [0]:
            rest = tuple(ws)
            if key is not None:
                self.whole[key] = (plan, rest)
            return lambda x: plan(x, *rest)
        return lambda *xs: plan(*self.merged(xs, ws))

    def planned(self, *acts: Any) -> Any:
        try:
            key: Any = (_ENV.get(_ENV_KEY),
                        *_chain.from_iterable(map(_SIGNATURE, acts)))
        except AttributeError:  # not MLX arrays: planned every call
            return self.make(acts)(*acts)
        plan = self.plans.get(key)
        if plan is None:
            if len(self.plans) >= MAX_DECISIONS:
                self.plans.clear()
                self.whole.clear()
            plan = self.plans[key] = self.make(acts, key)
        whole = self.whole.get(key)
        if len(acts) == 1 and key[0] is None and whole is not None:
            self.last[:] = [key[1], key[2], whole[0], whole[1]]
        return plan(*acts)


# -- helpers ---------------------------------------------------------------------------------------------

class _EnvShim:
    """``os.environ`` read as the raw table is (``get(key)``), where the interpreter has no raw table."""

    @staticmethod
    def get(_key: Any) -> Optional[str]:
        return os.environ.get(DISABLE_VAR)


try:  # os.environ.get costs ~2 us (key encoding); the raw table is a dict lookup — this runs on every call
    _ENV: Any = os.environ._data  # type: ignore[attr-defined,unused-ignore]
    _ENV_KEY: Any = os.environ.encodekey(DISABLE_VAR)  # type: ignore[attr-defined,unused-ignore]
except AttributeError:  # pragma: no cover - not CPython
    _ENV, _ENV_KEY = _EnvShim(), DISABLE_VAR

#: How a family's calls with no chip run here (:meth:`Dispatcher._mode`): the op for every call, the op planned
#: per shape, or planned with the kernels in view.
_OP, _OP_PLANNED, _KERNELS = object(), object(), object()


_SIGNATURE = operator.attrgetter("shape", "dtype")


def _call_key(family: str, chip: Any, modeled: bool, flag: Any, arrays: Sequence[Any]) -> Any:
    """What a plan is filed under: (family, chip, modeled, flag, shape0, dtype0, shape1, ...); None where the call
    cannot be keyed (not arrays, or an unhashable chip record): planned every call. Spelled out for the common
    arities: a comprehension would cost a frame (~0.4 us, a tenth of a small op)."""
    try:
        if len(arrays) == 2:
            a, b = arrays
            key: Any = (family, chip, modeled, flag, a.shape, a.dtype, b.shape, b.dtype)
        elif len(arrays) == 1:
            key = (family, chip, modeled, flag, arrays[0].shape, arrays[0].dtype)
        else:
            key = (family, chip, modeled, flag, *_chain.from_iterable(map(_SIGNATURE, arrays)))
        hash(key)
        return key
    except (AttributeError, TypeError):
        return None


def _same_dtypes(arrays: Sequence[Any], a0: int, a1: int, dtypes: Any) -> bool:
    """The activations' dtypes are the planned ones (where a kernel may run, the plan is the dtype's)."""
    return bool(arrays[a0].dtype == dtypes) if a1 < 0 else \
        bool(arrays[a0].dtype == dtypes[0] and arrays[a1].dtype == dtypes[1])


# -- the plain call's front, spelled out per arity ----------------------------------------------------------
# A family whose first input is its activation and the others its weights (qmatvec, rmsnorm_qmatvec,
# swiglu_qmatvec, rmsnorm_swiglu_qmatvec) is called through a front of its own arity: the weights' identities and
# X's shape compared by name, no ``*arrays`` tuple, no loop (~0.3 us less per call than the general path, which it
# hands every other call to). An entry of ``Dispatcher._by_weights`` holds the other weights' references in order
# (its last field).

def _front4(how: List[Any], table: Dict[int, List[Any]], general: Callable[..., Any], env: Any,
            env_key: Any) -> Callable[..., Any]:
    def run(x: Any = _NO, w1: Any = _NO, w2: Any = _NO, w3: Any = _NO, *more: Any, modeled: bool = False) -> Any:
        mode = how[0]
        if not more and (mode is _OP_PLANNED or mode is _KERNELS and not modeled and env.get(env_key) is None):
            e = table.get(id(w3))
            if e is not None:
                r = e[7]
                try:
                    if r[0]() is w1 and r[1]() is w2 and x.shape == e[5] and (e[6] is None or x.dtype == e[6]):
                        c = e[3]
                        return e[2]((x, w1, w2, w3)) if c is None else e[2](x, w1, w2, w3, *c)
                except (AttributeError, TypeError):  # not MLX arrays: converted there
                    pass
        return general(*_given(x, w1, w2, w3), *more, modeled=modeled)
    return run


def _front5(how: List[Any], table: Dict[int, List[Any]], general: Callable[..., Any], env: Any,
            env_key: Any) -> Callable[..., Any]:
    def run(x: Any = _NO, w1: Any = _NO, w2: Any = _NO, w3: Any = _NO, w4: Any = _NO, *more: Any,
              modeled: bool = False) -> Any:
        mode = how[0]
        if not more and (mode is _OP_PLANNED or mode is _KERNELS and not modeled and env.get(env_key) is None):
            e = table.get(id(w4))
            if e is not None:
                r = e[7]
                try:
                    if r[0]() is w1 and r[1]() is w2 and r[2]() is w3 and x.shape == e[5] and \
                            (e[6] is None or x.dtype == e[6]):
                        c = e[3]
                        return e[2]((x, w1, w2, w3, w4)) if c is None else e[2](x, w1, w2, w3, w4, *c)
                except (AttributeError, TypeError):  # not MLX arrays: converted there
                    pass
        return general(*_given(x, w1, w2, w3, w4), *more, modeled=modeled)
    return run


def _front7(how: List[Any], table: Dict[int, List[Any]], general: Callable[..., Any], env: Any,
            env_key: Any) -> Callable[..., Any]:
    def run(x: Any = _NO, w1: Any = _NO, w2: Any = _NO, w3: Any = _NO, w4: Any = _NO, w5: Any = _NO,
              w6: Any = _NO, *more: Any, modeled: bool = False) -> Any:
        mode = how[0]
        if not more and (mode is _OP_PLANNED or mode is _KERNELS and not modeled and env.get(env_key) is None):
            e = table.get(id(w6))
            if e is not None:
                r = e[7]
                try:
                    if r[0]() is w1 and r[1]() is w2 and r[2]() is w3 and r[3]() is w4 and \
                            r[4]() is w5 and x.shape == e[5] and (e[6] is None or x.dtype == e[6]):
                        c = e[3]
                        xs = (x, w1, w2, w3, w4, w5, w6)
                        return e[2](xs) if c is None else e[2](*xs, *c)
                except (AttributeError, TypeError):  # not MLX arrays: converted there
                    pass
        return general(*_given(x, w1, w2, w3, w4, w5, w6), *more, modeled=modeled)
    return run


def _front8(how: List[Any], table: Dict[int, List[Any]], general: Callable[..., Any], env: Any,
            env_key: Any) -> Callable[..., Any]:
    def run(x: Any = _NO, w1: Any = _NO, w2: Any = _NO, w3: Any = _NO, w4: Any = _NO, w5: Any = _NO,
              w6: Any = _NO, w7: Any = _NO, *more: Any, modeled: bool = False) -> Any:
        mode = how[0]
        if not more and (mode is _OP_PLANNED or mode is _KERNELS and not modeled and env.get(env_key) is None):
            e = table.get(id(w7))
            if e is not None:
                r = e[7]
                try:
                    if r[0]() is w1 and r[1]() is w2 and r[2]() is w3 and r[3]() is w4 and \
                            r[4]() is w5 and r[5]() is w6 and x.shape == e[5] and \
                            (e[6] is None or x.dtype == e[6]):
                        c = e[3]
                        xs = (x, w1, w2, w3, w4, w5, w6, w7)
                        return e[2](xs) if c is None else e[2](*xs, *c)
                except (AttributeError, TypeError):  # not MLX arrays: converted there
                    pass
        return general(*_given(x, w1, w2, w3, w4, w5, w6, w7), *more, modeled=modeled)
    return run


def _front_residual(how: List[Any], table: Dict[int, List[Any]], general: Callable[..., Any], env: Any,
                    env_key: Any) -> Callable[..., Any]:
    """The front of X, three weights, then the residual R (qmatvec_residual)."""
    def run(x: Any = _NO, w1: Any = _NO, w2: Any = _NO, w3: Any = _NO, r: Any = _NO, *more: Any,
            modeled: bool = False) -> Any:
        mode = how[0]
        if not more and (mode is _OP_PLANNED or mode is _KERNELS and not modeled and env.get(env_key) is None):
            e = table.get(id(w3))
            if e is not None:
                refs, shapes = e[7], e[5]
                try:
                    if refs[0]() is w1 and refs[1]() is w2 and x.shape == shapes[0] and \
                            r.shape == shapes[1] and (e[6] is None or x.dtype == e[6][0] and r.dtype == e[6][1]):
                        c = e[3]
                        return e[2]((x, w1, w2, w3, r)) if c is None else e[2](x, w1, w2, w3, r, *c)
                except (AttributeError, TypeError):
                    pass
        return general(*_given(x, w1, w2, w3, r), *more, modeled=modeled)
    return run


#: Not given (a front's parameters past the call's arguments).
_NO: Any = object()
#: Fronts by layout: the arity of X then its weights, or -1: X, three weights, R.
_FRONTS = {4: _front4, 5: _front5, 7: _front7, 8: _front8, -1: _front_residual}


def _fronted(run: Callable[..., Any], how: List[Any], table: Dict[int, List[Any]], env: Any, env_key: Any,
             layout: Tuple[int, int, int, int]) -> Callable[..., Any]:
    """``run`` behind the front of its layout (first and second activation, last weight, arity) where one exists
    (:data:`_FRONTS`)."""
    a0, a1, last, arity = layout
    make = _FRONTS.get(arity if a0 == 0 and a1 < 0 and last == arity - 1 else -1 if layout == (0, 4, 3, 5) else 0)
    if make is None:
        return run
    front = make(how, table, run, env, env_key)
    front.__name__ = run.__name__
    return front


def _given(*xs: Any) -> Tuple[Any, ...]:
    """The arguments a front was called with (its parameters up to the first not given)."""
    return xs[:next((i for i, a in enumerate(xs) if a is _NO), len(xs))]


def _same(refs: Sequence[Tuple[int, Any]], arrays: Sequence[Any]) -> bool:
    """True when each weak reference still points at the call's weight array of its position."""
    for i, r in refs:
        if r() is not arrays[i]:
            return False
    return True


def _forget(table: Dict[Any, Any], key: Any, _ref: Any) -> None:
    table.pop(key, None)


def _native(mx: Any, fn: Callable[..., Any], native: bool) -> Callable[..., Any]:
    """``fn`` itself where callers pass MLX arrays (every call with this key does), else a converting wrapper."""
    return fn if native else (lambda *xs: fn(*_as_mx(mx, xs)))


def _as_mx(mx: Any, arrays: Sequence[Any]) -> Sequence[Any]:
    """The call's arrays as MLX arrays (a consumer may pass NumPy arrays or lists)."""
    if all(isinstance(a, mx.array) for a in arrays):
        return arrays
    return [a if isinstance(a, mx.array) else mx.array(a) for a in arrays]


def _files(entry: Dict[str, Any]) -> Tuple[str, str, str]:
    """What a tamper verdict is about: the two files and the hash they must have."""
    return (str(entry["header"]), str(entry["source"]), str(entry["sha256"]))


def _read_inside(root: Path, rel: str, limit: int = 4 << 20) -> str:
    """A kernel file of the package: a plain relative path inside it, a regular file, bounded."""
    parts = str(rel).split("/")
    if any(p in ("", ".", "..") for p in parts) or str(rel).startswith("/"):
        raise ValueError(f"{rel!r} is not a path inside the package")
    path = root.joinpath(*parts)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{rel} is not a regular file")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{rel} is larger than {limit} bytes")
    return data.decode("utf-8")



# -- integrity: what the store recorded at publish ---------------------------------------------------------

def decision_fields(m: Dict[str, Any]) -> Dict[str, Any]:
    """The fields of an artifact's dispatch record that come from its manifest (a parsed ``manifest.json``):
    export writes them from the manifest, and the dispatcher checks them against it before first use."""
    meas = m.get("measurements")
    tc, kernel, problem, chip = m["toolchain"], m["kernel"], m["problem"], m["chip"]
    return {
        "key": m["key"], "version": m["version"], "chip": chip["name"], "vendor": chip["vendor"],
        "lineage": list(chip["lineage"]), "dtype": problem["dtype"], "shape": list(problem["shape"]),
        "config": dict(m["config"]), "target": kernel["target"], "evidence": m["evidence"],
        **dispatch_figures(meas),
        "timing_identity": timing_identity(tc.get("mlx_version"), tc.get("os"), tc.get("macos_version"),
                                           tc.get("cuda_driver"), tc.get("nvrtc_version")),
        "kernel": {"name": kernel["name"], "target": kernel["target"], "input_names": list(kernel["input_names"]),
                   "output_names": list(kernel["output_names"]), "template": [list(t) for t in kernel["template"]]},
        "sha256": m["source_sha256"],
    }


def artifact_mismatch(root: Path, entry: Dict[str, Any]) -> str:
    """'' if an artifact's shipped manifest and kernel files hash to the content hash the store recorded at
    publish (``content_sha256`` of its record) and every decision field of the record is its manifest's; else
    why not. Not a signature (the package holds no secret): it catches every change to the shipped files or
    to ``dispatch.json`` that does not also forge the recorded hash."""
    try:
        text = _read_inside(root, str(entry["manifest"]))
        header, source = _read_inside(root, str(entry["header"])), _read_inside(root, str(entry["source"]))
    except (KeyError, OSError, UnicodeDecodeError, ValueError) as exc:
        return f"cannot read its manifest or kernel files ({exc})"
    if content_sha256(text, header, source) != entry.get("content_sha256"):
        return "its manifest or kernel files are not what the store recorded at publish (content hash mismatch)"
    try:
        fields = decision_fields(json.loads(text))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        return f"its manifest is unreadable ({type(exc).__name__})"
    wrong = sorted(k for k, v in fields.items() if entry.get(k) != v)
    return f"its dispatch record differs from its manifest in {', '.join(wrong)}" if wrong else ""


def _bind_dims(fam: Dict[str, Any], shapes: Sequence[Sequence[int]],
               specs: Optional[Sequence[Dict[str, Any]]] = None) -> Tuple[Optional[Dict[str, int]], str]:
    """Problem dimensions read off the input shapes (of ``specs``, some of the inputs, where given); (None, why)
    if they do not fit the family."""
    partial = specs is not None
    specs = fam["inputs"] if specs is None else specs
    if len(shapes) != len(specs):
        return None, f"{len(shapes)} inputs given, {len(specs)} expected"
    dims: Dict[str, int] = {}
    for spec, shape in zip(specs, shapes):
        if len(shape) != len(spec["axes"]):
            return None, f"{spec['name']} has {len(shape)} dimensions, expected {len(spec['axes'])}"
        for axis, size in zip(spec["axes"], shape):
            if isinstance(axis, int):
                if axis != size:
                    return None, f"{spec['name']}: size {size} where {axis} is required"
            elif dims.setdefault(axis, int(size)) != size:
                return None, f"{axis} is {dims[axis]} and {size}"
    missing = [d for d in fam["dims"] if d not in dims]
    if missing and not partial:
        return None, f"dimension(s) {missing} not given by any input"
    return dims, ""


def _range_rules(fam: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The family's constraints on the problem alone (its dimensions, dtype and what derives from them only)."""
    problem = set(fam["dims"]) | set(FUNCTIONS)
    for name, tree in fam["derived"]:
        if names_in(tree) <= problem:
            problem.add(name)
    return [c for c in fam["constraints"] if names_in(c["expr"]) <= problem]


def _upper_bound(fam: Dict[str, Any], dim: str) -> Optional[int]:
    """``B`` of a constraint ``dim <= B`` (a declared range), if the family has one."""
    for c in _range_rules(fam):
        e = c["expr"]
        if e[0] == "cmp" and e[1] == ["name", dim] and len(e[2]) == 1 and e[2][0][0] == "lteq" \
                and e[2][0][1][0] == "const" and isinstance(e[2][0][1][1], int):
            return int(e[2][0][1][1])
    return None


def _size_words(fam: Dict[str, Any], dim: str, size: int) -> str:
    """``X has 0 rows``: a dimension as the consumer passed it (the first input that carries it)."""
    for spec in fam["inputs"]:
        if dim in spec["axes"]:
            axis, ndim = spec["axes"].index(dim), len(spec["axes"])
            what = ("rows" if axis == 0 else "columns") if ndim == 2 else f"elements on axis {axis}"
            return f"{spec['name']} has {size} {what}"
    return f"{dim} is {size}"


def shape_refusal(family: str, fam: Dict[str, Any], shapes: Sequence[Sequence[int]]) -> str:
    """'' if the shapes are in the family's declared range, else why not in the consumer's words
    (``qmatvec: X has 0 rows; this kernel takes 1 to 16``); shapes that do not bind are left to the op."""
    dims, why = _bind_dims(fam, shapes)
    if dims is None:  # the op needs the dimensions: say which input does not fit, not "unknown name 'K'"
        needs = names_in(fam["baseline"]) & set(fam["dims"])
        return f"{family}: the inputs do not fit together: {why}" if needs else ""
    return _dims_refusal(family, fam, dims)


def weights_refusal(family: str, fam: Dict[str, Any], slots: Sequence[int], shapes: Sequence[Sequence[int]]) -> str:
    """'' if the weights (inputs ``slots``, of ``shapes``) fit together and what they alone fix is in the family's
    range, else why not: checked once where :meth:`Dispatcher.bind` binds them to the op (what needs the
    activations too, e.g. the rows of X, is checked once per activation shape)."""
    dims, why = _bind_dims(fam, shapes, [fam["inputs"][i] for i in slots])
    if dims is None:
        return f"{family}: the weights do not fit together: {why}"
    return _dims_refusal(family, fam, dims)


def _dims_refusal(family: str, fam: Dict[str, Any], dims: Dict[str, int]) -> str:
    """'' if the dimensions given (all of the family's, or those its weights fix) are in its declared range; a
    rule that needs a dimension not given is not judged here."""
    for dim in fam["dims"]:
        bound = _upper_bound(fam, dim)
        if dim in dims and (dims[dim] < 1 or (bound is not None and dims[dim] > bound)):
            takes = f"1 to {bound}" if bound is not None else "at least 1"
            return f"{family}: {_size_words(fam, dim, dims[dim])}; this kernel takes {takes}"
    names: Dict[str, Any] = {**FUNCTIONS, **dims}
    for name, tree in fam["derived"]:
        try:
            names[name] = evaluate(tree, names)
        except (ExpressionError, ArithmeticError, TypeError, ValueError, KeyError):
            continue
    for c in _range_rules(fam):
        try:
            ok = evaluate(c["expr"], names)
        except (ExpressionError, ArithmeticError, TypeError, ValueError, KeyError):
            continue  # it needs what is not given (a dtype's size, the activations' rows): judged elsewhere
        if not ok:
            given = ", ".join(f"{n} = {dims[n]}" for n in fam["dims"] if n in dims)
            return f"{family}: inputs with {given} are outside what it takes: {c.get('why') or c['name']}"
    return ""


def _context(fam: Dict[str, Any], config: Dict[str, Any], dims: Dict[str, int], chip: Dict[str, Any],
             dtype: str) -> Dict[str, Any]:
    names: Dict[str, Any] = {**FUNCTIONS, **dims, "dtype": dtype, "dtype_size": fam["dtype_sizes"][dtype],
                             "chip": chip, **config}
    for name, tree in fam["derived"]:
        names[name] = evaluate(tree, names)
    return names


def violation(fam: Dict[str, Any], config: Dict[str, Any], dims: Dict[str, int], chip: Dict[str, Any],
              dtype: str) -> str:
    """'' if ``config`` obeys every family constraint for this shape and chip, else the first violated."""
    try:
        names = _context(fam, config, dims, chip, dtype)
        for c in fam["constraints"]:
            if not evaluate(c["expr"], names):
                return f"violates {c['name']}" + (f" ({c['why']})" if c.get("why") else "")
    except (ExpressionError, ArithmeticError, TypeError, ValueError, KeyError) as exc:
        return f"cannot evaluate constraints: {exc}"
    return ""


def _dtype_name(arrays: Sequence[Any], fam: Optional[Dict[str, Any]] = None) -> str:
    """The problem dtype ``T``: that of the inputs the family types as ``T`` (all of them, in older tables)."""
    specs = (fam or {}).get("inputs") or []
    typed = [a for i, a in enumerate(arrays) if i >= len(specs) or specs[i].get("dtype", "T") == "T"]
    names = {str(a.dtype).rsplit(".", 1)[-1] for a in typed or arrays}
    return names.pop() if len(names) == 1 else "mixed"


def _out_dtype(spec: Dict[str, Any], dtype: str) -> Any:
    import mlx.core as mx

    return getattr(mx, dtype if spec.get("dtype", "T") == "T" else spec["dtype"])


_TOOLCHAIN: Dict[str, Optional[str]] = {}


def _running_toolchain() -> Dict[str, Optional[str]]:
    """This process's timing identity, detected once (MLX, OS, macOS, CUDA driver, NVRTC)."""
    if not _TOOLCHAIN:
        import platform

        try:
            import mlx.core as mx

            mlx_version: Optional[str] = str(getattr(mx, "__version__", "unknown"))
        except ImportError:
            mlx_version = None
        macos = platform.mac_ver()[0] or None
        nvidia = platform.system() == "Linux"
        _TOOLCHAIN.update(timing_identity(mlx_version, platform.system(), macos,
                                          cuda_driver_version() if nvidia else None,
                                          nvrtc_version() if nvidia else None))
    return _TOOLCHAIN


def _gpu_available() -> bool:
    try:
        import mlx.core as mx

        if mx.default_device().type != mx.DeviceType.gpu:
            return False
        if mx.metal.is_available():
            return True
        cuda = getattr(mx, "cuda", None)
        return bool(cuda is not None and cuda.is_available())
    except Exception:  # noqa: BLE001 - any MLX without a GPU back-end
        return False


def _device_info() -> Dict[str, Any]:
    try:
        import mlx.core as mx

        return dict(mx.device_info())
    except Exception:  # noqa: BLE001 - older MLX
        return {}


def _mlx_kernel(source: Dict[str, Any], shared_memory: int) -> Any:
    """The kernel object of one source record, built by its target's factory (the targets table's row)."""
    target = source["target"]
    args = dict(name=source["name"], input_names=list(source["input_names"]),
                output_names=list(source["output_names"]), source=kernel_text(target, source["source"]),
                header=kernel_text(target, source["header"]))
    make = kernel_factory(source["target"])
    if source["target"] in SHARED_MEMORY_AT_BUILD:
        return make(**args, shared_memory=shared_memory)
    return make(**args)

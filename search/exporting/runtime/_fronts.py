"""The per-call fast paths of the exported functions: the plan of a call filed under its weights' identity (held
weakly) and its activations' shapes, the fronts per arity that check them by name, and the raw read of
the consumer's switch (``KERNSEARCH_KERNELS``). Part of the run-time dispatcher, copied verbatim into
every exported package; standard library only."""

from __future__ import annotations

import operator
import os
import weakref
from itertools import chain as _chain
from typing import Any, Callable, Dict, List, Sequence, Tuple

#: ``off`` (or 0/no/false): every call uses the plain MLX op; ``modeled``: modeled artifacts may be used too.
DISABLE_VAR = "KERNSEARCH_KERNELS"
#: The most entries a per-process table (decisions, plans, weights) holds: past it, it starts over rather than grow.
MAX_DECISIONS = 4096


class _EnvShim:
    """``os.environ`` read as the raw table is (``get(key[, default])``), where the interpreter has no raw table."""

    @staticmethod
    def get(_key: Any, default: Any = None) -> Any:
        value = os.environ.get(DISABLE_VAR)
        return default if value is None else value


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


# -- the plain call's front, spelled out per arity ----------------------------------------------------------
# A family whose first input is its activation and the others its weights (qmatvec, rmsnorm_qmatvec,
# swiglu_qmatvec, rmsnorm_swiglu_qmatvec) is called through a front of its own arity: the weights' identities and
# X's shape compared by name, no ``*arrays`` tuple, no loop (~0.3 us less per call than the general path, which it
# hands every other call to). An entry of ``Dispatcher._by_weights`` holds the other weights' references in order
# (its last field). A front runs a call's plan in the mode that plans the op per shape (``_OP_PLANNED``: no opt-in
# read), or where a kernel may run (``_KERNELS``) for a call that does not opt in to modeled artifacts while the
# switch is unset: the raw switch read with ``_KERNELS`` as its default (a set switch reads as its bytes, which no
# mode is), as the general path reads them.


class _Nothing:
    """The type of :data:`_NOTHING`."""


#: An object no call is passed and no mode is.
_NOTHING = _Nothing()
#: What a front reads for weights with no entry: an entry whose references point at :data:`_NOTHING`, so the call's
#: first weight fails its identity check as it fails another set's (no test of its own on the fast path).
_NO_ENTRY: Tuple[Any, ...] = (None,) * 7 + ((weakref.ref(_NOTHING),) * 7,)
#: The mode whose calls :func:`_front8` runs by their plan where the switch is unset, by ``not modeled``: _KERNELS's,
#: unless the call opts in to modeled artifacts (the general path plans those). Read as the raw switch's default (a
#: set switch reads as its bytes, which no mode is), the opt-in and the switch are one operand there: its six
#: weights' checks leave no room for two within radon's 15 (this look-up costs ~15-20 ns a call where a kernel may
#: run, benchmarks/front_host.py; the other fronts read ``not modeled`` on its own, which costs nothing).
_UNSET_OPENS = {True: _KERNELS, False: _NOTHING}


def _front4(how: List[Any], table: Dict[int, List[Any]], general: Callable[..., Any], env: Any,
            env_key: Any) -> Callable[..., Any]:
    def run(x: Any = _NO, w1: Any = _NO, w2: Any = _NO, w3: Any = _NO, *more: Any, modeled: bool = False) -> Any:
        mode = how[0]
        if not more and (mode is _OP_PLANNED or not modeled and mode is env.get(env_key, _KERNELS)):
            e = table.get(id(w3), _NO_ENTRY)
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
        if not more and (mode is _OP_PLANNED or not modeled and mode is env.get(env_key, _KERNELS)):
            e = table.get(id(w4), _NO_ENTRY)
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
        if not more and (mode is _OP_PLANNED or not modeled and mode is env.get(env_key, _KERNELS)):
            e = table.get(id(w6), _NO_ENTRY)
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
        if not more and (mode is _OP_PLANNED or mode is env.get(env_key, _UNSET_OPENS[not modeled])):
            e = table.get(id(w7), _NO_ENTRY)
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
        if not more and (mode is _OP_PLANNED or not modeled and mode is env.get(env_key, _KERNELS)):
            e = table.get(id(w3), _NO_ENTRY)
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

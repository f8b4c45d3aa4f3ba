"""``family.bind(*weights)``: one family with its weights fixed (:class:`_Binding`), planned once per
activation signature, the weights packed once where the chosen kernel takes another layout. Part of the
run-time dispatcher, copied verbatim into every exported package."""

from __future__ import annotations

from itertools import chain as _chain
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from ._checks import _bind_dims, _context, shape_refusal, weights_refusal
from ._fronts import _ENV, _ENV_KEY, _SIGNATURE, MAX_DECISIONS, _as_mx
from ._opforms import _direct_form
from ._oppath import op_call

if TYPE_CHECKING:
    from ._decision import Decision
    from ._runtime import Dispatcher


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
        #: Two-activation bindings (``qmatvec_residual.bind(W, S, Bq)(X, R)``): the last call's shapes and dtypes
        #: and its plan as a function of the two activations, and those plans by activation signature.
        self.last2: List[Any] = [None, None, None, None, None]
        self.whole2: Dict[Any, Callable[[Any, Any], Any]] = {}

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
        if len(self.free) == 2:
            two = self._two(plan, ws)
            if key is not None:
                self.whole2[key] = two
            return two
        return lambda *xs: plan(*self.merged(xs, ws))

    def _two(self, plan: Callable[..., Any], ws: Sequence[Any]) -> Callable[[Any, Any], Any]:
        """``plan`` as a function of the two activations, the weights in place: the activations first and last
        (X ... R: the residual families) without building the argument list per call."""
        if self.free == [0, len(self.fam["inputs"]) - 1]:
            mid = tuple(ws)
            return lambda x, y: plan(x, *mid, y)
        return lambda x, y: plan(*self.merged((x, y), ws))

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
                self.whole2.clear()
            plan = self.plans[key] = self.make(acts, key)
        if key[0] is None:
            self._remember(key, len(acts))
        return plan(*acts)

    def _remember(self, key: Any, acts: int) -> None:
        """File the plan of ``key`` (no switch set) as the last one: the next call with the same activation shapes
        and dtypes takes it without planning (:meth:`Dispatcher.bind`'s fast paths)."""
        if acts == 1:
            whole = self.whole.get(key)
            if whole is not None:
                self.last[:] = [key[1], key[2], whole[0], whole[1]]
        elif acts == 2:
            two = self.whole2.get(key)
            if two is not None:
                self.last2[:] = [key[1], key[2], key[3], key[4], two]


def bound_front(binding: _Binding, family: str) -> Callable[..., Any]:
    """What ``family.bind(*weights)`` returns where a kernel may run: a call whose activations have the last call's
    shapes and dtypes runs that call's plan with the weights appended (no switch read past the raw table, no
    frame of the binding's); any other call is planned (:meth:`_Binding.planned`)."""
    env, env_key, last, last2, planned = _ENV, _ENV_KEY, binding.last, binding.last2, binding.planned

    def bound(*acts: Any) -> Any:
        if env.get(env_key) is None:
            try:
                if len(acts) == 1:
                    x = acts[0]
                    if x.shape == last[0] and x.dtype == last[1]:  # decode repeats the last activation shape
                        return last[2](x, *last[3])  # the plan of all inputs, the weights appended: no frame
                elif len(acts) == 2:  # X and the residual R (qmatvec_residual, mlp_block)
                    x, y = acts
                    if x.shape == last2[0] and x.dtype == last2[1] and y.shape == last2[2] and y.dtype == last2[3]:
                        return last2[4](x, y)
            except AttributeError:
                pass
        return planned(*acts)

    bound.__name__ = f"{family}_bound"
    return bound


class _Fixed:
    """The planner of a binding whose every plan is one given call (:func:`bind_plan`): nothing decided, nothing
    packed (the call takes the weights as given)."""

    def __init__(self, inputs: Sequence[Tuple[str, bool]], plan: Callable[..., Any]) -> None:
        self.fam = {"inputs": [{"name": name, "weight": weight} for name, weight in inputs]}
        self.plan = plan

    def _family(self, _family: str) -> Dict[str, Any]:
        return self.fam

    def explain(self, _family: str, *_arrays: Any, chip: Any = None, modeled: bool = False) -> Any:
        return _NOTHING_CHOSEN

    def _plan(self, _family: str, _arrays: Sequence[Any], _chip: Any, _modeled: bool,
              prepacked: Sequence[int] = ()) -> Callable[..., Any]:
        return self.plan


class _NothingChosen:
    """A decision with no artifact: :meth:`_Binding.packed` keeps the weights as they are."""

    entry = None


_NOTHING_CHOSEN = _NothingChosen()


def bind_plan(family: str, inputs: Sequence[Tuple[str, bool]], plan: Callable[..., Any],
              weights: Sequence[Any]) -> Callable[..., Any]:
    """``plan`` (a function of all the family's inputs, in order; ``inputs``: their names and whether each is a
    weight) behind the exported package's own bound front, its weights fixed: the search times a candidate kernel
    as a consumer of ``family.bind(*weights)`` calls it — the same front, the same planning on the first call of an
    activation signature, the same fast path after — before any store holds the kernel."""
    return bound_front(_Binding(_Fixed(inputs, plan), family, weights, None, False), family)  # type: ignore[arg-type]

"""Run-time dispatch of an exported kernsearch package (copied verbatim into every exported package).

Depends on ``mlx`` only (plus the standard library): it must import and give correct results anywhere
MLX does, GPU or not. For each call it picks, for the running chip, the kernel through a fallback chain
— exact chip → same generation and die → same generation → the family's default config → the plain MLX
op — and, within a chip level, an artifact judged at the call's shape whose config is valid for it (the
family's constraints, evaluated here). A level is taken only with measured evidence that the kernel beats the
MLX op on that chip as consumers call it, through the package's own planned calls, in graph and eager use
(see ``_decision.LEVELS``); otherwise the MLX op runs, called directly with its constant arguments bound. Spec
expressions arrive pre-parsed as small JSON trees and are evaluated by ``_rules.evaluate`` (a closed set of
operators and functions; never Python's ``eval``).

The dispatcher is this module (:class:`Dispatcher`: the running chip, planning and calling) and its siblings, one
concept each: ``_decision`` (the fallback chain and its rules), ``_checks`` (shapes, constraints, integrity),
``_oppath`` and ``_opforms`` (the op path), ``_fronts`` (the per-call fast paths), ``_binding`` (``bind``) and
``_patch`` (mlx-lm models); export ships every one of them. The rules they apply (targets, beating the op, the
timing identity, chip identification, hashes, the expression evaluator, the baseline vocabulary) are kernsearch's
own: ``_rules*.py`` and ``_vocabulary.py`` ship beside them, byte for byte the modules kernsearch itself imports, so
nothing here restates them.

Every kernel file's hash is checked before it is used; each kernel is built once per process. Before an
artifact is first used, its shipped manifest and files must hash to the content hash the store recorded at
publish and its dispatch record must say what its manifest says (:func:`artifact_mismatch`).
"""

from __future__ import annotations

import functools
import json
import weakref
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

try:  # an exported package: the shared modules sit beside this file
    from ._rules import (  # type: ignore[import-not-found,unused-ignore]
        DEFAULT_MARGIN,
        FUNCTIONS,
        SHARED_MEMORY_AT_BUILD,
        VENDOR_TARGETS,
        ExpressionError,
        beats_op,
        choose_chip,
        consumer_low,
        content_sha256,
        cuda_driver_version,
        evaluate,
        factory_texts,
        identify,
        kernel_factory,
        lineage,
        mlx_namespace,
        modes_text,
        named_chip,
        names_in,
        nvrtc_version,
        source_sha256,
        speedup_text,
        timing_identity,
    )
    from ._vocabulary import CONSUMER_MODES, Evidence  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # kernsearch itself: the same modules, at the bottom of its package
    from ..._rules import (
        DEFAULT_MARGIN,
        FUNCTIONS,
        SHARED_MEMORY_AT_BUILD,
        VENDOR_TARGETS,
        ExpressionError,
        beats_op,
        choose_chip,
        consumer_low,
        content_sha256,
        cuda_driver_version,
        evaluate,
        factory_texts,
        identify,
        kernel_factory,
        lineage,
        mlx_namespace,
        modes_text,
        named_chip,
        names_in,
        nvrtc_version,
        source_sha256,
        speedup_text,
        timing_identity,
    )
    from ..._vocabulary import CONSUMER_MODES, Evidence

from ._binding import _Binding, bound_front
from ._checks import (
    _bind_dims,
    _context,
    _dtype_name,
    _out_dtype,
    _range_rules,
    artifact_mismatch,
    decision_fields,
    mx_dtype,
    shape_refusal,
    violation,
    weights_refusal,
)
from ._decision import LEVELS, Chooser, Decision, _reachable
from ._fronts import (
    _ENV,
    _ENV_KEY,
    _KERNELS,
    _MISS,
    _OP,
    _OP_PLANNED,
    DISABLE_VAR,
    MAX_DECISIONS,
    _call_key,
    _file_activations,
    _forget,
    _fronted,
    _native,
    _planned,
    _same,
)
from ._opforms import _direct_form
from ._oppath import op_call

#: 3: each artifact record carries ``manifest`` and ``content_sha256``, checked before first use.
FORMAT = 3
#: Names kernsearch and its tests read off this module (defined in ``_rules`` and the dispatcher's other modules).
__all__ = ["CONSUMER_MODES", "DEFAULT_MARGIN", "DISABLE_VAR", "FUNCTIONS", "LEVELS", "SHARED_MEMORY_AT_BUILD",
           "VENDOR_TARGETS", "Decision", "Dispatcher", "Evidence", "ExpressionError", "artifact_mismatch", "beats_op",
           "consumer_low", "content_sha256", "cuda_driver_version", "decision_fields", "evaluate", "identify",
           "kernel_call", "lineage", "mlx_vocabulary", "modes_text", "nvrtc_version", "op_call", "shape_refusal",
           "source_sha256", "speedup_text", "timing_identity", "violation", "weights_refusal"]
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


class Dispatcher(Chooser):
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
        """(chip record, target) of the chip a call runs on, by kernsearch's own chip rule (``_rules.choose_chip``):
        the chip named (``named_chip``: an unknown name is a ``ValueError``), else the device MLX runs on here (or an
        injected identity: ``mx.device_info()`` output); target "" = none."""
        registry = self.table["chips"]
        identity = chip if isinstance(chip, dict) else None

        def here() -> Dict[str, Any]:
            info = identity if identity is not None else self._device_info
            if info is None:
                info = _device_info()
            found: Dict[str, Any] = identify(info if identity is not None or _gpu_available() else {}, registry)
            return found

        record = choose_chip(None if identity is not None else chip, lambda name: named_chip(name, registry), here,
                             lambda c: str(c.get("vendor", "")))
        target = VENDOR_TARGETS.get(record.get("vendor", ""), "")
        return record, target


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
        return _native(mx, self._launch(fam, decision, chip, prepacked), native)

    def _launch(self, fam: Dict[str, Any], decision: Decision, chip: Any,
                prepacked: Sequence[int]) -> Callable[..., Any]:
        """The chosen kernel's launch as a function of the call's arrays (:func:`kernel_call`): its geometry, output
        shapes and parameters evaluated for the decision's config and shape, its built kernel object."""
        import mlx.core as mx

        entry = decision.entry
        assert entry is not None  # a kernel was chosen
        record, _ = self.running_chip(chip)
        dims = dict(zip(fam["dims"], decision.shape))
        names = _context(fam, entry["config"], dims, record, decision.dtype)
        launch = fam["launch"]
        shared = int(evaluate(launch["shared_memory"], names)) if launch.get("shared_memory") else 0
        # A kernel that accumulates into its outputs (split-K) needs them zero-filled.
        zero = launch.get("zero_outputs") and bool(evaluate(launch["zero_outputs"], names))
        transpose = [t and i not in prepacked for i, t in enumerate(self._transposes(fam, names))]
        source = self._source(entry)
        assert source is not None  # checked while deciding
        return kernel_call(
            self._kernel(source, shared), _template_args(mx, source["template"]),
            tuple(int(v) for v in evaluate(launch["grid"], names)),
            tuple(int(v) for v in evaluate(launch["threadgroup"], names)),
            [tuple(int(s) for s in evaluate(o["shape"], names)) for o in fam["outputs"]],
            [_out_dtype(o, decision.dtype) for o in fam["outputs"]],
            [mx.array([p["value"]], dtype=mx_dtype(p["dtype"])) for p in fam.get("params", [])],
            transpose, 0.0 if zero else None)

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
        return bound_front(binding, family)

    def _kernel(self, source: Dict[str, Any], shared_memory: int) -> Any:
        key = (source["sha256"], shared_memory if source["target"] in SHARED_MEMORY_AT_BUILD else 0)
        if key not in self._kernels:
            self._kernels[key] = self.kernel_factory(source, key[1])
        return self._kernels[key]


def _template_args(mx: Any, template: Sequence[Any]) -> List[Tuple[str, Any]]:
    """A kernel's template arguments as MLX takes them: a dtype named by its MLX name becomes that dtype; any other
    value stays as the manifest gives it (a name of anything else of ``mlx.core`` is not looked up: MLX refuses
    what is neither a dtype, an int nor a bool)."""
    return [(k, mx_dtype(v) if isinstance(v, str) and isinstance(getattr(mx, v, None), mx.Dtype) else v)
            for k, v in template]


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
    texts = factory_texts(source["target"], source["header"], source["source"], shared_memory)
    args = dict(name=source["name"], input_names=list(source["input_names"]),
                output_names=list(source["output_names"]), source=texts.source, header=texts.header)
    make = kernel_factory(source["target"])
    if source["target"] in SHARED_MEMORY_AT_BUILD:
        return make(**args, shared_memory=shared_memory)
    return make(**args)

"""``patch(model)``: an mlx-lm model of the Llama family decodes through the exported package's fused families.

Copied verbatim into every exported package (beside ``_runtime.py``); needs ``mlx`` only and never imports mlx-lm.

A block is patched only when it is exactly the one this module reproduces: mlx-lm's ``TransformerBlock`` (Llama,
Mistral, Qwen2), whose own ``__call__``, its attention's and its MLP's are, syntax tree for syntax tree, the forward
written here (:data:`FORWARDS`, mlx-lm 0.32), with affine-quantized projections of 4 or 8 bits and groups of 32, 64
or 128. Anything else is left alone, and :meth:`Patcher.explain` says why. A patched block keeps its parameters
as they are (the model's ``parameters()`` are the same arrays): its class is swapped for a subclass whose ``__call__``
runs, for a decode step (at most :data:`DECODE_ROWS` rows), norm + Q/K/V (one matrix, concatenated once here), O +
residual, norm + gate/up SwiGLU and down + residual through the package (each a kernel where one was measured to win,
the MLX op otherwise), and mlx-lm's own RoPE, KV cache and attention in between (the step itself:
``_patch_step.py``; RoPE replayed with the projection where it is one of mlx-lm's, mlx-lm's ``KVCache`` written by
the step, its keys and values in one buffer where the RoPE allows); a prompt (more rows) runs mlx-lm's own forward.
``unpatch`` swaps the class back and drops the concatenated copies.

Where the package runs no kernel (nothing was measured to beat the MLX op on this chip at a block's shapes), the
block, or the decode step's row count, runs mlx-lm's own forward: routed through the package it would compute the
same ops with the package's per-call cost on top. ``patch(model, always=True)`` routes every decode step through the
package all the same (what checks the rebuilt forward on MLX's CPU back-end, where no kernel runs).
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Set, Tuple

from ._fingerprint import fingerprint
from ._patch_step import _ATTR, DECODE_ROWS, _patched_class, _trace

#: mlx-lm's blocks this module reproduces: (module, class) of the block, and the fingerprints (:func:`fingerprint`)
#: of the block's, its attention's and its MLP's ``__call__`` (mlx-lm 0.32: Llama and Qwen2 share them).
BLOCKS = {("mlx_lm.models.llama", "TransformerBlock"), ("mlx_lm.models.qwen2", "TransformerBlock")}
FORWARDS = {("112fe90a7ceb416a", "cdf1e40748cdc023", "aa742e68e3341e3a")}
#: MLX's affine quantization as the families take it.
BITS = (4, 8)
GROUPS = (32, 64, 128)
#: Why a recognised block was left to mlx-lm by the last ``patch`` (no kernel measured to win at its shapes).
_ALONE = "_kernsearch_alone"
NOTHING_WINS = ("no kernel of the package was measured to beat the MLX op on this chip at this block's shapes (1 to "
                f"{DECODE_ROWS} rows): mlx-lm's own forward runs, which the package would only call through "
                "(patch(model, always=True) routes it through the package all the same)")


@dataclass(frozen=True)
class Part:
    """One fused step of a patched block: what it runs (``runs``: families in order) and why."""

    step: str
    runs: Tuple[str, ...]
    why: str
    decisions: Tuple[str, ...] = ()


@dataclass(frozen=True)
class LayerReport:
    """What one layer runs: its parts, or why it was left alone."""

    index: int
    kind: str
    patched: bool
    parts: Tuple[Part, ...] = ()
    left_alone: str = ""
    #: The decode steps' row counts that run through the package (a kernel was measured to win at one of their
    #: calls); empty: every count up to DECODE_ROWS (``patch(model, always=True)``).
    rows: Tuple[int, ...] = ()

    def __str__(self) -> str:
        if not self.patched:
            return f"layer {self.index} ({self.kind}): left alone: {self.left_alone}"
        which = (f"decode steps of {_spans(self.rows)} rows run through the package (a kernel measured to win at "
                 "their shapes); other steps and a prompt run" if self.rows else
                 f"a prompt (more than {DECODE_ROWS} rows) runs")
        lines = [f"layer {self.index} ({self.kind}): patched; {which} mlx-lm's own forward"]
        for p in self.parts:
            lines.append(f"  {p.step}: {' + '.join(p.runs)} ({p.why})")
            lines.extend(f"    {line}" for d in p.decisions for line in d.splitlines())
        return "\n".join(lines)


@dataclass(frozen=True)
class ModelReport:
    """``explain(model)``: every layer's :class:`LayerReport`."""

    layers: Tuple[LayerReport, ...]
    notes: Tuple[str, ...] = ()

    @property
    def patched(self) -> int:
        return sum(1 for r in self.layers if r.patched)

    def __str__(self) -> str:
        head = f"{self.patched} of {len(self.layers)} layers patched"
        return "\n".join([head, *self.notes, *(str(r) for r in self.layers)])


@dataclass
class _State:
    """A patched block's bound functions (None: that half runs mlx-lm's own modules) and its report."""

    original: type
    report: LayerReport
    qkv: Optional[Callable[[Any], Any]] = None
    split: Tuple[int, int] = (0, 0)
    #: the concatenated projection's width (queries, keys and values)
    width: int = 0
    qkv_bias: Any = None
    out: Optional[Callable[[Any, Any], Any]] = None
    gate_up: Optional[Callable[[Any], Any]] = None
    down: Optional[Callable[[Any, Any], Any]] = None
    #: The package's calls with the Python between them traced once per shape and replayed by ``mx.compile``
    #: (:func:`_trace`): ``heads(x)`` the projection to the heads; ``tail(o, x)`` O + residual then the MLP (both
    #: halves patched); ``mlp(h2)`` the MLP (attention left to mlx-lm). None: called one by one.
    heads: Optional[Callable[[Any], Any]] = None
    #: ``step(x, offset)``: ``heads`` then RoPE at ``offset`` (an int32 array: ``_patch_step``'s docstring): the
    #: queries, keys and values.
    step: Optional[Callable[[Any, Any], Tuple[Any, Any, Any]]] = None
    #: ``joined(x, offsets)``: ``heads`` with every head turned by one RoPE call (the values' at offset 0): the
    #: queries and the keys and values as one view, for a :class:`_patch_step._Joined` cache (``_patch_step``'s
    #: docstring). None where the RoPE or the heads' widths do not allow it.
    joined: Optional[Callable[[Any, Any], Tuple[Any, Any]]] = None
    tail: Optional[Callable[[Any, Any], Any]] = None
    mlp: Optional[Callable[[Any], Any]] = None
    arrays: List[Any] = field(default_factory=list)
    #: per step, (family, a one-row call's arrays) for each family it binds: what explain asks the package about
    probes: Dict[str, List[Tuple[str, List[Any]]]] = field(default_factory=dict)
    #: The decode row counts that run through the package (None: every count up to DECODE_ROWS).
    rows: Optional[FrozenSet[int]] = None


class Unsupported(Exception):
    """Why a block, or one half of it, is left to mlx-lm."""


def _nn() -> Any:
    """``mlx.nn`` (imported here: the package imports without it until a model is patched; untyped for mypy)."""
    return importlib.import_module("mlx.nn")


# -- recognising a block ---------------------------------------------------------------------------------

def _quant(layer: Any, name: str) -> Tuple[int, int]:
    """(bits, group) of an affine-quantized linear layer the families take; else :class:`Unsupported`."""
    nn = _nn()

    if not isinstance(layer, nn.QuantizedLinear):
        raise Unsupported(f"{name} is {type(layer).__name__}, not a QuantizedLinear (quantize the model first)")
    mode = getattr(layer, "mode", "affine")
    if mode != "affine" or "biases" not in layer:
        raise Unsupported(f"{name} is quantized in mode {mode!r}; the families take MLX's affine quantization")
    if layer.bits not in BITS or layer.group_size not in GROUPS:
        raise Unsupported(f"{name}: {layer.bits} bits, groups of {layer.group_size}; the families take 4 or 8 bits, "
                          "groups of 32, 64 or 128")
    return int(layer.bits), int(layer.group_size)


def recognise(block: Any) -> str:
    """Why ``block`` is not a block this module reproduces ('' when it is)."""
    nn = _nn()

    cls = type(block)
    if (cls.__module__, cls.__name__) not in BLOCKS:
        return f"{cls.__module__}.{cls.__name__} is not a block of mlx-lm's Llama family (llama, mistral, qwen2)"
    attn, mlp = getattr(block, "self_attn", None), getattr(block, "mlp", None)
    if attn is None or mlp is None:
        return "no self_attn or mlp"
    prints = (fingerprint(cls.__call__), fingerprint(type(attn).__call__), fingerprint(type(mlp).__call__))
    if prints not in FORWARDS:
        return ("its forward is not the one this package reproduces (mlx-lm 0.32's; fingerprints "
                f"{'/'.join(prints)}): another mlx-lm version")
    for name in ("input_layernorm", "post_attention_layernorm"):
        if type(getattr(block, name, None)) is not nn.RMSNorm:
            return f"{name} is not an nn.RMSNorm"
    if not all(hasattr(attn, a) for a in ("n_heads", "n_kv_heads", "scale", "rope")):
        return "its attention lacks n_heads, n_kv_heads, scale or rope"
    return ""


# -- binding the package's families ----------------------------------------------------------------------

class Patcher:
    """Patches mlx-lm models through one package's dispatcher (``bind``, ``explain`` and its dispatch table)."""

    def __init__(self, dispatcher: Any) -> None:
        self.d = dispatcher

    def _family(self, name: str) -> Optional[Dict[str, Any]]:
        fam: Optional[Dict[str, Any]] = self.d.table.get("families", {}).get(name)
        return fam

    def _eps(self, name: str) -> Optional[float]:
        fam = self._family(name) or {}
        for p in fam.get("params", []):
            if p.get("name") == "eps":
                return float(p["value"])
        return None

    def _bind(self, name: str, named: Dict[str, Any], state: _State,
              step: str) -> Tuple[Callable[..., Any], Tuple[str, ...]]:
        """``name`` bound to the weights in ``named`` (by the family's input names) and its activations' names, in
        the order the bound function takes them; the weights and a one-row call's arrays (:func:`_probe`) filed in
        ``state``."""
        import mlx.core as mx

        fam = self._family(name)
        if fam is None:
            raise Unsupported(f"this package has no {name}")
        inputs = fam.get("inputs", [])
        missing = [i["name"] for i in inputs if i.get("weight") and i["name"] not in named]
        if missing:
            raise Unsupported(f"{name}'s weight input(s) {', '.join(missing)} are not of a block")
        weights = [named[i["name"]] for i in inputs if i.get("weight")]
        acts = tuple(str(i["name"]) for i in inputs if not i.get("weight"))
        try:
            fn = self.d.bind(name, *weights)
        except (TypeError, ValueError) as exc:  # the package refuses these weights: mlx-lm's modules run
            raise Unsupported(f"{name}.bind refused the block's weights: {exc}") from None
        state.arrays.extend(weights)
        probe = _probe(mx, inputs, named)
        if all(a is not None for a in probe):
            state.probes.setdefault(step, []).append((name, probe))
        return fn, acts

    def _single(self, name: str, named: Dict[str, Any], state: _State, step: str) -> Callable[[Any], Any]:
        fn, acts = self._bind(name, named, state, step)
        if acts != ("X",):
            raise Unsupported(f"{name} takes {', '.join(acts)}; expected X alone")
        return fn

    def _residual(self, name: str, named: Dict[str, Any], state: _State, step: str) -> Callable[[Any, Any], Any]:
        """``f(x, r) = r + x·Wᵀ`` through ``name`` (a family taking X and R in either order)."""
        fn, acts = self._bind(name, named, state, step)
        if acts == ("X", "R"):
            return fn
        if acts == ("R", "X"):
            return lambda x, r: fn(r, x)
        raise Unsupported(f"{name} takes {', '.join(acts)}; expected X and R")

    # -- the halves of a block ---------------------------------------------------------------------------
    def _normed(self, step: str, fused: str, plain: str, norm: Any, named: Dict[str, Any],
                state: _State) -> Tuple[Callable[[Any], Any], Part]:
        """norm + ``plain`` fused as ``fused`` where the package has it at the norm's eps; else the norm (MLX's
        ``fast.rms_norm``) then ``plain``."""
        import mlx.core as mx

        eps, fam_eps = float(norm.eps), self._eps(fused)
        if fam_eps is not None and abs(fam_eps - eps) <= 1e-12 * max(1.0, abs(eps)):
            fn = self._single(fused, {**named, "gamma": norm.weight}, state, step)
            return fn, Part(step, (fused,), "one launch")
        why = (f"the norm's eps {eps:g} is not {fused}'s {fam_eps:g}" if fam_eps is not None
               else f"this package has no {fused}")
        inner = self._single(plain, named, state, step)
        gamma = norm.weight

        def run(x: Any) -> Any:
            return inner(mx.fast.rms_norm(x, gamma, eps))

        return run, Part(step, ("mx.fast.rms_norm", plain), why)

    def _projection(self, step: str, layer: Any, name: str, state: _State) -> Tuple[Callable[[Any, Any], Any], Part]:
        """``f(x, r) = r + layer(x)``: ``qmatvec_residual`` where the layer has no bias (the package has it), else
        ``qmatvec``, the bias and the residual added as mlx-lm adds them."""
        bits, _ = _quant(layer, name)
        named = {"W": layer.weight, "S": layer.scales, "Bq": layer.biases, "bits": bits}
        bias = layer["bias"] if "bias" in layer else None
        if bias is None and self._family("qmatvec_residual") is not None:
            return self._residual("qmatvec_residual", named, state, step), Part(step, ("qmatvec_residual",),
                                                                                 "one launch")
        why = f"{name} has a bias" if bias is not None else "this package has no qmatvec_residual"
        inner = self._single("qmatvec", named, state, step)
        if bias is None:
            return (lambda x, r: r + inner(x)), Part(step, ("qmatvec", "add"), why)
        return (lambda x, r: r + (inner(x) + bias)), Part(step, ("qmatvec", "bias", "add"), why)

    def _attention(self, block: Any, state: _State) -> List[Part]:
        import mlx.core as mx

        attn = block.self_attn
        projs = [getattr(attn, n) for n in ("q_proj", "k_proj", "v_proj")]
        quants = {_quant(p, n) for p, n in zip(projs, ("q_proj", "k_proj", "v_proj"))}
        if len(quants) != 1:
            raise Unsupported("q_proj, k_proj and v_proj are quantized differently (one matrix needs one "
                              "quantization)")
        biased = ["bias" in p for p in projs]
        if any(biased) and not all(biased):
            raise Unsupported("some of q_proj, k_proj, v_proj have a bias, others not")
        named = {"W": mx.concatenate([p.weight for p in projs]), "S": mx.concatenate([p.scales for p in projs]),
                 "Bq": mx.concatenate([p.biases for p in projs]), "bits": next(iter(quants))[0]}
        qkv, part = self._normed("norm + Q/K/V", "rmsnorm_qmatvec", "qmatvec", block.input_layernorm, named, state)
        nq, nk = projs[0].weight.shape[0], projs[1].weight.shape[0]
        out, opart = self._projection("O + residual", attn.o_proj, "o_proj", state)
        if all(biased):
            state.qkv_bias = mx.concatenate([p.bias for p in projs])
            state.arrays.append(state.qkv_bias)
            part = Part(part.step, (*part.runs, "bias"), part.why + "; the q/k/v biases added after")
        state.qkv, state.split, state.out = qkv, (nq, nq + nk), out
        state.width = nq + nk + projs[2].weight.shape[0]
        return [part, opart]

    def _mlp(self, block: Any, state: _State) -> List[Part]:
        mlp = block.mlp
        g, u = mlp.gate_proj, mlp.up_proj
        quant = _quant(g, "gate_proj")
        if quant != _quant(u, "up_proj"):
            raise Unsupported("gate_proj and up_proj are quantized differently")
        if "bias" in g or "bias" in u:
            raise Unsupported("gate_proj or up_proj has a bias (the SwiGLU families take none)")
        named = {"W": g.weight, "S": g.scales, "Bq": g.biases, "Wu": u.weight, "Su": u.scales, "Bu": u.biases,
                 "bits": quant[0]}
        gate_up, part = self._normed("norm + gate/up SwiGLU", "rmsnorm_swiglu_qmatvec", "swiglu_qmatvec",
                                     block.post_attention_layernorm, named, state)
        down, dpart = self._projection("down + residual", mlp.down_proj, "down_proj", state)
        state.gate_up, state.down = gate_up, down
        return [part, dpart]

    # -- the public hooks --------------------------------------------------------------------------------
    def patch(self, model: Any, always: bool = False, compiled: bool = True) -> ModelReport:
        """Patch every block of ``model`` this module reproduces (see the module's docstring) where a kernel of the
        package was measured to win at its shapes on this chip (``always``: every such block, kernels or not);
        returns :meth:`explain`'s report. Patching a patched model again is a no-op for its patched blocks.
        ``compiled``: each block's package calls replayed by ``mx.compile`` (:func:`_trace`); False: called one by
        one, each through the package's front, on every step."""
        decisions: Dict[Any, bool] = {}  # (family, rows, shapes, dtype) -> a kernel runs: layers share their shapes
        for index, block in enumerate(_layers(model)):
            if _ATTR not in getattr(block, "__dict__", {}) and not recognise(block):
                self._patch_block(index, block, always, decisions, compiled)
        report = self.explain(model)
        alone = [r for r in report.layers if not r.patched]
        if alone or not report.layers:
            first = alone[0].left_alone if alone else report.notes[0]
            warnings.warn(f"kernsearch patch: {len(alone)} of {len(report.layers)} layers left alone ({first}); "
                          "explain(model) says why for each", RuntimeWarning, stacklevel=2)
        return report

    def _patch_block(self, index: int, block: Any, always: bool, decisions: Dict[Any, bool],
                     compiled: bool = True) -> None:
        """Patch one recognised block, or leave it alone: no half the package can take, or (unless ``always``) no
        row count at which a kernel runs (the reason is kept for :meth:`explain`)."""
        import mlx.core as mx

        state = _State(type(block), LayerReport(index, type(block).__module__.rsplit(".", 1)[-1], True))
        parts: List[Part] = []
        for half, name in ((self._attention, "attention"), (self._mlp, "MLP")):
            try:
                parts.extend(half(block, state))
            except Unsupported as exc:
                parts.append(Part(name, ("mlx-lm's own modules",), str(exc)))
        if not any(p.runs != ("mlx-lm's own modules",) for p in parts):
            return
        state.rows = None if always else self._kernel_rows(state, decisions)
        if state.rows is not None and not state.rows:
            object.__setattr__(block, _ALONE, NOTHING_WINS)
            return
        mx.eval(state.arrays)
        rows = tuple(sorted(state.rows)) if state.rows is not None else ()
        state.report = LayerReport(index, state.report.kind, True, tuple(parts), rows=rows)
        if compiled:
            _trace(state, block.self_attn)
        getattr(block, "__dict__", {}).pop(_ALONE, None)
        object.__setattr__(block, _ATTR, state)
        block.__class__ = _patched_class(type(block))

    def _kernel_rows(self, state: _State, seen: Dict[Any, bool]) -> FrozenSet[int]:
        """The decode row counts (1 to DECODE_ROWS) at which the package runs a kernel for one of the block's calls:
        its decision for each family the block binds, asked with that many rows of zeros (``seen``: decisions
        already asked, by family, shapes and dtype)."""
        import mlx.core as mx

        calls = [(fam, arrays, {i for i, spec in enumerate((self._family(fam) or {}).get("inputs", []))
                                if not spec.get("weight")}, (fam, tuple(tuple(a.shape) for a in arrays),
                                                             str(arrays[0].dtype)))
                 for pairs in state.probes.values() for fam, arrays in pairs]
        rows: Set[int] = set()
        for m in range(1, DECODE_ROWS + 1):
            for fam, arrays, acts, key in calls:
                if (m, key) not in seen:
                    at_m = [mx.zeros((m, *a.shape[1:]), dtype=a.dtype) if i in acts else a
                            for i, a in enumerate(arrays)]
                    seen[(m, key)] = self.d.explain(fam, *at_m).entry is not None
                if seen[(m, key)]:
                    rows.add(m)
                    break
        return frozenset(rows)

    def unpatch(self, model: Any) -> int:
        """Restore every patched block of ``model`` (its class; the concatenated copies dropped); returns how many."""
        n = 0
        for block in _layers(model):
            getattr(block, "__dict__", {}).pop(_ALONE, None)
            state = getattr(block, "__dict__", {}).get(_ATTR)
            if state is not None:
                block.__class__ = state.original
                object.__delattr__(block, _ATTR)
                n += 1
        return n

    def explain(self, model: Any) -> ModelReport:
        """What each layer of ``model`` runs and why: for a patched block, each step's families and the package's
        decision for a one-row decode step; for another, why it is left alone."""
        layers = _layers(model)
        notes = () if layers else ("no layers found (model.layers or model.model.layers): nothing to patch",)
        rows = []
        for index, block in enumerate(layers):
            state = getattr(block, "__dict__", {}).get(_ATTR)
            kind = type(block).__module__.rsplit(".", 1)[-1]
            if state is None:
                why = (recognise(block) or _unquantized(block) or getattr(block, "__dict__", {}).get(_ALONE)
                       or "not patched (call patch(model))")
                rows.append(LayerReport(index, kind, False, left_alone=why))
            else:
                rows.append(self._with_decisions(state))
        return ModelReport(tuple(rows), notes)

    def _with_decisions(self, state: _State) -> LayerReport:
        """The layer's report with the package's decision for each family it calls, at one row (a decode step)."""
        report = state.report
        return LayerReport(report.index, report.kind, True, tuple(
            Part(p.step, p.runs, p.why, tuple(self._decisions(p, state))) for p in report.parts),
            report.left_alone, report.rows)

    def _decisions(self, part: Part, state: _State) -> List[str]:
        return [str(self.d.explain(fam, *arrays)) for fam, arrays in state.probes.get(part.step, [])]


def _probe(mx: Any, inputs: List[Dict[str, Any]], named: Dict[str, Any]) -> List[Any]:
    """A one-row call's arrays of a family (its inputs in order): zero activations X and R of one row, the block's
    own weights and parameters (None where the block has no array of that name)."""
    w = named["W"]
    rows = {"X": (1, w.shape[1] * 32 // int(named["bits"])), "R": (1, w.shape[0])}
    return [mx.zeros(rows[i["name"]], dtype=named["S"].dtype) if i["name"] in rows and not i.get("weight")
            else named.get(i["name"]) for i in inputs]


def _spans(rows: Tuple[int, ...]) -> str:
    """Row counts as runs: (1, 2, 3, 5) -> '1-3, 5'."""
    spans: List[List[int]] = []
    for r in rows:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _unquantized(block: Any) -> str:
    """Why no half of a recognised block can run through the package ('' when one can)."""
    whys = []
    for owner, names in ((block.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
                         (block.mlp, ("gate_proj", "up_proj", "down_proj"))):
        try:
            for name in names:
                _quant(getattr(owner, name), name)
        except Unsupported as exc:
            whys.append(str(exc))
    return "; ".join(whys) if len(whys) == 2 else ""


def _layers(model: Any) -> List[Any]:
    """The transformer blocks of an mlx-lm model (``model.layers``, which mlx-lm's models expose)."""
    layers = getattr(model, "layers", None)
    if layers is None:
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
    return list(layers) if isinstance(layers, (list, tuple)) else []


__all__ = ["DECODE_ROWS", "LayerReport", "ModelReport", "Part", "Patcher", "fingerprint", "recognise"]

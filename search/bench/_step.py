"""A Llama-shaped decode step (attention left out on both sides) with synthetic quantized weights, written three
ways: plain MLX with separate projections, plain MLX with Q/K/V and gate/up concatenated, and through an exported
kernsearch package's fused decode families (four launches per layer).

The step's shapes (what ``--job`` tunes) and the package's calls are declared once, in :data:`CALLS`: a role of the
layer, the family that runs it and the matrix it reads. The arrays are built on the device MLX runs on (random
normal weights, quantized by ``mx.quantize``), one layer at a time, so a 32-layer 7B-shaped step (3.6 GB at 4 bits)
costs seconds, not minutes of NumPy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import KernsearchError

#: The norm's epsilon (Llama's); the fused families' spec parameter must agree (checked at bind time).
EPS = 1e-5


class BenchError(KernsearchError):
    """The benchmark cannot run as asked (a bad shape option, a package without the fused families...)."""


@dataclass(frozen=True)
class Call:
    """One launch of a layer through the package: ``role`` (qkv, o, gate_up, down), its family and its matrix,
    ``N`` rows of ``K`` values (gate_up: each of its two matrices)."""

    role: str
    family: str
    n: int
    k: int
    mats: int = 1


@dataclass(frozen=True)
class StepShape:
    """The step's dimensions and quantization (options of ``kernsearch bench decode``)."""

    hidden: int = 4096
    ffn: int = 11008
    layers: int = 32
    bits: int = 4
    group: int = 64
    dtype: str = "float16"

    def check(self) -> StepShape:
        if self.bits not in (4, 8):
            raise BenchError(f"--bits {self.bits}: MLX's affine quantization takes 4 or 8")
        if self.group not in (32, 64, 128):
            raise BenchError(f"--group {self.group}: MLX's affine quantization takes groups of 32, 64 or 128")
        for name, value in (("--hidden", self.hidden), ("--ffn", self.ffn)):
            if not 0 < value <= 65536 or value % self.group:
                raise BenchError(f"{name} {value}: must be a positive multiple of the group size ({self.group}), "
                                 "at most 65536")
        if not 0 < self.layers <= 256:
            raise BenchError(f"--layers {self.layers}: must be 1 to 256")
        if self.dtype not in ("float16", "bfloat16", "float32"):
            raise BenchError(f"--dtype {self.dtype}: float16, bfloat16 or float32")
        return self

    def calls(self) -> list[Call]:
        """The layer as four fused launches: norm + Q/K/V, O + residual, norm + gate/up, down + residual."""
        h, f = self.hidden, self.ffn
        return [Call("qkv", "rmsnorm_qmatvec", 3 * h, h), Call("o", "qmatvec_residual", h, h),
                Call("gate_up", "rmsnorm_swiglu_qmatvec", f, h, mats=2), Call("down", "qmatvec_residual", h, f)]

    def calls2(self) -> list[Call]:
        """The layer as two launches: norm + Q/K/V, and the post-attention half in one persistent kernel."""
        return [self.calls()[0], Call("mlp", "mlp_block", self.hidden, self.hidden)]

    def all_calls(self) -> list[Call]:
        return [*self.calls(), self.calls2()[1]]

    def dims(self, m: int, call: Call) -> dict[str, int]:
        """The family's problem dims for one call at ``m`` rows (MLX's quantized layout: KW words, NG groups)."""
        if call.role == "mlp":
            h, f = self.hidden, self.ffn
            return {"M": m, "H": h, "F": f, "KWH": h * self.bits // 32, "NGH": h // self.group,
                    "KWF": f * self.bits // 32, "NGF": f // self.group}
        return {"M": m, "N": call.n, "K": call.k, "KW": call.k * self.bits // 32, "NG": call.k // self.group}

    def matrix_bytes(self, call: Call) -> int:
        """Bytes a call's weights occupy (packed words, scales and biases): what it must stream."""
        if call.role == "mlp":
            return sum(self.matrix_bytes(c) for c in self.calls()[1:])
        size = 4 if self.dtype == "float32" else 2
        one = call.n * call.k * self.bits // 8 + 2 * call.n * (call.k // self.group) * size
        return call.mats * one

    def layer_bytes(self) -> int:
        size = 4 if self.dtype == "float32" else 2
        return sum(self.matrix_bytes(c) for c in self.calls()) + 2 * self.hidden * size


Quant = tuple[Any, Any, Any]


class Layer:
    """One layer's weights: two norm scales, Q, K, V, O, gate, up, down (each quantized), and the concatenated
    Q/K/V and gate/up matrices the concatenated plain form (and the package) read."""

    def __init__(self, mx: Any, shape: StepShape, key: Any) -> None:
        h, f = shape.hidden, shape.ffn
        dt = getattr(mx, shape.dtype)
        keys = mx.random.split(key, 9)
        self.shape = shape
        self.n1 = (1 + 0.1 * mx.random.normal((h,), key=keys[0])).astype(dt)
        self.n2 = (1 + 0.1 * mx.random.normal((h,), key=keys[1])).astype(dt)
        dense = {name: (0.02 * mx.random.normal(dims, key=k)).astype(dt) for (name, dims), k in zip(
            (("q", (h, h)), ("k", (h, h)), ("v", (h, h)), ("o", (h, h)), ("gate", (f, h)), ("up", (f, h)),
             ("down", (h, f))), keys[2:])}
        self.q, self.k, self.v, self.o, self.gate, self.up, self.down = (
            self._quantize(mx, dense[name]) for name in ("q", "k", "v", "o", "gate", "up", "down"))
        # The concatenated forms are arrays of their own (concatenate copies), as a converted checkpoint holds them.
        self.qkv = _cat(mx, self.q, self.k, self.v)
        self.gu = _cat(mx, self.gate, self.up)
        mx.eval(self.arrays())

    def _quantize(self, mx: Any, w: Any) -> Quant:
        q = mx.quantize(w, group_size=self.shape.group, bits=self.shape.bits)
        return q[0], q[1], q[2]

    def arrays(self) -> list[Any]:
        quants = (self.q, self.k, self.v, self.qkv, self.o, self.gate, self.up, self.gu, self.down)
        return [self.n1, self.n2, *(a for t in quants for a in t)]


def _cat(mx: Any, *quants: Quant) -> Quant:
    w, s, b = (mx.concatenate([q[i] for q in quants], axis=0) for i in range(3))
    return w, s, b


def build_layers(mx: Any, shape: StepShape, seed: int, say: Callable[[str], None]) -> list[Layer]:
    key = mx.random.key(seed)
    layers = []
    for i in range(shape.layers):
        key, sub = mx.random.split(key)
        layers.append(Layer(mx, shape, sub))
        if (i + 1) % 8 == 0 or i + 1 == shape.layers:
            say(f"built {i + 1} of {shape.layers} layers' weights")
    return layers


def qmm(mx: Any, shape: StepShape) -> Callable[[Any, Quant], Any]:
    def run(x: Any, q: Quant) -> Any:
        return mx.quantized_matmul(x, *q, transpose=True, group_size=shape.group, bits=shape.bits)

    return run


def plain_step(mx: Any, layers: Sequence[Layer], concatenated: bool) -> Callable[[Any], list[Any]]:
    """Plain MLX, as a user writes a layer: ``mx.fast.rms_norm``, ``mx.quantized_matmul``, silu, adds. The step
    returns the hidden state and each layer's K and V (what a KV cache keeps), so nothing is pruned as unused."""
    shape = layers[0].shape
    h, f = shape.hidden, shape.ffn
    mm = qmm(mx, shape)

    def layer(lay: Layer, x: Any) -> tuple[Any, Any]:
        n = mx.fast.rms_norm(x, lay.n1, EPS)
        if concatenated:
            qkv = mm(n, lay.qkv)
            attn, kv = qkv[:, :h], qkv[:, h:]
        else:
            attn, kv = mm(n, lay.q), [mm(n, lay.k), mm(n, lay.v)]
        x = x + mm(attn, lay.o)  # attention left out: Q stands in for its output
        n = mx.fast.rms_norm(x, lay.n2, EPS)
        if concatenated:
            gu = mm(n, lay.gu)
            g, u = gu[:, :f], gu[:, f:]
        else:
            g, u = mm(n, lay.gate), mm(n, lay.up)
        return x + mm(g * mx.sigmoid(g) * u, lay.down), kv

    def step(x: Any) -> list[Any]:
        kept: list[Any] = []
        for lay in layers:
            x, kv = layer(lay, x)
            kept.extend(kv if isinstance(kv, list) else [kv])
        return [x, *kept]

    return step


@dataclass(frozen=True)
class Bound:
    """A family's function bound to one layer's weights: called with the activations X (and R, the residual, for
    the O and down projections), in that order, exactly as a consumer calls it."""

    fn: Callable[..., Any]
    residual: bool

    def __call__(self, X: Any, R: Any = None) -> Any:  # noqa: N803 - the families' input names
        return self.fn(X, R) if self.residual else self.fn(X)


def _first(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A family with scratch outputs (mlp_block: Y, X1, G, SYNC): its first output."""
    return lambda *xs: fn(*xs)[0]


def call_inputs(layer: Layer, role: str) -> dict[str, Any]:
    """The arrays of one call by the fused families' input names (their specs: X, gamma, W/S/Bq, Wu/Su/Bu, R;
    mlp_block: Wo/So/Bo, Wg/Sg/Bg, Wu/Su/Bu, Wd/Sd/Bd)."""
    named: dict[str, Any] = {}
    if role == "mlp":
        named["gamma"] = layer.n2
        for prefix, q in (("o", layer.o), ("g", layer.gate), ("u", layer.up), ("d", layer.down)):
            named.update(zip((f"W{prefix}", f"S{prefix}", f"B{prefix}"), q))
        return named
    mats = {"qkv": (layer.qkv,), "o": (layer.o,), "gate_up": (layer.gate, layer.up), "down": (layer.down,)}[role]
    named.update(zip(("W", "S", "Bq"), mats[0]))
    if len(mats) > 1:
        named.update(zip(("Wu", "Su", "Bu"), mats[1]))
    if role in ("qkv", "gate_up"):
        named["gamma"] = layer.n1 if role == "qkv" else layer.n2
    return named


def bind_layer(pkg: Any, families: dict[str, Any], layer: Layer, calls: Sequence[Call]) -> dict[str, Bound]:
    """Each call of the layer bound to its weights once (``FAMILY.bind``), as the package's docs say to."""
    out = {}
    for call in calls:
        fam = families[call.family]
        named = call_inputs(layer, call.role)
        missing = [i.name for i in fam.inputs if i.weight and i.name not in named]
        if missing:
            raise BenchError(f"{call.family}: weight input(s) {', '.join(missing)} are not of a decode layer")
        acts = tuple(i.name for i in fam.inputs if not i.weight)
        residual = call.role in ("o", "down", "mlp")
        if acts != (("X", "R") if residual else ("X",)):
            raise BenchError(f"{call.family}: activations {', '.join(acts)}; a decode layer passes "
                             f"{'X, R' if residual else 'X'}")
        fn = getattr(pkg, call.family).bind(*(named[i.name] for i in fam.inputs if i.weight))
        out[call.role] = Bound(_first(fn) if len(fam.outputs) > 1 else fn, residual)
    return out


def package_step(bound: Sequence[dict[str, Bound]], hidden: int, launches: int = 4,
                 after_layer: Callable[[Any], Any] | None = None) -> Callable[[Any], list[Any]]:
    """The layer as four package calls (norm + Q/K/V, O + residual, norm + gate/up SwiGLU, down + residual) or as
    two (norm + Q/K/V, and ``mlp_block``: O, norm, gate/up, down and both residuals in one persistent kernel).
    ``after_layer`` (four launches): called with each layer's output (a probe's ``mx.async_eval``)."""

    def step4(x: Any) -> list[Any]:
        kept: list[Any] = []
        for b in bound:
            qkv = b["qkv"].fn(x)
            x = b["o"].fn(qkv[:, :hidden], x)
            x = b["down"].fn(b["gate_up"].fn(x), x)
            kept.append(qkv[:, hidden:])
            if after_layer is not None:
                after_layer(x)
        return [x, *kept]

    def step2(x: Any) -> list[Any]:
        kept: list[Any] = []
        for b in bound:
            qkv = b["qkv"].fn(x)
            x = b["mlp"].fn(qkv[:, :hidden], x)
            kept.append(qkv[:, hidden:])
        return [x, *kept]

    return step4 if launches == 4 else step2

"""``kernsearch bench decode``: what a decoding MLX user gets, in ms per token.

A Llama-shaped step (``_step``) runs through plain MLX (separate and concatenated projections: the faster is the
reference) and through the exported package's fused families, interleaved round by round, one evaluation per token
(graph mode: the layers of a token are dependent calls, as a decode runs). Beside them, the same bytes read by a
streaming kernel in the same chain of launches: the limit a step can approach. Each fused kernel is also timed alone,
as a chain of dependent calls over every layer's weights (cold: the weights of 32 layers do not fit any cache),
against its op, the streaming read of its bytes and that read called as the package's call is
(:mod:`kernsearch.bench._call_stream`).

On MLX's CPU back-end the same code checks the package's output against plain MLX's; its timings are the CPU's,
never a GPU's (the report says so and carries no measured evidence).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .._rules import ratio_interval
from .._vocabulary import Evidence, Target
from ..evaluation._chain import fed_from
from ._step import EPS, Bound, Call, Layer, StepShape, call_inputs, qmm

#: The streaming read (CUDA): every 16-byte word of A once, XOR-folded so the loads are not dead; ``D`` (the previous
#: read's result) is an input only to order the reads as dependent launches.
STREAM_CUDA = """
    const size_t n = A_shape[0] / 4;
    const uint4* p = reinterpret_cast<const uint4*>(A);
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    uint4 a = make_uint4(0u, 0u, 0u, 0u);
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 v0 = __ldg(p + i), v1 = __ldg(p + i + stride);
        const uint4 v2 = __ldg(p + i + 2 * stride), v3 = __ldg(p + i + 3 * stride);
        a.x ^= v0.x ^ v1.x ^ v2.x ^ v3.x; a.y ^= v0.y ^ v1.y ^ v2.y ^ v3.y;
        a.z ^= v0.z ^ v1.z ^ v2.z ^ v3.z; a.w ^= v0.w ^ v1.w ^ v2.w ^ v3.w;
    }
    for (; i < n; i += stride) { const uint4 v = __ldg(p + i); a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w; }
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x9E3779B9u) Y[0] = a.x + D[0];
"""

STREAM_METAL = """
    const uint n = A_shape[0] / 4;
    const device uint4* p = reinterpret_cast<const device uint4*>(A);
    uint4 a = uint4(0u);
    for (uint i = thread_position_in_grid.x; i < n; i += threads_per_grid.x) { a ^= p[i]; }
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x9E3779B9u) { Y[0] = a.x + D[0]; }
"""


def device_kind(mx: Any) -> str | None:
    """The GPU target MLX runs on here (``cuda`` or ``metal``); None without a GPU (MLX's CPU back-end)."""
    for target in (Target.CUDA, Target.METAL):
        module = getattr(mx, target.value, None)
        if module is not None and module.is_available():
            return str(target.value)
    return None


def stream_grid(mx: Any) -> tuple[int, int, int]:
    """The streaming reads' grid (threads, in threadgroups of 512): four threadgroups an SM (132 where the device
    does not say how many it has)."""
    cores = int(mx.device_info().get("multi_processor_count", 0) or 0) or 132
    return (cores * 4 * 512, 1, 1)


def stream_reader(mx: Any, kind: str | None) -> Callable[[Any, Any], Any] | None:
    """``read(A, D)``: one launch reading all of A; None on the CPU (a CPU has no streaming yardstick here)."""
    if kind is None:
        return None
    cuda = kind == Target.CUDA
    make = mx.fast.cuda_kernel if cuda else mx.fast.metal_kernel
    kernel = make(name="ks_bench_stream", input_names=["A", "D"], output_names=["Y"],
                  source=STREAM_CUDA if cuda else STREAM_METAL)
    grid = stream_grid(mx)

    def read(a: Any, d: Any) -> Any:
        return kernel(inputs=[a, d], template=[], grid=grid, threadgroup=(512, 1, 1), output_shapes=[(1,)],
                      output_dtypes=[mx.uint32])[0]

    return read


def interleaved(mx: Any, forms: dict[str, Callable[[], Any]], rounds: int, warmup: int = 2) -> dict[str, list[float]]:
    """ms per evaluation of each form's graph (built and evaluated, as a consumer's token is), in turn each round,
    the order reversed every other round so that neither form always follows the other."""
    for fn in forms.values():
        for _ in range(warmup):
            mx.eval(fn())
    names = list(forms)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            mx.synchronize()
            t0 = time.perf_counter()
            mx.eval(forms[name]())
            mx.synchronize()
            out[name].append((time.perf_counter() - t0) * 1e3)
    return out


#: How the consumer's loop evaluates tokens: ``sync``, one ``mx.eval`` per token (the host builds a token, then
#: waits for it); ``pipelined``, mlx-lm's generate loop (the next token's graph is built and sent with
#: ``mx.async_eval`` before the current one is waited on, so the host's work on token t+1 overlaps the GPU's on t).
LOOPS = ("sync", "pipelined")


def pipelined_ms(mx: Any, step: Callable[[Any], list[Any]], x0: Any, tokens: int) -> float:
    """ms per token of ``tokens`` dependent tokens (each token's input is the previous token's output) run as
    mlx-lm's decode loop runs them: the next token built and sent before the current one is waited on."""
    mx.synchronize()
    t0 = time.perf_counter()
    y = step(x0)
    mx.async_eval(y)
    for _ in range(tokens - 1):
        nxt = step(y[0])
        mx.async_eval(nxt)
        mx.eval(y)
        y = nxt
    mx.eval(y)
    mx.synchronize()
    return (time.perf_counter() - t0) * 1e3 / tokens


def pipelined(mx: Any, steps: dict[str, Callable[[Any], list[Any]]], x0: Any, rounds: int, tokens: int,
              warmup: int = 1) -> dict[str, list[float]]:
    """ms per token of each step in mlx-lm's loop (:func:`pipelined_ms`), the forms in turn each round, the order
    reversed every other round."""
    for step in steps.values():
        for _ in range(warmup):
            pipelined_ms(mx, step, x0, 2)
    names = list(steps)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            out[name].append(pipelined_ms(mx, steps[name], x0, tokens))
    return out


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


@dataclass(frozen=True)
class Paired:
    """One comparison: the reference's and the candidate's ms per evaluation, paired round by round; the speedup is
    the median of the per-round ratios with its 99 % distribution-free interval."""

    ref_ms: float
    new_ms: float
    speedup: float
    low: float
    high: float

    @classmethod
    def of(cls, ref: Sequence[float], new: Sequence[float]) -> Paired:
        """The median per-round ratio and its interval: the gate's own statistic (``_rules.ratio_interval``)."""
        iv = ratio_interval([a / b for a, b in zip(ref, new)])
        return cls(median(ref), median(new), iv.median, iv.low, iv.high)


#: The step's forms. Plain MLX as a user writes it, Q/K/V and gate/up separate or concatenated; the package with
#: two launches a layer (norm + Q/K/V, mlp_block) or four; each also with the whole step under ``mx.compile`` (a
#: consumer may compile its step: traced once, then replayed without Python). The reference is plain MLX's fastest.
PLAIN_FORMS = ("separate", "concatenated")
PACKAGE_FORMS = ("package, 2 launches", "package, 4 launches")
COMPILED = ", compiled"


@dataclass(frozen=True)
class StepRow:
    """One M in one consumer loop: plain MLX's fastest form against the package's fastest, paired round by round,
    and every form's ms per token."""

    hidden: int
    ffn: int
    layers: int
    M: int
    loop: str  # LOOPS: one eval per token, or mlx-lm's pipelined loop
    mlx_ms: float
    mlx_form: str
    package_ms: float
    package_form: str
    stream_ms: float | None
    speedup: float
    low: float
    high: float
    rel_err: float  # the package's output against plain MLX's (its worst form)
    forms_ms: dict[str, float]
    tokens_per_s_mlx: float
    tokens_per_s_package: float
    pct_of_stream: float | None
    pct_of_spec: float | None
    rounds: int


@dataclass(frozen=True)
class KernelRow:
    """One fused kernel alone, a chain of dependent calls over every layer's weights: per call."""

    family: str
    role: str
    shape: str
    M: int
    us: float
    op_us: float
    speedup: float
    low: float
    high: float
    stream_us: float | None
    pct_of_stream: float | None
    chose: str
    #: The same chains under ``mx.compile`` (traced once, replayed: the host's graph building mostly gone, MLX's
    #: encoding of each launch left), as docs/decode.md tells a consumer to run a step: how much of the plain
    #: chain's gap to the streaming read is the host's.
    us_compiled: float | None = None
    stream_us_compiled: float | None = None
    pct_of_stream_compiled: float | None = None
    #: The streaming read called and chained as the package's call is (:mod:`kernsearch.bench._call_stream`): what a
    #: kernel exactly as fast as the streaming read would take as the package calls it; the kernel against it.
    call_stream_us: float | None = None
    pct_of_call_stream: float | None = None
    call_stream_us_compiled: float | None = None
    pct_of_call_stream_compiled: float | None = None
    #: The lower bound of the chain figure the artifact that ran was published on (its gate's paired rounds, graph
    #: mode); None where the op or the default config ran. The row's ``speedup`` at or above it: the judge and the
    #: consumer agree (issue 38).
    gate_low: float | None = None


@dataclass(frozen=True)
class DecodeReport:
    chip: str
    device: str
    evidence: str | None  # measured on a GPU; None on the CPU (timings of the CPU, correctness only)
    mlx: str
    shape: StepShape
    bytes_per_token: int
    spec_gbs: float | None
    rows: list[StepRow] = field(default_factory=list)
    kernels: list[KernelRow] = field(default_factory=list)
    explain: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def stream_gbs(self) -> float | None:
        """The bandwidth of the streaming read measured in this run (the first M's step), GB/s."""
        ms = self.rows[0].stream_ms if self.rows else None
        return self.bytes_per_token / (ms * 1e6) if ms else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "stream_gbs": self.stream_gbs}


def rel_err(mx: Any, got: Any, want: Any) -> float:
    g, w = got.astype(mx.float32), want.astype(mx.float32)
    scale = max(float(mx.max(mx.abs(w)).item()), 1e-30)
    return float(mx.max(mx.abs(g - w)).item()) / scale


def derive(mx: Any, y: Any, k: int) -> Any:
    """The kernel rows' link until the thirteenth session (the GPU probes in ``benchmarks/`` that made the earlier
    data chain with it; the rows now derive as the gate does, :func:`~kernsearch.evaluation._chain.fed_from`: an
    output shorter than X is followed by the rest of X, one copy, where this repeats it).
    The next call's activation [M, K] from this call's output [M, N], by the cheapest op that keeps the chain
    dependent: the output itself where it has the activation's shape (no op, as the gate's link, and as a decode
    feeds its residual stream; three view primitives there cost both sides 3-5 us a call in MLX and read O at M = 1
    on the H200 1.10x against 1.23x without them, one process: benchmarks/gpu_link_ab.py), else its first M·K values
    as a view (no copy, no launch) where it holds enough, else the output repeated (a copy); the op and the package
    pay the same."""
    m, n = y.shape
    if n == k:
        return y
    if n > k:
        return y.reshape(-1)[: m * k].reshape(m, k)
    return mx.concatenate([y] * math.ceil(k / n), axis=1)[:, :k]


#: ``(call, M) -> (input names, parameter arrays, read)``: the streaming read called as the call is
#: (:mod:`kernsearch.bench._call_stream`), made per call where the device runs custom kernels.
CallStreams = Callable[[Call, int], tuple[tuple[str, ...], dict[str, Any], Callable[[Sequence[Any]], Any]]]


class KernelChains:
    """Each fused call of the layer alone: the op (what a user writes), the package's bound call, the streaming
    read of its bytes and, where ``call_streams`` is given, the streaming read called and chained as the package's
    call is (its inputs, its output's shape, the same link), each a chain of dependent calls over the layers'
    weights."""

    def __init__(self, mx: Any, shape: StepShape, layers: Sequence[Layer], bound: Sequence[dict[str, Bound]],
                 flats: Sequence[dict[str, Any]] | None, read: Callable[[Any, Any], Any] | None,
                 call_streams: CallStreams | None = None) -> None:
        self.mx, self.shape, self.layers, self.bound, self.flats, self.read = mx, shape, layers, bound, flats, read
        self.call_streams = call_streams
        self.mm = qmm(mx, shape)

    def op(self, call: Call, lay: Layer, x: Any, r: Any) -> Any:
        mx, mm = self.mx, self.mm
        if call.role == "qkv":
            return mm(mx.fast.rms_norm(x, lay.n1, EPS), lay.qkv)
        if call.role == "gate_up":
            return self._swiglu(lay, mx.fast.rms_norm(x, lay.n2, EPS))
        if call.role == "mlp":
            x1 = r + mm(x, lay.o)
            return x1 + mm(self._swiglu(lay, mx.fast.rms_norm(x1, lay.n2, EPS)), lay.down)
        return r + mm(x, lay.o if call.role == "o" else lay.down)

    def _swiglu(self, lay: Layer, n: Any) -> Any:
        g = self.mm(n, lay.gate)
        return g * self.mx.sigmoid(g) * self.mm(n, lay.up)

    def forms(self, call: Call, m: int) -> dict[str, Callable[[], Any]]:
        mx = self.mx
        dt = getattr(mx, self.shape.dtype)
        x0 = (0.5 * mx.random.normal((m, call.k), key=mx.random.key(m))).astype(dt)
        r0 = (0.5 * mx.random.normal((m, call.n), key=mx.random.key(m + 1))).astype(dt)
        mx.eval(x0, r0)

        # Chained as a decode runs: R is the residual stream (the previous output) and X, in a decode the attention's
        # or the MLP's output, derives from it too, so no call's projection can start before the previous call ends
        # (with X fixed the op's X·Wᵀ would run ahead of the chain, a freedom a decode never has).
        residual = call.role in ("o", "down", "mlp")

        def link(y: Any, r: Any) -> tuple[Any, Any]:  # the gate's derivation (the judge and this row agree)
            return fed_from(mx, y, x0), (y if residual else r)

        def op() -> Any:
            x, r = x0, r0
            for lay in self.layers:
                x, r = link(self.op(call, lay, x, r), r)
            return x

        def package() -> Any:
            x, r = x0, r0
            for b in self.bound:
                x, r = link(b[call.role](X=x, R=r), r)
            return x

        forms = {"op": op, "package": package}
        if self.call_streams is not None:
            names, params, stream_call = self.call_streams(call, m)
            named = [{**call_inputs(lay, call.role), **params} for lay in self.layers]

            def call_stream() -> Any:
                x, r = x0, r0
                for arrays in named:
                    fed = {**arrays, "X": x, "R": r}
                    x, r = link(stream_call([fed[n] for n in names]), r)
                return x

            forms["call_stream"] = call_stream
            forms["call_stream" + COMPILED] = mx.compile(call_stream)
        if self.read is not None and self.flats is not None:
            read, flats = self.read, self.flats
            d0 = mx.zeros((1,), dtype=mx.uint32)

            def stream() -> Any:
                d = d0
                for f in flats:
                    d = read(f[call.role], d)
                return d

            forms["stream"] = stream
            forms["stream" + COMPILED] = mx.compile(stream)
            forms["package" + COMPILED] = mx.compile(package)
        return forms


def pct(part: float | None, whole: float) -> float | None:
    return None if part is None or whole <= 0 else 100.0 * part / whole


def fastest(t: dict[str, list[float]], forms: Sequence[str]) -> str:
    """The form (of ``forms``, compiled or not) with the lowest median ms per token."""
    return min((f for f in t if f.removesuffix(COMPILED) in forms), key=lambda f: median(t[f]))


def token_row(shape: StepShape, m: int, loop: str, t: dict[str, list[float]], rel: float,
              spec_gbs: float | None, stream: float | None) -> StepRow:
    """The row of one M and loop from the interleaved ms per token of each form: plain MLX's fastest form against
    the package's fastest (``rel``: the package's worst output error against plain MLX; ``stream``: the streaming
    read's ms in this run)."""
    ref, new = fastest(t, PLAIN_FORMS), fastest(t, PACKAGE_FORMS)
    p = Paired.of(t[ref], t[new])
    ideal = shape.layers * shape.layer_bytes() / (spec_gbs * 1e6) if spec_gbs else None
    forms = {f: median(v) for f, v in t.items() if f != "stream"}
    return StepRow(shape.hidden, shape.ffn, shape.layers, m, loop, p.ref_ms, ref, p.new_ms, new, stream, p.speedup,
                   p.low, p.high, rel, forms, 1e3 / p.ref_ms, 1e3 / p.new_ms, pct(stream, p.new_ms),
                   pct(ideal, p.new_ms), len(t[new]))


def kernel_row(call: Call, shape: StepShape, m: int, t: dict[str, list[float]], layers: int, chose: str) -> KernelRow:
    p = Paired.of(t["op"], t["package"])
    dims = shape.dims(m, call)
    stream = median(t["stream"]) * 1e3 / layers if "stream" in t else None
    us = p.new_ms * 1e3 / layers
    per = {f: median(t[f]) * 1e3 / layers if f in t else None
           for f in ("call_stream", *(g + COMPILED for g in ("package", "stream", "call_stream")))}
    cu, cs, cc = per["package" + COMPILED], per["stream" + COMPILED], per["call_stream" + COMPILED]
    return KernelRow(call.family, call.role, ",".join(str(v) for v in dims.values()), m, us, p.ref_ms * 1e3 / layers,
                     p.speedup, p.low, p.high, stream, pct(stream, us), chose, cu, cs,
                     pct(cs, cu) if cu is not None else None, per["call_stream"], pct(per["call_stream"], us), cc,
                     pct(cc, cu) if cu is not None else None)


def evidence_for(kind: str | None) -> str | None:
    return Evidence.MEASURED.value if kind is not None else None

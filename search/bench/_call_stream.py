"""The streaming read called as a fused call is called: the second yardstick of ``bench decode``'s kernel rows.

A fused call in a chain pays, before its work, what its launch costs: its inputs (the layer's own weight arrays,
distinct memory in every layer) and the link that derives the next call's X from its output. The plain streaming
read (:func:`kernsearch.bench._decode.stream_reader`: one flat array, a one-value output, no link) pays less: on an
H200 a fused call's launch with an empty body cost 15-29 µs a call in a 32-call chain, the plain read's 11-20
(``benchmarks/gpu_results.md``, eleventh session). So a row's ``pct_of_stream`` mixes the kernel's speed with the
call's cost. This kernel takes the call's own inputs in the family's order, reads every byte of its weight inputs
once (16-byte words, XOR-folded so that the loads are not dead), writes an output of the call's shape from X, and
is chained by the same link as the package's call: the time a kernel exactly as fast as the streaming read would
take as the package calls it (``pct_of_call_stream``).

The source is generated here from the family's input names (checked to be plain identifiers: a family folder may be
hostile, and no text from it reaches generated code unchecked) and the arrays' byte counts (literals).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import KernsearchError
from .._vocabulary import Target
from ..family._spec import Family
from ._decode import CallStreams, stream_grid
from ._step import Call, Layer, call_inputs

#: 16-byte words of one weight input read once by the grid, four in flight a thread, then its tail bytes.
_READ_CUDA = """    {{
        const uint4* p = reinterpret_cast<const uint4*>({name});
        size_t i = tid;
        for (; i + 3 * stride < {words}u; i += 4 * stride) {{
            const uint4 v0 = __ldg(p + i), v1 = __ldg(p + i + stride);
            const uint4 v2 = __ldg(p + i + 2 * stride), v3 = __ldg(p + i + 3 * stride);
            a.x ^= v0.x ^ v1.x ^ v2.x ^ v3.x; a.y ^= v0.y ^ v1.y ^ v2.y ^ v3.y;
            a.z ^= v0.z ^ v1.z ^ v2.z ^ v3.z; a.w ^= v0.w ^ v1.w ^ v2.w ^ v3.w;
        }}
        for (; i < {words}u; i += stride) {{
            const uint4 v = __ldg(p + i); a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w;
        }}
        const unsigned char* b = reinterpret_cast<const unsigned char*>({name});
        for (size_t j = {words}u * 16u + tid; j < {nbytes}u; j += stride) a.x ^= b[j];
    }}
"""
_HEAD_CUDA = """    const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    uint4 a = make_uint4(0u, 0u, 0u, 0u);
"""
_TAIL_CUDA = """    for (size_t i = tid; i < {out_size}u; i += stride) {out}[i] = X[i % {x_size}u];
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x9E3779B9u && tid == 0) {out}[0] = X[{x_size}u - 1u];
"""
_READ_METAL = """    {{
        const device uint4* p = reinterpret_cast<const device uint4*>({name});
        for (uint i = tid; i < {words}u; i += stride) {{ a ^= p[i]; }}
        const device uchar* b = reinterpret_cast<const device uchar*>({name});
        for (uint j = {words}u * 16u + tid; j < {nbytes}u; j += stride) {{ a.x ^= uint(b[j]); }}
    }}
"""
_HEAD_METAL = """    const uint tid = thread_position_in_grid.x, stride = threads_per_grid.x;
    uint4 a = uint4(0u);
"""
_TAIL_METAL = """    for (uint i = tid; i < {out_size}u; i += stride) {{ {out}[i] = X[i % {x_size}u]; }}
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x9E3779B9u && tid == 0u) {{ {out}[0] = X[{x_size}u - 1u]; }}
"""


@dataclass(frozen=True)
class CallShape:
    """What the yardstick needs of one call: its inputs' names in the family's order, which are weights and their
    byte counts, X's element count, and the output's name and shape."""

    names: tuple[str, ...]
    weight_bytes: dict[str, int]
    x_size: int
    out: str
    out_shape: tuple[int, ...]


def call_stream_source(kind: str, call: CallShape) -> str:
    """The kernel body (CUDA for ``cuda``, else Metal) of the streaming read called as ``call`` is."""
    for name in (*call.names, call.out):
        if not name.isidentifier() or not name.isascii():
            raise KernsearchError(f"bench decode: input name {name[:40]!r} is not a plain identifier")
    if "X" not in call.names or call.x_size <= 0:
        raise KernsearchError("bench decode: a call's streaming read needs its input X")
    cuda = kind == Target.CUDA
    read, head, tail = (_READ_CUDA, _HEAD_CUDA, _TAIL_CUDA) if cuda else (_READ_METAL, _HEAD_METAL, _TAIL_METAL)
    body = [head]
    for name in call.names:
        if name in call.weight_bytes:
            nbytes = int(call.weight_bytes[name])
            body.append(read.format(name=name, words=nbytes // 16, nbytes=nbytes))
    size = 1
    for d in call.out_shape:
        size *= int(d)
    body.append(tail.format(out=call.out, out_size=size, x_size=int(call.x_size)))
    return "".join(body)


def call_stream_reader(mx: Any, kind: str, call: CallShape) -> Callable[[Sequence[Any]], Any]:
    """``read(arrays)``: one launch of the call's streaming read on ``arrays`` (in ``call.names``' order), on the
    plain streaming read's grid; its output has the call's shape and X's dtype."""
    cuda = kind == Target.CUDA
    make = mx.fast.cuda_kernel if cuda else mx.fast.metal_kernel
    source = call_stream_source(kind, call)
    name = "ks_bench_call_stream_" + "_".join(call.names) + "_" + "x".join(str(d) for d in call.out_shape)
    kernel = make(name=name, input_names=list(call.names), output_names=[call.out], source=source)
    grid = stream_grid(mx)
    x_at = call.names.index("X")

    def read(arrays: Sequence[Any]) -> Any:
        return kernel(inputs=list(arrays), template=[], grid=grid, threadgroup=(512, 1, 1),
                      output_shapes=[call.out_shape], output_dtypes=[arrays[x_at].dtype])[0]

    return read


def call_streams(mx: Any, kind: str, families: Mapping[str, Family], layer: Layer) -> CallStreams:
    """``(call, M) -> (names, parameter arrays, read)`` for :class:`kernsearch.bench._decode.KernelChains`: the
    call's family's kernel inputs (tensor inputs, then parameters, as the package passes them), its weights' byte
    counts from ``layer`` (every layer's arrays have the same shapes) and a reader per call and M, made once."""
    made: dict[tuple[str, int], tuple[tuple[str, ...], dict[str, Any], Callable[[Sequence[Any]], Any]]] = {}

    def make(call: Call, m: int) -> tuple[tuple[str, ...], dict[str, Any], Callable[[Sequence[Any]], Any]]:
        key = (call.role, m)
        if key not in made:
            fam = families[call.family]
            named = call_inputs(layer, call.role)
            params = {name: mx.array([p.number], dtype=getattr(mx, p.dtype)) for name, p in fam.params.items()}
            shape = CallShape(tuple(fam.kernel_input_names),
                              {t.name: int(named[t.name].nbytes) for t in fam.inputs if t.weight},
                              m * call.k, fam.outputs[0].name, (m, call.n))
            made[key] = (shape.names, params, call_stream_reader(mx, kind, shape))
        return made[key]

    return make

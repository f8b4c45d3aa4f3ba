"""Issue 35: where a chain of dependent calls spends its time on the GPU's timeline. Nsight Compute times the
streaming read of a Q/K/V projection's bytes at ~9.7 µs and the tuned norm + Q/K/V kernel at ~41 µs, yet in a chain
of 16 dependent calls (one eval) they cost 31.8 and 72 µs a call: this runs those chains (and the op's), each eval
inside an NVTX range, for Nsight Systems to show the kernels' start times, durations and the gaps between them::

    nsys profile -t cuda,nvtx -o $OUT/chain python3 benchmarks/gpu_chain_timeline.py
    nsys stats -r cuda_gpu_trace,nvtx_sum,cuda_api_sum -f csv -o $OUT/chain $OUT/chain.nsys-rep

Also prints, per form, the host time to build the chain's graph and the wall time of its eval.
"""

from __future__ import annotations

import sys
import time

import mlx.core as mx
from gpu_decode_probe import TUNED, build_call

from kernsearch import get_backend
from kernsearch.bench._decode import derive, stream_reader
from kernsearch.bench._step import StepShape, build_layers, call_inputs, qmm
from kernsearch.hardware._chips import detect_chip


def main() -> int:
    import cupy

    shape = StepShape(layers=16)
    chip, backend = detect_chip(), get_backend("cuda")
    layers = build_layers(mx, shape, 0, print)
    call = next(c for c in shape.all_calls() if c.role == "qkv")
    fn, names = build_call(mx, backend, call, shape, 1, TUNED["qkv"], chip, False)
    mm = qmm(mx, shape)
    read = stream_reader(mx, "cuda")
    flats = [mx.zeros((shape.matrix_bytes(call) // 4,), dtype=mx.uint32) + i for i in range(shape.layers)]
    x0 = (0.5 * mx.random.normal((1, call.k), key=mx.random.key(1))).astype(mx.float16)
    named = [call_inputs(lay, "qkv") for lay in layers]
    mx.eval(flats, x0)

    def kern() -> object:
        x = x0
        for i in range(shape.layers):
            x = derive(mx, fn(*[{**named[i], "X": x}[n] for n in names]), call.k)
        return x

    def op() -> object:
        x = x0
        for lay in layers:
            x = derive(mx, mm(mx.fast.rms_norm(x, lay.n1, 1e-5), lay.qkv), call.k)
        return x

    def stream() -> object:
        d = mx.zeros((1,), dtype=mx.uint32)
        for f in flats:
            d = read(f, d)
        return d

    forms = {"stream": stream, "kernel": kern, "op": op}
    for f in forms.values():
        for _ in range(3):
            mx.eval(f())
    mx.synchronize()
    for _ in range(6):
        for name, f in forms.items():
            mx.synchronize()
            cupy.cuda.nvtx.RangePush(f"{name}")
            t0 = time.perf_counter()
            g = f()
            t1 = time.perf_counter()
            mx.eval(g)
            mx.synchronize()
            t2 = time.perf_counter()
            cupy.cuda.nvtx.RangePop()
            print(f"{name}: build {1e6 * (t1 - t0) / shape.layers:.1f} us/call, eval+sync "
                  f"{1e6 * (t2 - t1) / shape.layers:.1f} us/call", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

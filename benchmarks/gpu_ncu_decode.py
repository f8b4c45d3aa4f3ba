"""Issue 35: what holds the decode kernels back, asked of Nsight Compute. Launches the streaming read and the tuned
fused kernels of ``gpu_decode_probe.py`` (a few times each, on two layers' weights) between
``cudaProfilerStart``/``Stop``, so that only they are profiled::

    ncu --profile-from-start off --csv --page details --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \\
        python3 benchmarks/gpu_ncu_decode.py > $OUT/ncu_decode.csv

(PYTHONPATH as for ``gpu_decode_probe.py``; needs CuPy for the profiler calls, which the GPU machine has.)
``NCU_M=4`` builds the calls for 4 rows of X (default 1).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import mlx.core as mx
from gpu_decode_probe import TUNED, build_call

from kernsearch import get_backend
from kernsearch.bench._decode import stream_reader
from kernsearch.bench._step import StepShape, build_layers, call_inputs
from kernsearch.hardware._chips import detect_chip


def main() -> int:
    import cupy  # the profiler's start and stop (MLX has no binding for them)

    shape = StepShape(layers=2)
    m = int(os.environ.get("NCU_M", "1"))
    chip, backend = detect_chip(), get_backend("cuda")
    layers = build_layers(mx, shape, 0, print)
    calls = {c.role: c for c in shape.all_calls()}
    # arguments: roles, each optionally with knob overrides: ``qkv mlp:PATH=h2,UNROLL=4,BPS=1``
    picked = sys.argv[1:] or ["qkv", "gate_up", "mlp"]
    variants = []
    for arg in picked:
        role, _, over = arg.partition(":")
        role, _, family = role.partition("@")   # qkv@qmatvec: the role's matrix through another family (no norm)
        cfg = {**TUNED[role], **{k: (v if k == "PATH" else int(v))
                                 for k, v in (kv.split("=") for kv in over.split(",") if kv)}}
        call = dataclasses.replace(calls[role], family=family) if family else calls[role]
        got = build_call(mx, backend, call, shape, m, cfg, chip, False)
        assert not isinstance(got, str), got
        variants.append((role, got))
    read = stream_reader(mx, "cuda")
    flat = mx.zeros((calls["qkv"].n * calls["qkv"].k // 8,), dtype=mx.uint32) + 1
    x = mx.ones((m, shape.hidden), dtype=mx.float16)
    r = mx.ones((m, shape.hidden), dtype=mx.float16)
    for role, (fn, names) in variants:  # compile and warm each outside the profiled range
        arrays = {**call_inputs(layers[0], role), "X": x if role != "down" else mx.ones((m, shape.ffn), mx.float16),
                  "R": r}
        mx.eval(fn(*[arrays[n] for n in names]))
    mx.eval(read(flat, mx.zeros((1,), dtype=mx.uint32)))
    mx.synchronize()
    cupy.cuda.runtime.profilerStart()
    for i in range(2):
        mx.eval(read(flat, mx.zeros((1,), dtype=mx.uint32)))
        for role, (fn, names) in variants:
            arrays = {**call_inputs(layers[i % 2], role), "R": r,
                      "X": x if role != "down" else mx.ones((m, shape.ffn), mx.float16)}
            mx.eval(fn(*[arrays[n] for n in names]))
            mx.synchronize()
    cupy.cuda.runtime.profilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

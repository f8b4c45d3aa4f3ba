"""Issue 35: what a custom-kernel call costs the host in MLX's CUDA back-end, and whether it grows with the kernel's
source text (MLX builds the full source on every call and hashes it on every eval). The same trivial kernel
(Y = X + 1 over 4096 values) with 0 to 64 KB of comment text appended, in a chain of 64 dependent calls: the host
time to build the chain's graph, and the wall time of its eval, per call. ``include`` rows hand MLX the same text as
``#include "<file>"`` (NVRTC reads the file; MLX builds and hashes one short line)::

    PYTHONPATH=/tmp/site:/tmp/site3 python3 benchmarks/gpu_host_cost.py > $OUT/host_cost.txt
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx

BODY = """
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < X_shape[0]) { Y[i] = X[i] + static_cast<T>(1.0f); }
"""


def per_call(pad: int, folder: Path | None = None, calls: int = 64, rounds: int = 30) -> tuple[float, float]:
    text = BODY + "".join(f"// {'x' * 76}\n" for _ in range(pad // 80))
    name = f"pad{pad}"
    if folder is not None:
        (folder / f"{name}.cuh").write_text(text)
        text, name = f'#include "{folder / name}.cuh"\n// X_shape\n', f"inc{pad}"
    kern = mx.fast.cuda_kernel(name=name, input_names=["X"], output_names=["Y"], source=text)
    x0 = mx.zeros((4096,), dtype=mx.float16)
    mx.eval(x0)
    builds, evals = [], []
    for r in range(rounds + 3):
        t0 = time.perf_counter()
        x = x0
        for _ in range(calls):
            x = kern(inputs=[x], template=[("T", mx.float16)], grid=(4096, 1, 1), threadgroup=(256, 1, 1),
                     output_shapes=[(4096,)], output_dtypes=[mx.float16])[0]
        t1 = time.perf_counter()
        mx.eval(x)
        mx.synchronize()
        t2 = time.perf_counter()
        if r >= 3:
            builds.append((t1 - t0) / calls * 1e6)
            evals.append((t2 - t1) / calls * 1e6)
    return statistics.median(builds), statistics.median(evals)


def main() -> int:
    print("form pad_bytes build_us_per_call eval_us_per_call")
    with tempfile.TemporaryDirectory() as tmp:
        for pad in (0, 4000, 8000, 16000, 32000, 64000):
            for form, folder in (("inline", None), ("include", Path(tmp))):
                b, e = per_call(pad, folder)
                print(f"{form} {pad} {b:.2f} {e:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What MLX's ``async_eval`` costs on the host per primitive of a graph (issue 43: a patched mlx-lm decode token is
host-bound, ~2.5 ms of its ~4 ms in ``mx.async_eval``). Each case builds a graph of ``N`` primitives of one kind
hanging off one array, then times, per graph: building it (Python), ``mx.async_eval`` (MLX encoding and sending) and
the wait for the GPU; median of ``--reps`` graphs after warm-up. Cases: views (reshape, slice), small elementwise
kernels, static and dynamic ``slice_update`` into a 2 MB cache buffer, RoPE with an int and an array offset, a
custom kernel of 1 and of 8 inputs, and ``mx.fast.scaled_dot_product_attention`` at one query row.

    python3 benchmarks/gpu_eval_costs.py --out $OUT [--n 64] [--reps 40]   (--dry: MLX's CPU back-end)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _cases(mx: Any, n: int, cuda: bool) -> dict[str, Callable[[], Any]]:
    x = mx.random.normal((1, 4096)).astype(mx.float16)
    heads = mx.random.normal((1, 64, 1, 128)).astype(mx.float16)
    buf = mx.zeros((1, 32, 256, 128), dtype=mx.float16)
    upd = mx.random.normal((1, 32, 1, 128)).astype(mx.float16)
    keys = mx.random.normal((1, 32, 200, 128)).astype(mx.float16)
    ws = [mx.random.normal((4096,)).astype(mx.float16) for _ in range(7)]
    mx.eval(x, heads, buf, upd, keys, *ws)
    offs = [mx.array([100 + i], dtype=mx.int32) for i in range(n)]
    mx.eval(*offs)
    src1 = "uint i = thread_position_in_grid.x; out[i] = a[i];" if not cuda else \
        "int i = blockIdx.x * blockDim.x + threadIdx.x; out[i] = a[i];"
    make = mx.fast.cuda_kernel if cuda else mx.fast.metal_kernel
    k1 = make(name="ks_probe1", input_names=["a"], output_names=["out"], source=src1) if cuda else None
    k8 = make(name="ks_probe8", input_names=["a", "b", "c", "d", "e", "f", "g", "h"], output_names=["out"],
              source=src1) if cuda else None

    def views() -> Any:
        y = x
        for _i in range(n // 2):
            y = y.reshape(1, 1, 4096)[:, 0]
        return y + 1

    def adds() -> Any:
        y = x
        for _ in range(n):
            y = y + 1
        return y

    def static_updates() -> Any:
        b = mx.array(buf)  # a new array object (its own descriptor) sharing buf's data: assigned into n times
        for i in range(n):
            b[..., 100 + i:101 + i, :] = upd
        return b

    def dynamic_updates() -> Any:
        b = buf
        for i in range(n):
            b = mx.slice_update(b, upd, offs[i], (2,))
        return b

    def rope_int() -> Any:
        y = heads
        for i in range(n):
            y = mx.fast.rope(y, 128, traditional=False, base=10000.0, scale=1.0, offset=100 + i)
        return y

    def rope_array() -> Any:
        y = heads
        for i in range(n):
            y = mx.fast.rope(y, 128, traditional=False, base=10000.0, scale=1.0, offset=offs[i])
        return y

    def sdpa() -> Any:
        q = heads[:, :32]
        for _ in range(n):
            q = mx.fast.scaled_dot_product_attention(q, keys, keys, scale=0.088)
        return q

    cases = {"views": views, "adds": adds, "static slice_update": static_updates,
             "dynamic slice_update": dynamic_updates, "rope int offset": rope_int, "rope array offset": rope_array,
             "sdpa one row": sdpa}
    if cuda:
        def custom(kernel: Any, extra: list[Any]) -> Callable[[], Any]:
            def run() -> Any:
                y = x
                for _ in range(n):
                    y = kernel(inputs=[y, *extra], grid=(4096, 1, 1), threadgroup=(256, 1, 1),
                               output_shapes=[y.shape], output_dtypes=[y.dtype])[0]
                return y
            return run
        cases["custom kernel 1 input"] = custom(k1, [])
        cases["custom kernel 8 inputs"] = custom(k8, ws)
    return cases


def _time(mx: Any, build: Callable[[], Any], reps: int) -> dict[str, float]:
    rows: dict[str, list[float]] = {"build_us": [], "async_eval_us": [], "wait_us": []}
    for r in range(reps + 3):
        t0 = time.perf_counter()
        y = build()
        t1 = time.perf_counter()
        mx.async_eval(y)
        t2 = time.perf_counter()
        mx.eval(y)
        t3 = time.perf_counter()
        if r >= 3:
            rows["build_us"].append(1e6 * (t1 - t0))
            rows["async_eval_us"].append(1e6 * (t2 - t1))
            rows["wait_us"].append(1e6 * (t3 - t2))
    return {k: statistics.median(v) for k, v in rows.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--dry", action="store_true")
    a = ap.parse_args(argv)
    import mlx.core as mx

    cuda = not a.dry and mx.cuda.is_available()
    results = {}
    for name, build in _cases(mx, a.n, cuda).items():
        t = _time(mx, build, a.reps)
        results[name] = {**t, **{k.replace("_us", "_us_each"): v / a.n for k, v in t.items()}}
        print(f"{name:24s} per primitive: build {t['build_us'] / a.n:6.2f} us, async_eval "
              f"{t['async_eval_us'] / a.n:6.2f} us, wait {t['wait_us'] / a.n:6.2f} us  (n = {a.n})", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "gpu_eval_costs.json").write_text(json.dumps({"n": a.n, "reps": a.reps, "cuda": cuda,
                                                          "cases": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 35 on the GPU: what MLX's CUDA back-end charges the host for a custom kernel's inputs. The fused decode
calls take 5 to 14 arrays (X, R, gamma, then W, S and Bq per matrix) and cost ~2x the streaming-read kernel's host
time in a chain; if the cost grows with the inputs, packing a call's weights into fewer arrays (S and Bq
interleaved, gate and up in one matrix) is a design to try. Here a trivial kernel (one thread adds the first
element of each input) with 1 to 12 inputs, in a chain of 128 dependent calls (each call's first input the last
call's output), timed as µs per call building the graph, sending it (``mx.async_eval``) and waiting; the same with
``init_value`` (MLX fills the output first: one more launch); and ``mx.add`` of two arrays as the op's yardstick::

    PYTHONPATH=/tmp/site:/tmp/site3 python3 benchmarks/gpu_inputs_cost.py --out $OUT

Writes ``$OUT/gpu_inputs_cost.json``. Needs MLX's CUDA back-end (``--dry-run``: the op only, on the CPU).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_call_cost import split as chain_split  # (benchmarks/ is the script's folder: on sys.path)


def split(mx: Any, fn: Callable[[Any], Any], r0: Any, calls: int, rounds: int) -> dict[str, float]:
    """Median µs per call of a chain of ``calls`` dependent calls: building, sending, waiting (gpu_call_cost's)."""
    return {k: round(v, 2) for k, v in chain_split(mx, lambda _x, r: fn(r), None, r0, calls, rounds).items()}


def kernel_chain(mx: Any, n: int, init: bool, big: bool) -> tuple[Callable[[Any], Any], Any]:
    names = [f"A{i}" for i in range(n)]
    body = " + ".join(f"static_cast<float>({a}[0])" for a in names)
    kernel = mx.fast.cuda_kernel(name=f"ks_inputs_{n}", input_names=names, output_names=["Y"],
                                 source=f"if (threadIdx.x == 0 && blockIdx.x == 0) Y[0] = {body};")
    size = (1 << 24) if big else 16
    rest = [mx.ones((size,), dtype=mx.float16) for _ in range(n - 1)]
    mx.eval(rest)
    extra = {"init_value": 0.0} if init else {}

    def call(r: Any) -> Any:
        return kernel(inputs=[r, *rest], template=[], grid=(32, 1, 1), threadgroup=(32, 1, 1),
                      output_shapes=[(16,)], output_dtypes=[mx.float32], **extra)[0]

    return call, mx.zeros((16,), dtype=mx.float32)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--calls", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    import mlx.core as mx

    a.out.mkdir(parents=True, exist_ok=True)
    one = mx.ones((16,), dtype=mx.float32)
    report: dict[str, Any] = {"mlx": mx.__version__, "calls": a.calls, "rows": {}}
    report["rows"]["op add"] = split(mx, lambda r: mx.add(r, one), mx.zeros((16,)), a.calls, a.rounds)
    print("op add", report["rows"]["op add"], flush=True)
    if not a.dry_run:
        report["device"] = mx.device_info().get("device_name")
        for n in (1, 2, 4, 6, 8, 12):
            for init, big in ((False, False), (True, False), (False, True)):
                if (init or big) and n not in (2, 8):
                    continue
                name = f"kernel {n} inputs" + (", init_value" if init else "") + (", 32 MB inputs" if big else "")
                fn, r0 = kernel_chain(mx, n, init, big)
                report["rows"][name] = split(mx, fn, r0, a.calls, a.rounds)
                print(name, report["rows"][name], flush=True)
    (a.out / "gpu_inputs_cost.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

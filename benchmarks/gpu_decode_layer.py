"""A Llama-shaped decode step through the exported package against plain MLX (issue 28), with the streaming read
of the same bytes as the limit.

One command on the GPU machine, from the repository root (MLX CUDA in /tmp/site, kernsearch in /tmp/site3)::

    PYTHONPATH=/tmp/site:/tmp/site3 python3 benchmarks/gpu_decode_layer.py --out $OUT

A layer: RMSNorm -> Q/K/V (one concatenated 4-bit matrix) -> O projection (attention left out on both sides: the
Q part stands in for its output) -> residual -> RMSNorm -> gate/up SwiGLU -> down projection -> residual; hidden
4096, FFN 11008 (``--ffn``), 4-bit, group 64, float16; 32 layers of distinct weights; M = 1 and 4. Plain MLX calls
``mx.fast.rms_norm``, ``mx.quantized_matmul`` and ``silu(g) * u``; the package calls ``rmsnorm``, ``qmatvec`` and
``swiglu_qmatvec`` bound to each layer's weights (``FAMILY.bind``), which run a tuned kernel where one was measured
to win at that shape and the op otherwise (``explain`` says which, in the output). Graph mode: the 32 layers of one
token are built, then evaluated once; per token: median over rounds, interleaved. The output of the package's layers
is checked against plain MLX's. The streaming read: a read-only kernel over copies of the same weight bytes, 32 calls
per token. Also each qmatvec shape alone (package vs ``mx.quantized_matmul`` vs the read of its bytes, cold weights).

Writes ``$OUT/gpu_decode_layer_<chip>.json`` = ``{"layer": [{"M", "mlx_ms_per_token", "package_ms_per_token",
"stream_ms_per_token"}, ...], "qmatvec": [{"M", "N", "K", "speedup", "low", "high", "pct_of_stream"}, ...]}``.
``--dry-run`` (no GPU): hidden 256, FFN 512, 2 layers, on MLX's CPU back-end, no streaming kernel: checks the script.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_consumer import export_all, pct  # noqa: E402
from gpu_package import import_installed, install  # noqa: E402

STREAM = """
    const size_t n = A_shape[0] / 4;
    const uint4* p = reinterpret_cast<const uint4*>(A);
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    uint4 a = make_uint4(0u, 0u, 0u, 0u);
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 v0 = __ldg(p + i), v1 = __ldg(p + i + stride), v2 = __ldg(p + i + 2 * stride), v3 = __ldg(p + i + 3 * stride);
        a.x ^= v0.x ^ v1.x ^ v2.x ^ v3.x; a.y ^= v0.y ^ v1.y ^ v2.y ^ v3.y;
        a.z ^= v0.z ^ v1.z ^ v2.z ^ v3.z; a.w ^= v0.w ^ v1.w ^ v2.w ^ v3.w;
    }
    for (; i < n; i += stride) { const uint4 v = __ldg(p + i); a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w; }
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x9E3779B9u) Y[0] = a.x;
"""


def log(*parts: Any) -> None:
    print(*parts, flush=True)


def quantized(mx: Any, n: int, k: int, rng: np.random.Generator) -> tuple[Any, Any, Any]:
    w = mx.array((rng.standard_normal((n, k)) * 0.02).astype(np.float16))
    q = mx.quantize(w, group_size=64, bits=4)
    mx.eval(q)
    return q


class Layer:
    """One layer's weights: norms, Q/K/V (concatenated), O, gate, up, down."""

    def __init__(self, mx: Any, hidden: int, ffn: int, rng: np.random.Generator) -> None:
        self.n1 = mx.array((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float16))
        self.n2 = mx.array((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float16))
        self.qkv = quantized(mx, 3 * hidden, hidden, rng)
        self.o = quantized(mx, hidden, hidden, rng)
        self.gate = quantized(mx, ffn, hidden, rng)
        self.up = quantized(mx, ffn, hidden, rng)
        self.down = quantized(mx, hidden, ffn, rng)
        self.hidden = hidden

    def nbytes(self) -> int:
        return sum(a.nbytes for q in (self.qkv, self.o, self.gate, self.up, self.down) for a in q) + 2 * self.n1.nbytes

    def plain(self, mx: Any, x: Any) -> Any:
        def qmm(h: Any, q: tuple[Any, Any, Any]) -> Any:
            return mx.quantized_matmul(h, *q, transpose=True, group_size=64, bits=4)

        h = mx.fast.rms_norm(x, self.n1, 1e-5)
        attn = qmm(h, self.qkv)[:, :self.hidden]  # attention left out: Q stands in for its output
        x = x + qmm(attn, self.o)
        h = mx.fast.rms_norm(x, self.n2, 1e-5)
        g = qmm(h, self.gate)
        return x + qmm(g * mx.sigmoid(g) * qmm(h, self.up), self.down)

    def bind(self, pkg: Any) -> None:
        self.p_qkv = pkg.qmatvec.bind(*self.qkv)
        self.p_o = pkg.qmatvec.bind(*self.o)
        self.p_gu = pkg.swiglu_qmatvec.bind(*self.gate, *self.up)
        self.p_down = pkg.qmatvec.bind(*self.down)

    def package(self, pkg: Any, x: Any) -> Any:
        h = pkg.rmsnorm(x, self.n1)
        x = x + self.p_o(self.p_qkv(h)[:, :self.hidden])
        return x + self.p_down(self.p_gu(pkg.rmsnorm(x, self.n2)))


def token_times(mx: Any, steps: dict[str, Any], rounds: int) -> dict[str, list[float]]:
    """ms per token of each ``step()`` (builds one token's graph), interleaved, one eval per token."""
    out: dict[str, list[float]] = {n: [] for n in steps}
    for f in steps.values():
        mx.eval(f())
    for r in range(rounds):
        for name in (list(steps) if r % 2 == 0 else list(reversed(list(steps)))):
            mx.synchronize()
            t0 = time.perf_counter()
            mx.eval(steps[name]())
            mx.synchronize()
            out[name].append((time.perf_counter() - t0) * 1e3)
    return out


def stream_reader(mx: Any) -> Any:
    kernel = mx.fast.cuda_kernel(name="ks_decode_stream", input_names=["A"], output_names=["Y"], source=STREAM)
    sms = int(mx.device_info().get("multi_processor_count", 132) or 132)
    return lambda a: kernel(inputs=[a], template=[], grid=(sms * 4 * 512, 1, 1), threadgroup=(512, 1, 1),
                            output_shapes=[(1,)], output_dtypes=[mx.uint32])[0]


def layer_rows(mx: Any, pkg: Any, layers: list[Layer], ms: list[int], rounds: int, dry: bool) -> list[dict]:
    rows = []
    read = None if dry else stream_reader(mx)
    flats = [] if dry else [mx.zeros((lay.nbytes() // 4,), dtype=mx.uint32) for lay in layers]
    mx.eval(flats)
    for m in ms:
        x0 = mx.array(np.random.default_rng(m).standard_normal((m, layers[0].hidden)).astype(np.float16))

        def run_plain(x: Any = x0) -> Any:
            for lay in layers:
                x = lay.plain(mx, x)
            return x

        def run_package(x: Any = x0) -> Any:
            for lay in layers:
                x = lay.package(pkg, x)
            return x

        want, got = run_plain(), run_package()
        err = float(mx.max(mx.abs(got.astype(mx.float32) - want.astype(mx.float32))).item())
        scale = float(mx.max(mx.abs(want.astype(mx.float32))).item())
        steps = {"mlx": run_plain, "package": run_package}
        if read is not None:
            steps["stream"] = lambda: [read(f) for f in flats]
        t = token_times(mx, steps, rounds)
        row = {"M": m, "mlx_ms_per_token": pct(t["mlx"], 50), "package_ms_per_token": pct(t["package"], 50),
               "stream_ms_per_token": pct(t["stream"], 50) if "stream" in t else None,
               "speedup": pct(t["mlx"], 50) / pct(t["package"], 50),
               "low": pct(t["mlx"], 10) / pct(t["package"], 90), "tokens_per_s_mlx": 1e3 / pct(t["mlx"], 50),
               "tokens_per_s_package": 1e3 / pct(t["package"], 50), "max_abs_err": err, "max_abs_out": scale,
               "choices": explain_layer(pkg, layers[0], m)}
        rows.append(row)
        log(f"layer x{len(layers)} M={m}: mlx {row['mlx_ms_per_token']:.3f} ms/token, package "
            f"{row['package_ms_per_token']:.3f}, stream {row['stream_ms_per_token'] or float('nan'):.3f}; "
            f"{row['speedup']:.2f}x (low {row['low']:.2f}); output error {err:.2e} of {scale:.2e}")
    return rows


def explain_layer(pkg: Any, lay: Layer, m: int) -> dict[str, str]:
    import mlx.core as mx

    h = mx.zeros((m, lay.hidden), dtype=mx.float16)
    ffn = lay.gate[0].shape[0]
    return {
        "qkv": str(pkg.qmatvec.explain(h, *lay.qkv).artifact or "op"),
        "o": str(pkg.qmatvec.explain(h, *lay.o).artifact or "op"),
        "gate_up": str(pkg.swiglu_qmatvec.explain(h, *lay.gate, *lay.up).artifact or "op"),
        "down": str(pkg.qmatvec.explain(mx.zeros((m, ffn), dtype=mx.float16), *lay.down).artifact or "op"),
        "rmsnorm": str(pkg.rmsnorm.explain(h, lay.n1).artifact or "op"),
    }


def qmatvec_rows(mx: Any, pkg: Any, shapes: list[tuple[int, int, int]], rounds: int, l2: float) -> list[dict]:
    read = stream_reader(mx)
    rng = np.random.default_rng(7)
    return [qmatvec_row(mx, pkg, read, shape, rounds, l2, rng) for shape in shapes]


def qmatvec_row(mx: Any, pkg: Any, read: Any, shape: tuple[int, int, int], rounds: int, l2: float,
                rng: np.random.Generator) -> dict:
    """One qmatvec shape: the package, the op and the read of the same bytes, 8 calls per graph, cold weights."""
    m, n, k = shape
    nbytes = n * k // 2 + 2 * n * (k // 64) * 2
    sets_n = max(2, math.ceil(2 * l2 / nbytes) + 1)
    ws = [quantized(mx, n, k, rng) for _ in range(sets_n)]
    x = mx.array(rng.standard_normal((m, k)).astype(np.float16))
    flats = [mx.zeros((nbytes // 4,), dtype=mx.uint32) + i for i in range(sets_n)]
    mx.eval(flats)

    def package() -> list[Any]:
        return [pkg.qmatvec(x, *ws[i % sets_n]) for i in range(8)]

    def op() -> list[Any]:
        return [mx.quantized_matmul(x, *ws[i % sets_n], transpose=True, group_size=64, bits=4) for i in range(8)]

    def stream() -> list[Any]:
        return [read(flats[i % sets_n]) for i in range(8)]

    t = token_times(mx, {"package": package, "op": op, "stream": stream}, rounds)
    pk, o, st = ([v / 8 for v in t[name]] for name in ("package", "op", "stream"))
    row = {"M": m, "N": n, "K": k, "package_ms": pct(pk, 50), "op_ms": pct(o, 50), "stream_ms": pct(st, 50),
           "speedup": pct(o, 50) / pct(pk, 50), "low": pct(o, 10) / pct(pk, 90), "high": pct(o, 90) / pct(pk, 10),
           "pct_of_stream": 100 * pct(st, 50) / pct(pk, 50), "weight_sets": sets_n,
           "chose": str(pkg.qmatvec.explain(x, *ws[0]).artifact or "op")}
    log(f"qmatvec {m}x{n}x{k}: package {row['package_ms'] * 1e3:.1f} us, op {row['op_ms'] * 1e3:.1f} us, read "
        f"{row['stream_ms'] * 1e3:.1f} us: {row['speedup']:.2f}x ({row['low']:.2f}-{row['high']:.2f}), "
        f"{row['pct_of_stream']:.0f} % of the read ({row['chose']})")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--store", type=Path, default=ROOT / "artifacts")
    ap.add_argument("--ffn", type=int, default=11008)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    import mlx.core as mx

    work = Path(tempfile.mkdtemp(prefix="decode_layer_"))
    install(export_all(a.store, work), work / "site")
    pkg = import_installed(work / "site")
    hidden, ffn, n_layers = (256, 512, 2) if a.dry_run else (4096, a.ffn, a.layers)
    rng = np.random.default_rng(0)
    layers = [Layer(mx, hidden, ffn, rng) for _ in range(n_layers)]
    for lay in layers:
        lay.bind(pkg)
    report: dict[str, Any] = {"hidden": hidden, "ffn": ffn, "layers": n_layers, "bits": 4, "group": 64,
                              "dtype": "float16", "mlx": mx.__version__}
    if a.dry_run:
        report["device"] = "cpu (dry run: no GPU figure)"
    else:
        from kernsearch.hardware._chips import detect_chip

        chip = detect_chip()
        report["device"], report["chip"] = mx.device_info().get("device_name"), chip.name
    report["layer"] = layer_rows(mx, pkg, layers, [1, 4], a.rounds, a.dry_run)
    if not a.dry_run:
        del layers
        shapes = [(1, 4096, 4096), (1, 11008, 4096), (1, 14336, 4096), (1, 12288, 4096), (1, 4096, 11008),
                  (4, 11008, 4096), (4, 14336, 4096), (16, 4096, 4096)]
        report["qmatvec"] = qmatvec_rows(mx, pkg, shapes, a.rounds, float(chip.system_cache_mb) * 2**20)
    name = f"gpu_decode_layer_{report.get('chip', 'dry').lower()}.json"
    (a.out / name).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

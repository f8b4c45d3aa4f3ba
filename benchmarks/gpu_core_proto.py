"""Issue 35: which quantized matrix-vector core can stream 4-bit weights near the memory's speed — a prototype.

Stand-alone (CuPy only, no MLX): the core's variants as raw CUDA kernels on MLX's layout (W [N, K/8] uint32 of
4-bit fields, low bits first; float16 scale S and bias B per group of G along K), M = 1, float16 X. Each is timed
by CUDA events over launches that cycle through enough copies of the weights that every launch reads them from DRAM
(cold, as in a decode step), beside a streaming read of the same bytes; each is checked against float64.

Variants (``--variants``): ``a<RT>u<U>b<BLOCK>[p<PER_SM>][s]`` — RT rows a warp share each X load, U 16-byte
chunks a lane in flight per row, BLOCK threads a threadgroup; p: a persistent grid of PER_SM blocks an SM (X
staged once per block), else one warp per RT rows; s: the products of a chunk summed in one half2 (else per word).

    python3 benchmarks/gpu_core_proto.py --out $OUT            # on the GPU machine
    python3 benchmarks/gpu_core_proto.py --dry                 # here: compiles each variant with nvcc (sm_90)
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SOURCE = r"""
#include <cuda_fp16.h>
#ifndef RT
#define RT 1
#endif
extern "C" __global__ void __launch_bounds__(BLOCK) core(const uint4* __restrict__ W, const __half* __restrict__ S,
        const __half* __restrict__ B, const __half* __restrict__ X, __half* __restrict__ Y, int N, int K, int G) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int CH = K / 32;                         // 16-byte chunks a row
    const int NG = K / G;
    uint4* xs = reinterpret_cast<uint4*>(smem);    // [4][CH]: word j of chunk c at j * CH + c, its 4 half2 pairs
    float* xsum = reinterpret_cast<float*>(smem + (size_t)K * 2);   // [CH]
    // Stage X: word w = 4 c + j holds values 8w..8w+7; pair p = (8w+p, 8w+p+4) (the fields a LOP3 makes a pair).
    for (int w = threadIdx.x; w < K / 8; w += BLOCK) {
        const uint4 v = *reinterpret_cast<const uint4*>(X + (size_t)w * 8);
        const __half* h = reinterpret_cast<const __half*>(&v);
        __half2 o[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) o[p] = __halves2half2(h[p], h[p + 4]);
        xs[(w % 4) * CH + w / 4] = *reinterpret_cast<const uint4*>(o);
    }
    __syncthreads();
    for (int c = threadIdx.x; c < CH; c += BLOCK) {
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint4 v = xs[j * CH + c];
            const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
            for (int p = 0; p < 4; ++p) { const float2 f = __half22float2(h[p]); s += f.x + f.y; }
        }
        xsum[c] = s;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ngr = (N + RT - 1) / RT;
    const int gsh = __ffs(G / 32) - 1;             // chunk -> group: c >> gsh
    const __half2 k1032 = __float2half2_rn(1032.0f), k16th = __float2half2_rn(0.0625f), km72 = __float2half2_rn(-72.0f);
    for (int g = blockIdx.x * (BLOCK / 32) + warp; g < ngr; g += gridDim.x * (BLOCK / 32)) {
        const int row0 = g * RT;
        float acc[RT];
#pragma unroll
        for (int r = 0; r < RT; ++r) acc[r] = 0.0f;
        for (int c0 = 0; c0 < CH; c0 += 32 * UNR) {
            uint4 wv[RT][UNR];
            float sc[RT][UNR], bi[RT][UNR];
#pragma unroll
            for (int u = 0; u < UNR; ++u) {
                const int c = c0 + u * 32 + lane;
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    const bool ok = c < CH && row0 + r < N;
                    const int row = ok ? row0 + r : 0, cc = ok ? c : 0;
                    wv[r][u] = __ldg(W + (size_t)row * CH + cc);
                    const int si = row * NG + (cc >> gsh);
                    sc[r][u] = __half2float(__ldg(S + si));
                    bi[r][u] = __half2float(__ldg(B + si));
                }
            }
#pragma unroll
            for (int u = 0; u < UNR; ++u) {
                const int c = c0 + u * 32 + lane;
                if (c < CH) {
                    __half2 hs[RT];
#pragma unroll
                    for (int r = 0; r < RT; ++r) hs[r] = __float2half2_rn(0.0f);
                    float fs[RT];
#pragma unroll
                    for (int r = 0; r < RT; ++r) fs[r] = 0.0f;
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const uint4 xv = xs[j * CH + c];
                        const __half2* xp = reinterpret_cast<const __half2*>(&xv);
#pragma unroll
                        for (int r = 0; r < RT; ++r) {
                            const unsigned int word = j == 0 ? wv[r][u].x : j == 1 ? wv[r][u].y : j == 2 ? wv[r][u].z : wv[r][u].w;
                            const unsigned int hi = word >> 8;
                            unsigned int q0 = (word & 0x000F000Fu) | 0x64006400u, q1 = (word & 0x00F000F0u) | 0x64006400u;
                            unsigned int q2 = (hi & 0x000F000Fu) | 0x64006400u, q3 = (hi & 0x00F000F0u) | 0x64006400u;
                            // signed fields q - 8, exact: no common-mode term in the half2 sums
                            const __half2 h0 = __hsub2(*reinterpret_cast<__half2*>(&q0), k1032);
                            const __half2 h1 = __hfma2(*reinterpret_cast<__half2*>(&q1), k16th, km72);
                            const __half2 h2 = __hsub2(*reinterpret_cast<__half2*>(&q2), k1032);
                            const __half2 h3 = __hfma2(*reinterpret_cast<__half2*>(&q3), k16th, km72);
#if SUMCHUNK
                            hs[r] = __hfma2(h0, xp[0], hs[r]);
                            hs[r] = __hfma2(h1, xp[1], hs[r]);
                            hs[r] = __hfma2(h2, xp[2], hs[r]);
                            hs[r] = __hfma2(h3, xp[3], hs[r]);
#else
                            __half2 t = __hmul2(h0, xp[0]);
                            t = __hfma2(h1, xp[1], t);
                            t = __hfma2(h2, xp[2], t);
                            t = __hfma2(h3, xp[3], t);
                            const float2 f = __half22float2(t);
                            fs[r] += f.x + f.y;
#endif
                        }
                    }
                    const float xsc = xsum[c];
#pragma unroll
                    for (int r = 0; r < RT; ++r) {
#if SUMCHUNK
                        const float2 f = __half22float2(hs[r]);
                        const float dot = f.x + f.y;
#else
                        const float dot = fs[r];
#endif
                        // w = s q + b = s (q - 8) + (b + 8 s)
                        acc[r] = fmaf(sc[r][u], dot, fmaf(fmaf(8.0f, sc[r][u], bi[r][u]), xsc, acc[r]));
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < RT; ++r) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
        }
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RT; ++r)
                if (row0 + r < N) Y[row0 + r] = __float2half_rn(acc[r]);
        }
    }
}

extern "C" __global__ void stream(const uint4* __restrict__ W, size_t n, unsigned int* out) {
    uint4 a = make_uint4(0u, 0u, 0u, 0u);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldg(W + i);
        a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w;
    }
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x9E3779B9u) out[0] = 1u;
}
"""

VARIANT = re.compile(r"^a(\d)u(\d)b(\d+)(?:p(\d))?(s)?$")
SHAPES = {"qkv": (12288, 4096), "down": (4096, 11008), "gate_up": (22016, 4096), "o": (4096, 4096)}


@dataclass(frozen=True)
class Variant:
    name: str
    rt: int
    u: int
    block: int
    per_sm: int  # 0: one warp per RT rows
    sumchunk: bool

    @staticmethod
    def parse(text: str) -> Variant:
        m = VARIANT.match(text)
        if not m:
            raise SystemExit(f"bad variant {text!r}")
        return Variant(text, int(m[1]), int(m[2]), int(m[3]), int(m[4] or 0), bool(m[5]))

    def defines(self) -> list[str]:
        return [f"-DRT={self.rt}", f"-DUNR={self.u}", f"-DBLOCK={self.block}", f"-DSUMCHUNK={int(self.sumchunk)}"]


def dry(variants: list[Variant]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "core.cu"
        src.write_text(SOURCE)
        for v in variants:
            cmd = ["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", *v.defines(), "-o", str(Path(tmp) / "c.cubin"),
                   str(src)]
            got = subprocess.run(cmd, capture_output=True, text=True, check=False)
            regs = re.findall(r"Function properties for (\w+)[\s\S]*?Used (\d+) registers", got.stderr)
            print(v.name, "ok" if got.returncode == 0 else got.stderr[-2000:], regs)
            if got.returncode:
                return 1
    return 0


def _time(cp: Any, launch: Any, copies: int, reps: int) -> float:
    """Median µs of one launch, each round ``copies`` launches (one per copy of the weights) between two events."""
    for i in range(copies):
        launch(i)
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        for i in range(copies):
            launch(i)
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) * 1000.0 / copies)
    return sorted(times)[len(times) // 2]


@dataclass
class Weights:
    """Copies of one shape's weights on the device (enough that every launch reads DRAM), X and the float64 Y."""

    n: int
    k: int
    g: int
    w: list[Any]
    s: list[Any]
    b: list[Any]
    flat: list[Any]
    x: Any
    ref: Any

    @staticmethod
    def make(cp: Any, np: Any, n: int, k: int, g: int = 64) -> Weights:
        rng = np.random.default_rng(0)
        wbytes = n * k // 2 + 2 * n * (k // g) * 2
        copies = max(2, int(np.ceil(400e6 / wbytes)))  # > 8x the 50 MB L2
        w_host = rng.integers(0, 2**32, size=(n, k // 8), dtype=np.uint64).astype(np.uint32)
        s_host = (rng.random((n, k // g)) * 0.02 + 0.001).astype(np.float16)
        b_host = (-(rng.random((n, k // g)) * 0.1)).astype(np.float16)
        x_host = rng.standard_normal(k).astype(np.float16)
        q = np.stack([(w_host >> (4 * i)) & 15 for i in range(8)], axis=-1).reshape(n, k).astype(np.float64)
        wf = q * np.repeat(s_host.astype(np.float64), g, axis=1) + np.repeat(b_host.astype(np.float64), g, axis=1)
        return Weights(n, k, g, [cp.asarray(w_host) for _ in range(copies)], [cp.asarray(s_host) for _ in range(copies)],
                       [cp.asarray(b_host) for _ in range(copies)], [cp.asarray(w_host).ravel() for _ in range(copies)],
                       cp.asarray(x_host), wf @ x_host.astype(np.float64))


def _variant_row(cp: Any, np: Any, v: Variant, wt: Weights, sms: int, reps: int) -> dict[str, Any]:
    fn = cp.RawModule(code=SOURCE, options=tuple(v.defines())).get_function("core")
    smem = wt.k * 2 + (wt.k // 32) * 4
    if smem > 48 * 1024:
        fn.max_dynamic_shared_size_bytes = smem
    wpb = v.block // 32
    ngr = (wt.n + v.rt - 1) // v.rt
    grid = min((ngr + wpb - 1) // wpb, sms * v.per_sm) if v.per_sm else (ngr + wpb - 1) // wpb
    y = cp.zeros(wt.n, dtype=cp.float16)

    def launch(i: int) -> None:
        fn((grid,), (v.block,), (wt.w[i], wt.s[i], wt.b[i], wt.x, y, np.int32(wt.n), np.int32(wt.k), np.int32(wt.g)),
           shared_mem=smem)

    launch(0)
    got = cp.asnumpy(y).astype(np.float64)
    err = float(np.max(np.abs(got - wt.ref) / (2e-3 * np.sqrt(wt.k) + 2e-3 * np.abs(wt.ref))))
    return {**asdict(v), "n": wt.n, "k": wt.k, "grid": grid, "us": _time(cp, launch, len(wt.w), reps),
            "err_over_tol": err, "ok": err <= 1.0}


def measure(variants: list[Variant], shapes: list[str], reps: int, out: Path) -> int:
    import cupy as cp
    import numpy as np

    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    sms = props["multiProcessorCount"]
    chip = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    print("device:", chip, "SMs", sms, flush=True)
    rows: list[dict[str, Any]] = []
    stream_k = cp.RawModule(code=SOURCE, options=("-DRT=1", "-DUNR=1", "-DBLOCK=128", "-DSUMCHUNK=0")).get_function(
        "stream")
    for sname in shapes:
        wt = Weights.make(cp, np, *SHAPES[sname])
        sink = cp.zeros(1, dtype=cp.uint32)
        words = np.uint64(wt.n * wt.k // 32)
        stream_us = _time(cp, lambda i, wt=wt, words=words, sink=sink: stream_k((sms * 4,), (512,), (wt.flat[i], words, sink)),
                          len(wt.w), reps)
        print(f"{sname} {wt.n}x{wt.k}: stream of W {stream_us:.1f} us ({wt.n * wt.k / 2 / stream_us / 1e6:.2f} TB/s), "
              f"{len(wt.w)} copies", flush=True)
        for v in variants:
            row = {**_variant_row(cp, np, v, wt, sms, reps), "shape": sname, "stream_us": stream_us, "chip": chip}
            row["pct_of_stream"] = 100.0 * stream_us / row["us"]
            rows.append(row)
            print(f"  {v.name:14s} grid {row['grid']:5d}: {row['us']:7.1f} us  ({row['pct_of_stream']:5.1f} % of "
                  f"stream)  err/tol {row['err_over_tol']:.3f}", flush=True)
        wt.w = wt.s = wt.b = wt.flat = []
        cp.get_default_memory_pool().free_all_blocks()
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_core_proto.json").write_text(json.dumps({"chip": chip, "rows": rows}, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--shapes", default="qkv,down")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--variants", default="a1u4b128,a1u4b128s,a2u2b128s,a2u4b128s,a1u4b256p4s,a2u2b256p4s,"
                                          "a1u8b128s,a4u2b128s,a2u4b256p2s")
    args = ap.parse_args()
    variants = [Variant.parse(t) for t in args.variants.split(",")]
    if args.dry:
        return dry(variants)
    return measure(variants, args.shapes.split(","), args.reps, args.out)


if __name__ == "__main__":
    sys.exit(main())

"""Issue 35: does a quantized matrix-vector core whose weight loads wait in shared memory, not in registers, stream
4-bit weights near the memory's speed? A prototype beside the h2 core's (``gpu_core_proto.py``).

Why: the templates' h2 core holds a warp's loads in registers (UNROLL chunks of RT rows), then uses them, then sends
for the next batch. Every warp of the grid waits on its batch at about the same time, so the memory sits idle while
they compute, and doubling the batches in registers halves the warps an SM holds (measured: no faster). Here each
warp keeps a ring of STAGES batches in shared memory, filled by ``cp.async`` (Ampere's asynchronous copy: no register
holds a load in flight) STAGES - 1 batches ahead of the one it uses, across row-group boundaries, in a persistent
grid (PER_SM threadgroups an SM, X staged once a threadgroup). The maths of a chunk is the h2 core's (signed half2
fields, the chunk's products summed in half2, the scale once a chunk and the bias times the chunk's sum of X).

Variants (``--variants``): ``r<RT>u<U>s<STAGES>b<BLOCK>p<PER_SM>``, plus ``gpu_core_proto``'s names (``a...``), which
run its kernel in the same process for the comparison. M = 1, float16, MLX's layout (W [N, K/8] uint32 of 4-bit
fields, low bits first; a float16 scale and bias per group of G along K).

    python3 benchmarks/gpu_core_ring.py --out $OUT            # on the GPU machine (CuPy only)
    python3 benchmarks/gpu_core_ring.py --dry                 # here: compiles each variant with nvcc (sm_90)
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_core_proto as proto  # noqa: E402

SOURCE = r"""
#include <cuda_fp16.h>
__device__ __forceinline__ void cp16(void* dst, const void* src, bool ok) {
    const unsigned int d = static_cast<unsigned int>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(d), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void wait_groups() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

extern "C" __global__ void __launch_bounds__(BLOCK) ring(const uint4* __restrict__ W, const __half* __restrict__ S,
        const __half* __restrict__ B, const __half* __restrict__ X, __half* __restrict__ Y, int N, int K, int G) {
    constexpr int WARPS = BLOCK / 32, SLOT = RT * UNR * 32;      // uint4 of a warp's batch
    extern __shared__ __align__(16) unsigned char smem[];
    const int CH = K / 32, NG = K / G;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint4* my = reinterpret_cast<uint4*>(smem) + (size_t)warp * STAGES * SLOT;
    uint4* xs = reinterpret_cast<uint4*>(smem) + (size_t)WARPS * STAGES * SLOT;   // [MB][4][CH]
    float* xsum = reinterpret_cast<float*>(xs + (size_t)MB * K / 8);             // [MB][CH]
    const int ngr = (N + RT - 1) / RT, spg = (CH + 32 * UNR - 1) / (32 * UNR);
    const int gw = blockIdx.x * WARPS + warp, gstride = gridDim.x * WARPS;
    const int nsteps = (gw < ngr ? (ngr - gw + gstride - 1) / gstride : 0) * spg;
    const int gsh = __ffs(G / 32) - 1;
    __half2 sb[STAGES][RT][UNR];                  // (scale, bias) of each chunk in the ring
    // Send for step s (row group gw + (s / spg) * gstride, chunks (s % spg) * 32 UNR + ...) into slot SL.
#define ISSUE(s, SL)                                                                                          \
    {                                                                                                         \
        const int ist = (s);                                                                                   \
        const int g = gw + (ist / spg) * gstride, c0 = (ist % spg) * 32 * UNR;                                  \
        _Pragma("unroll") for (int u = 0; u < UNR; ++u) {                                                     \
            _Pragma("unroll") for (int r = 0; r < RT; ++r) {                                                  \
                const int c = c0 + u * 32 + lane, row = g * RT + r;                                           \
                const bool ok = ist < nsteps && c < CH && row < N;                                            \
                const size_t si = ok ? (size_t)row * NG + (c >> gsh) : 0;                                     \
                cp16(my + (SL) * SLOT + (r * UNR + u) * 32 + lane, W + (ok ? (size_t)row * CH + c : 0), ok);  \
                sb[SL][r][u] = __halves2half2(S[si], B[si]);                                                  \
            }                                                                                                 \
        }                                                                                                     \
        commit();                                                                                             \
    }
#pragma unroll
    for (int k = 0; k < STAGES - 1; ++k) ISSUE(k, k)
    // X, staged while the first batches are on their way (as gpu_core_proto: word j of chunk c at j * CH + c).
    for (int i = threadIdx.x; i < MB * K / 8; i += BLOCK) {
        const int w = i % (K / 8), m = i / (K / 8);
        const uint4 v = *reinterpret_cast<const uint4*>(X + (size_t)m * K + (size_t)w * 8);
        const __half* h = reinterpret_cast<const __half*>(&v);
        __half2 o[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) o[p] = __halves2half2(h[p], h[p + 4]);
        xs[(size_t)m * 4 * CH + (w % 4) * CH + w / 4] = *reinterpret_cast<const uint4*>(o);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < MB * CH; i += BLOCK) {
        const int c = i % CH, m = i / CH;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint4 v = xs[(size_t)m * 4 * CH + j * CH + c];
            const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
            for (int p = 0; p < 4; ++p) { const float2 f = __half22float2(h[p]); s += f.x + f.y; }
        }
        xsum[i] = s;
    }
    __syncthreads();
    const __half2 k1032 = __float2half2_rn(1032.0f), k16th = __float2half2_rn(0.0625f), km72 = __float2half2_rn(-72.0f);
    float acc[RT][MB];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int m = 0; m < MB; ++m) acc[r][m] = 0.0f;
    for (int base = 0; base < nsteps; base += STAGES) {
#pragma unroll
        for (int k = 0; k < STAGES; ++k) {
            const int st = base + k;
            ISSUE(st + STAGES - 1, (k + STAGES - 1) % STAGES)
            wait_groups<STAGES - 1>();
            if (st < nsteps) {
                const int g = gw + (st / spg) * gstride, c0 = (st % spg) * 32 * UNR;
#pragma unroll
                for (int u = 0; u < UNR; ++u) {
                    const int c = c0 + u * 32 + lane;
                    if (c < CH) {
                        __half2 hs[RT][MB];
#pragma unroll
                        for (int r = 0; r < RT; ++r)
#pragma unroll
                            for (int m = 0; m < MB; ++m) hs[r][m] = __float2half2_rn(0.0f);
#pragma unroll
                        for (int j = 0; j < 4; ++j) {
                            uint4 xv[MB];
#pragma unroll
                            for (int m = 0; m < MB; ++m) xv[m] = xs[(size_t)m * 4 * CH + j * CH + c];
#pragma unroll
                            for (int r = 0; r < RT; ++r) {
                                const uint4 wq = my[k * SLOT + (r * UNR + u) * 32 + lane];
                                const unsigned int word = j == 0 ? wq.x : j == 1 ? wq.y : j == 2 ? wq.z : wq.w;
                                const unsigned int hi = word >> 8;
                                unsigned int q0 = (word & 0x000F000Fu) | 0x64006400u, q1 = (word & 0x00F000F0u) | 0x64006400u;
                                unsigned int q2 = (hi & 0x000F000Fu) | 0x64006400u, q3 = (hi & 0x00F000F0u) | 0x64006400u;
                                const __half2 h0 = __hsub2(*reinterpret_cast<__half2*>(&q0), k1032);
                                const __half2 h1 = __hfma2(*reinterpret_cast<__half2*>(&q1), k16th, km72);
                                const __half2 h2 = __hsub2(*reinterpret_cast<__half2*>(&q2), k1032);
                                const __half2 h3 = __hfma2(*reinterpret_cast<__half2*>(&q3), k16th, km72);
#pragma unroll
                                for (int m = 0; m < MB; ++m) {
                                    const __half2* xp = reinterpret_cast<const __half2*>(&xv[m]);
                                    hs[r][m] = __hfma2(h0, xp[0], hs[r][m]);
                                    hs[r][m] = __hfma2(h1, xp[1], hs[r][m]);
                                    hs[r][m] = __hfma2(h2, xp[2], hs[r][m]);
                                    hs[r][m] = __hfma2(h3, xp[3], hs[r][m]);
                                }
                            }
                        }
#pragma unroll
                        for (int r = 0; r < RT; ++r) {
                            const float2 p = __half22float2(sb[k][r][u]);
                            const float bo = fmaf(8.0f, p.x, p.y);
#pragma unroll
                            for (int m = 0; m < MB; ++m) {
                                const float2 f = __half22float2(hs[r][m]);
                                acc[r][m] = fmaf(p.x, f.x + f.y, fmaf(bo, xsum[m * CH + c], acc[r][m]));
                            }
                        }
                    }
                }
                if (st % spg == spg - 1) {   // the row group's last batch: its rows are done
#pragma unroll
                    for (int r = 0; r < RT; ++r)
#pragma unroll
                        for (int m = 0; m < MB; ++m) {
#pragma unroll
                            for (int o = 16; o > 0; o >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
                            if (lane == 0 && g * RT + r < N) Y[(size_t)m * N + g * RT + r] = __float2half_rn(acc[r][m]);
                            acc[r][m] = 0.0f;
                        }
                }
            }
        }
    }
    wait_groups<0>();
}
"""

VARIANT = re.compile(r"^r(\d)u(\d)s(\d)b(\d+)p(\d+)(?:m(\d+))?$")


@dataclass(frozen=True)
class Ring:
    name: str
    rt: int
    u: int
    stages: int
    block: int
    per_sm: int
    mb: int  # rows of X (M)

    @staticmethod
    def parse(text: str) -> Ring:
        m = VARIANT.match(text)
        if not m:
            raise SystemExit(f"bad variant {text!r}")
        return Ring(text, int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]), int(m[6] or 1))

    def defines(self) -> list[str]:
        return [f"-DRT={self.rt}", f"-DUNR={self.u}", f"-DSTAGES={self.stages}", f"-DBLOCK={self.block}",
                f"-DMB={self.mb}"]

    def smem(self, k: int) -> int:
        return (self.block // 32) * self.stages * self.rt * self.u * 32 * 16 + self.mb * (k * 2 + (k // 32) * 4)


def dry(rings: list[Ring]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "ring.cu"
        src.write_text(SOURCE)
        for v in rings:
            cmd = ["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", *v.defines(), "-o", str(Path(tmp) / "r.cubin"),
                   str(src)]
            got = subprocess.run(cmd, capture_output=True, text=True, check=False)
            regs = re.findall(r"Used (\d+) registers", got.stderr)
            spill = re.findall(r"(\d+) bytes spill stores", got.stderr)
            print(v.name, "ok" if got.returncode == 0 else got.stderr[-3000:], "registers", regs, "spills", spill,
                  "smem K=4096", v.smem(4096), "K=11008", v.smem(11008))
            if got.returncode:
                return 1
    return 0


def _ring_row(cp: Any, np: Any, v: Ring, wt: proto.Weights, sms: int, reps: int) -> dict[str, Any]:
    fn = cp.RawModule(code=SOURCE, options=tuple(v.defines())).get_function("ring")
    smem = v.smem(wt.k)
    fn.max_dynamic_shared_size_bytes = smem
    by_smem = (227 * 1024) // (smem + 1024)
    by_regs = 65536 // (((fn.num_regs + 7) // 8 * 8) * v.block)
    per_sm = max(1, min(v.per_sm, by_smem, by_regs))
    ngr = (wt.n + v.rt - 1) // v.rt
    grid = min((ngr + v.block // 32 - 1) // (v.block // 32), sms * per_sm)
    y = cp.zeros((v.mb, wt.n), dtype=cp.float16)
    x = cp.ascontiguousarray(wt.x4[:v.mb])  # type: ignore[attr-defined]
    ref = wt.ref4[:v.mb]  # type: ignore[attr-defined]

    def launch(i: int) -> None:
        fn((grid,), (v.block,), (wt.w[i], wt.s[i], wt.b[i], x, y, np.int32(wt.n), np.int32(wt.k), np.int32(wt.g)),
           shared_mem=smem)

    launch(0)
    got = cp.asnumpy(y).astype(np.float64)
    err = float(np.max(np.abs(got - ref) / (2e-3 * np.sqrt(wt.k) + 2e-3 * np.abs(ref))))
    return {**asdict(v), "n": wt.n, "k": wt.k, "grid": grid, "per_sm_run": per_sm, "regs": fn.num_regs,
            "us": proto._time(cp, launch, len(wt.w), reps), "err_over_tol": err, "ok": err <= 1.0}


def _weights(cp: Any, np: Any, n: int, k: int, g: int = 64, mmax: int = 4) -> proto.Weights:
    """``gpu_core_proto``'s weights with X of ``mmax`` rows (x4) and their float64 products (ref4) kept too."""
    wt = proto.Weights.make(cp, np, n, k, g)
    rng = np.random.default_rng(1)
    x4 = rng.standard_normal((mmax, k)).astype(np.float16)
    x4[0] = cp.asnumpy(wt.x)
    w_host = cp.asnumpy(wt.w[0])
    q = np.stack([(w_host >> (4 * i)) & 15 for i in range(8)], axis=-1).reshape(n, k).astype(np.float64)
    wf = (q * np.repeat(cp.asnumpy(wt.s[0]).astype(np.float64), g, axis=1)
          + np.repeat(cp.asnumpy(wt.b[0]).astype(np.float64), g, axis=1))
    wt.x4 = cp.asarray(x4)  # type: ignore[attr-defined]
    wt.ref4 = x4.astype(np.float64) @ wf.T  # type: ignore[attr-defined]
    return wt


def measure(names: list[str], shapes: list[str], reps: int, out: Path) -> int:
    import cupy as cp
    import numpy as np

    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    sms = props["multiProcessorCount"]
    chip = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    print("device:", chip, "SMs", sms, flush=True)
    rows: list[dict[str, Any]] = []
    stream_k = cp.RawModule(code=proto.SOURCE, options=("-DRT=1", "-DUNR=1", "-DBLOCK=128", "-DSUMCHUNK=0")
                            ).get_function("stream")
    out.mkdir(parents=True, exist_ok=True)
    for sname in shapes:
        wt = _weights(cp, np, *proto.SHAPES[sname])
        sink = cp.zeros(1, dtype=cp.uint32)
        words = np.uint64(wt.n * wt.k // 32)
        stream_us = proto._time(cp, lambda i, wt=wt, words=words, sink=sink: stream_k(
            (sms * 4,), (512,), (wt.flat[i], words, sink)), len(wt.w), reps)
        print(f"{sname} {wt.n}x{wt.k}: stream of W {stream_us:.1f} us ({wt.n * wt.k / 2 / stream_us / 1e6:.2f} TB/s), "
              f"{len(wt.w)} copies", flush=True)
        for name in names:
            try:
                row = (_ring_row(cp, np, Ring.parse(name), wt, sms, reps) if name.startswith("r") else
                       proto._variant_row(cp, np, proto.Variant.parse(name), wt, sms, reps))
            except Exception as exc:  # a variant that fails is a row, not the end of the run
                row = {"name": name, "error": f"{type(exc).__name__}: {exc}"[:300], "us": float("nan")}
            row.update(shape=sname, stream_us=stream_us, chip=chip, pct_of_stream=100.0 * stream_us / row["us"])
            rows.append(row)
            print(f"  {name:16s} grid {row.get('grid', 0):5d} regs {row.get('regs', '-')!s:>4}: {row['us']:7.1f} us "
                  f"({row['pct_of_stream']:5.1f} % of stream)  err/tol {row.get('err_over_tol', float('nan')):.3f}"
                  f"{'  ' + row['error'] if 'error' in row else ''}", flush=True)
            (out / "gpu_core_ring.json").write_text(json.dumps({"chip": chip, "rows": rows}, indent=1))
        wt.w = wt.s = wt.b = wt.flat = []
        cp.get_default_memory_pool().free_all_blocks()
    return 0


DEFAULT = ("a2u2b256p4s,a1u4b256p4s,r1u1s4b256p4,r1u1s8b256p4,r1u2s4b256p4,r2u1s4b256p4,r1u1s6b128p8,"
           "r1u2s6b256p2,r1u1s4b256p2,r1u1s4b256p4m4,r1u1s6b256p4m4,r2u1s4b256p4m4")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--shapes", default="qkv,down,o,gate_up")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--variants", default=DEFAULT)
    args = ap.parse_args()
    names = args.variants.split(",")
    if args.dry:
        rc = proto.dry([proto.Variant.parse(t) for t in names if t.startswith("a")])
        return rc or dry([Ring.parse(t) for t in names if t.startswith("r")])
    return measure(names, args.shapes.split(","), args.reps, args.out)


if __name__ == "__main__":
    sys.exit(main())

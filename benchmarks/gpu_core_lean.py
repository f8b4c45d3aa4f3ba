"""Issue 35: a quantized matrix-vector core at ~1.5 instructions a weight, not ~4 — a prototype.

Why: Nsight Compute on the h2 core (``gpu_ncu_core.sh``, Q/K/V shape, M = 1) shows it bound by issue, not by memory:
2.65 warp instructions a cycle of an SM's 4 while active, DRAM at 36 % of its peak; ~125 lane instructions a 16-byte
chunk (~3.9 a weight). The H200 delivers ~37 4-bit weights an SM-cycle at its memory's peak against 128 lane
instructions an SM-cycle: a core must spend well under 3.5 instructions a weight to be bound by memory. A
shared-memory ring that keeps loads out of registers (``gpu_core_ring.py``) was slower (47 % against 67 %).

The lean core: tensor cores (mma.sync m16n8k16, float32 accumulation) do the products; a weight costs half a LOP3
(two 4-bit fields become a half2 ``1024 + q`` or ``1024 + 16 q`` by one LOP3 with the magic exponent) and nothing
else: the 1024 is taken off once a group (``off`` = 1024 * the group's sum of X, staged), the 16 by X's pairs that
meet the high fields being staged divided by 16, and the group's scale and bias are applied to the group's float32
sums (s * (sum - off) + b * sum of X). So that a tensor-core product never mixes groups, thread c of a quad reads,
of each group in the quad's 128 values, its own G/32 words (a G = 64 row: two 8-byte loads a step, the quad's 64
bytes whole). M = 1..8 rows of X cost the same (the n = 8 columns of the product). KS warps split a 16-row tile's K
and meet in shared memory.

Variants (``--variants``): ``l<KS>u<U>m<M>`` (G from ``--group``, 64 or 128).

    python3 benchmarks/gpu_core_lean.py --out $OUT            # on the GPU machine (CuPy only)
    python3 benchmarks/gpu_core_lean.py --dry                 # here: compiles each variant with nvcc (sm_90)
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
import gpu_core_ring as ring  # noqa: E402

SOURCE = r"""
#include <cuda_fp16.h>
template <int WL> struct words_of;
template <> struct words_of<1> { using type = unsigned int; };
template <> struct words_of<2> { using type = uint2; };
template <> struct words_of<4> { using type = uint4; };
__device__ __forceinline__ unsigned int word_at(unsigned int v, int) { return v; }
__device__ __forceinline__ unsigned int word_at(uint2 v, int i) { return i == 0 ? v.x : v.y; }
__device__ __forceinline__ unsigned int word_at(uint4 v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
__device__ __forceinline__ void mma(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

extern "C" __global__ void __launch_bounds__(KS * 32) lean(const unsigned int* __restrict__ W, const __half* __restrict__ S,
        const __half* __restrict__ B, const __half* __restrict__ X, __half* __restrict__ Y, int N, int K) {
    constexpr int NGQ = 128 / GS, WL = GS / 32, WG = GS / 8;   // groups a quad-step spans; words a load; words a group
    using LW = typename words_of<WL>::type;
    const int KW = K / 8, NG = K / GS, T = K / 128;
    const int lane = threadIdx.x & 31, ks = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int row0 = blockIdx.x * 16 + g, row1 = row0 + 8;
    extern __shared__ __align__(16) unsigned char smem[];
    __half2* xs = reinterpret_cast<__half2*>(smem);                      // [MB][T][4][16] pairs
    float* off = reinterpret_cast<float*>(xs + (size_t)MB * T * 64);      // [MB][NG]
    float* xsm = off + MB * NG;                                           // [MB][NG]
    float* red = xsm + MB * NG;                                           // [KS][32][4]
    __half2* sbs = reinterpret_cast<__half2*>(red + KS * 32 * 4);         // [16][NG]: the tile's (scale, bias)
    for (int i = threadIdx.x; i < 16 * NG; i += KS * 32) {
        const size_t si = (size_t)(blockIdx.x * 16 + i / NG) * NG + i % NG;
        sbs[i] = __halves2half2(S[si], B[si]);
    }
    // The first batch is sent for before X is staged: the weights' first bytes are on their way meanwhile.
    const int tb = ks * T / KS, te = (ks + 1) * T / KS;   // this warp's steps: contiguous
    LW wv[UNR][2][NGQ];
#define LOAD(T0)                                                                                     \
    _Pragma("unroll") for (int u = 0; u < UNR; ++u) {                                                \
        const int t = min((T0) + u, te - 1);                                                         \
        _Pragma("unroll") for (int j = 0; j < NGQ; ++j) {                                            \
            const size_t wi = (size_t)t * 16 + j * WG + c * WL;                                      \
            wv[u][0][j] = __ldg(reinterpret_cast<const LW*>(W + (size_t)row0 * KW + wi));            \
            wv[u][1][j] = __ldg(reinterpret_cast<const LW*>(W + (size_t)row1 * KW + wi));            \
        }                                                                                            \
    }
    if (tb < te) { LOAD(tb) }
    // X's pairs in each thread's order: word w (values 8w..8w+7) gives (x0, x4), (x1, x5) / 16, (x2, x6), (x3, x7) / 16.
    for (int i = threadIdx.x; i < MB * KW; i += KS * 32) {
        const int m = i / KW, w = i % KW, t = w / 16, wq = w % 16, j = wq / WG, r = wq % WG, cc = r / WL, ii = r % WL;
        const uint4 v = *reinterpret_cast<const uint4*>(X + (size_t)m * K + (size_t)w * 8);
        const __half* h = reinterpret_cast<const __half*>(&v);
        const __half2 sixteenth = __float2half2_rn(0.0625f);
        __half2* dst = xs + (((size_t)m * T + t) * 4 + cc) * 16 + (j * WL + ii) * 4;
        dst[0] = __halves2half2(h[0], h[4]);
        dst[1] = __hmul2(__halves2half2(h[1], h[5]), sixteenth);
        dst[2] = __halves2half2(h[2], h[6]);
        dst[3] = __hmul2(__halves2half2(h[3], h[7]), sixteenth);
    }
    __syncthreads();
    // Each group's sums from the staged pairs, in a fixed order: off = 1024 * what the products saw, xsm = its X.
    for (int i = threadIdx.x; i < MB * NG; i += KS * 32) {
        const int m = i / NG, grp = i % NG;
        float lo = 0.0f, hi = 0.0f;
        for (int w = grp * WG; w < grp * WG + WG; ++w) {
            const int t = w / 16, wq = w % 16, j = wq / WG, r = wq % WG, cc = r / WL, ii = r % WL;
            const __half2* src = xs + (((size_t)m * T + t) * 4 + cc) * 16 + (j * WL + ii) * 4;
            const float2 f0 = __half22float2(src[0]), f1 = __half22float2(src[1]);
            const float2 f2 = __half22float2(src[2]), f3 = __half22float2(src[3]);
            lo += (f0.x + f0.y) + (f2.x + f2.y);
            hi += (f1.x + f1.y) + (f3.x + f3.y);
        }
        off[i] = 1024.0f * (lo + hi);
        xsm[i] = lo + 16.0f * hi;
    }
    __syncthreads();
    float y[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int m0 = 2 * c, m1 = 2 * c + 1;
    for (int t0 = tb; t0 < te; t0 += UNR) {
#pragma unroll
        for (int u = 0; u < UNR; ++u) {
            const int t = t0 + u;
            if (t < te) {
                unsigned int xv[16];
                if (g < MB) {
                    const uint4* src = reinterpret_cast<const uint4*>(xs + (((size_t)g * T + t) * 4 + c) * 16);
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const uint4 v = src[q];
                        xv[4 * q] = v.x; xv[4 * q + 1] = v.y; xv[4 * q + 2] = v.z; xv[4 * q + 3] = v.w;
                    }
                } else {
#pragma unroll
                    for (int q = 0; q < 16; ++q) xv[q] = 0u;
                }
#pragma unroll
                for (int j = 0; j < NGQ; ++j) {
                    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int ii = 0; ii < WL; ++ii) {
                        const unsigned int a = word_at(wv[u][0][j], ii), b = word_at(wv[u][1][j], ii);
                        const unsigned int ah = a >> 8, bh = b >> 8;
                        const int p = (j * WL + ii) * 4;
                        mma(d, (a & 0x000F000Fu) | 0x64006400u, (b & 0x000F000Fu) | 0x64006400u,
                            (a & 0x00F000F0u) | 0x64006400u, (b & 0x00F000F0u) | 0x64006400u, xv[p], xv[p + 1]);
                        mma(d, (ah & 0x000F000Fu) | 0x64006400u, (bh & 0x000F000Fu) | 0x64006400u,
                            (ah & 0x00F000F0u) | 0x64006400u, (bh & 0x00F000F0u) | 0x64006400u, xv[p + 2], xv[p + 3]);
                    }
                    const int grp = t * NGQ + j;
                    const float2 p0 = __half22float2(sbs[g * NG + grp]), p1 = __half22float2(sbs[(g + 8) * NG + grp]);
                    if (m0 < MB) {
                        const float o = off[m0 * NG + grp], xsum = xsm[m0 * NG + grp];
                        y[0] = fmaf(p0.x, d[0] - o, fmaf(p0.y, xsum, y[0]));
                        y[2] = fmaf(p1.x, d[2] - o, fmaf(p1.y, xsum, y[2]));
                    }
                    if (m1 < MB) {
                        const float o = off[m1 * NG + grp], xsum = xsm[m1 * NG + grp];
                        y[1] = fmaf(p0.x, d[1] - o, fmaf(p0.y, xsum, y[1]));
                        y[3] = fmaf(p1.x, d[3] - o, fmaf(p1.y, xsum, y[3]));
                    }
                }
            }
        }
        if (t0 + UNR < te) { LOAD(t0 + UNR) }
    }
    if (KS > 1) {
#pragma unroll
        for (int e = 0; e < 4; ++e) red[(ks * 32 + lane) * 4 + e] = y[e];
        __syncthreads();
        if (ks != 0) return;
        for (int v = 1; v < KS; ++v)
#pragma unroll
            for (int e = 0; e < 4; ++e) y[e] += red[(v * 32 + lane) * 4 + e];
    }
    if (m0 < MB) { Y[(size_t)m0 * N + row0] = __float2half_rn(y[0]); Y[(size_t)m0 * N + row1] = __float2half_rn(y[2]); }
    if (m1 < MB) { Y[(size_t)m1 * N + row0] = __float2half_rn(y[1]); Y[(size_t)m1 * N + row1] = __float2half_rn(y[3]); }
}
// The lean arithmetic in a persistent grid: X (pairs and the groups' sums) staged once a threadgroup, which then
// takes 16-row tiles blockIdx.x, + gridDim.x, ...; its KS warps split each tile's K (contiguous steps) and meet in
// shared memory once a tile (double-buffered: one barrier a tile); each step's (scale, bias) pairs are loaded with its
// weights (G = 64: the step's two groups in one 32-bit load of each); the fields made by one LOP3 (magic in a register).
template <unsigned int MASK> __device__ __forceinline__ unsigned int fld(unsigned int w) {
    unsigned int r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "n"(MASK), "n"(0x64006400u));
    return r;
}
extern "C" __global__ void __launch_bounds__(KS * 32) lean2(const unsigned int* __restrict__ W, const __half* __restrict__ S,
        const __half* __restrict__ B, const __half* __restrict__ X, __half* __restrict__ Y, int N, int K) {
    static_assert(GS == 64, "the persistent prototype reads a step's two groups' scales in one load");
    constexpr int WL = 2, WG = 8;
    const int KW = K / 8, NG = K / GS, T = K / 128, ntiles = N / 16;
    const int lane = threadIdx.x & 31, ks = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    extern __shared__ __align__(16) unsigned char smem[];
    __half2* xs = reinterpret_cast<__half2*>(smem);                      // [MB][T][4][16] pairs
    float* off = reinterpret_cast<float*>(xs + (size_t)MB * T * 64);      // [MB][NG]
    float* xsm = off + MB * NG;                                           // [MB][NG]
    float* red = xsm + MB * NG;                                           // [2][KS][32][4]
    const int tb = ks * T / KS, te = (ks + 1) * T / KS;
    uint2 wv[UNR][2][2];
    __half2 sv[UNR][2], bv[UNR][2];                                       // (scale, scale) and (bias, bias) of the step's groups
    auto load = [&](int tile, int t0) {
#pragma unroll
        for (int u = 0; u < UNR; ++u) {
            const int t = min(t0 + u, te - 1);
            const size_t r0 = (size_t)tile * 16 + g, r1 = r0 + 8;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const size_t wi = (size_t)t * 16 + j * WG + c * WL;
                wv[u][0][j] = __ldg(reinterpret_cast<const uint2*>(W + r0 * KW + wi));
                wv[u][1][j] = __ldg(reinterpret_cast<const uint2*>(W + r1 * KW + wi));
            }
            sv[u][0] = __ldg(reinterpret_cast<const __half2*>(S + r0 * NG + 2 * t));
            sv[u][1] = __ldg(reinterpret_cast<const __half2*>(S + r1 * NG + 2 * t));
            bv[u][0] = __ldg(reinterpret_cast<const __half2*>(B + r0 * NG + 2 * t));
            bv[u][1] = __ldg(reinterpret_cast<const __half2*>(B + r1 * NG + 2 * t));
        }
    };
    if ((int)blockIdx.x < ntiles && tb < te) load(blockIdx.x, tb);
    // X's pairs, one thread a (row, step, thread-of-quad) slot of 16 pairs: words t*16 + j*8 + cc*2 + ii.
    for (int i = threadIdx.x; i < MB * T * 4; i += KS * 32) {
        const int m = i / (T * 4), t = (i / 4) % T, cc = i % 4;
        __half2* dst = xs + (size_t)i * 16;
        const __half2 sixteenth = __float2half2_rn(0.0625f);
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int ii = 0; ii < WL; ++ii) {
                const uint4 v = __ldg(reinterpret_cast<const uint4*>(X + (size_t)m * K + (size_t)(t * 16 + j * WG + cc * WL + ii) * 8));
                const __half* h = reinterpret_cast<const __half*>(&v);
                __half2* d = dst + (j * WL + ii) * 4;
                d[0] = __halves2half2(h[0], h[4]);
                d[1] = __hmul2(__halves2half2(h[1], h[5]), sixteenth);
                d[2] = __halves2half2(h[2], h[6]);
                d[3] = __hmul2(__halves2half2(h[3], h[7]), sixteenth);
            }
    }
    __syncthreads();
    // A group's sums from its staged pairs: group q = 2 t + j of row m sits in slots (m, t, 0..3), pairs j*8 .. j*8+7.
    for (int i = threadIdx.x; i < MB * NG; i += KS * 32) {
        const int m = i / NG, q = i % NG, t = q / 2, j = q % 2;
        float lo = 0.0f, hi = 0.0f;
#pragma unroll
        for (int cc = 0; cc < 4; ++cc) {
            const __half2* src = xs + (((size_t)m * T + t) * 4 + cc) * 16 + j * 8;
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                const float2 a = __half22float2(src[e]), b = __half22float2(src[e + 1]);
                lo += a.x + a.y;
                hi += b.x + b.y;
            }
        }
        off[i] = 1024.0f * (lo + hi);
        xsm[i] = lo + 16.0f * hi;
    }
    __syncthreads();
    const int m0 = 2 * c, m1 = 2 * c + 1;
    int par = 0;
    for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x, par ^= 1) {
        float y[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int t0 = tb; t0 < te; t0 += UNR) {
#pragma unroll
            for (int u = 0; u < UNR; ++u) {
                const int t = t0 + u;
                if (t < te) {
                    unsigned int xv[16];
                    if (g < MB) {
                        const uint4* src = reinterpret_cast<const uint4*>(xs + (((size_t)g * T + t) * 4 + c) * 16);
#pragma unroll
                        for (int q = 0; q < 4; ++q) {
                            const uint4 v = src[q];
                            xv[4 * q] = v.x; xv[4 * q + 1] = v.y; xv[4 * q + 2] = v.z; xv[4 * q + 3] = v.w;
                        }
                    } else {
#pragma unroll
                        for (int q = 0; q < 16; ++q) xv[q] = 0u;
                    }
                    const float2 s0 = __half22float2(sv[u][0]), s1 = __half22float2(sv[u][1]);
                    const float2 b0 = __half22float2(bv[u][0]), b1 = __half22float2(bv[u][1]);
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                        for (int ii = 0; ii < WL; ++ii) {
                            const unsigned int a = ii == 0 ? wv[u][0][j].x : wv[u][0][j].y;
                            const unsigned int b = ii == 0 ? wv[u][1][j].x : wv[u][1][j].y;
                            const unsigned int ah = a >> 8, bh = b >> 8;
                            const int p = (j * WL + ii) * 4;
                            mma(d, fld<0x000F000Fu>(a), fld<0x000F000Fu>(b), fld<0x00F000F0u>(a), fld<0x00F000F0u>(b), xv[p], xv[p + 1]);
                            mma(d, fld<0x000F000Fu>(ah), fld<0x000F000Fu>(bh), fld<0x00F000F0u>(ah), fld<0x00F000F0u>(bh), xv[p + 2], xv[p + 3]);
                        }
                        const int q = 2 * t + j;
                        const float sa = j ? s0.y : s0.x, sb = j ? s1.y : s1.x, ba = j ? b0.y : b0.x, bb = j ? b1.y : b1.x;
                        if (m0 < MB) {
                            const float o = off[m0 * NG + q], xsum = xsm[m0 * NG + q];
                            y[0] = fmaf(sa, d[0] - o, fmaf(ba, xsum, y[0]));
                            y[2] = fmaf(sb, d[2] - o, fmaf(bb, xsum, y[2]));
                        }
                        if (m1 < MB) {
                            const float o = off[m1 * NG + q], xsum = xsm[m1 * NG + q];
                            y[1] = fmaf(sa, d[1] - o, fmaf(ba, xsum, y[1]));
                            y[3] = fmaf(sb, d[3] - o, fmaf(bb, xsum, y[3]));
                        }
                    }
                }
            }
            // the next batch: this tile's, else the next tile's first (sent for before the tile's barrier)
            if (t0 + UNR < te) load(tile, t0 + UNR);
            else if (tile + (int)gridDim.x < ntiles) load(tile + gridDim.x, tb);
        }
        float* rd = red + (size_t)par * KS * 128;
#pragma unroll
        for (int e = 0; e < 4; ++e) rd[(ks * 32 + lane) * 4 + e] = y[e];
        __syncthreads();
        if (ks == 0) {
            for (int v = 1; v < KS; ++v)
#pragma unroll
                for (int e = 0; e < 4; ++e) y[e] += rd[(v * 32 + lane) * 4 + e];
            const int row0 = tile * 16 + g, row1 = row0 + 8;
            if (m0 < MB) { Y[(size_t)m0 * N + row0] = __float2half_rn(y[0]); Y[(size_t)m0 * N + row1] = __float2half_rn(y[2]); }
            if (m1 < MB) { Y[(size_t)m1 * N + row0] = __float2half_rn(y[1]); Y[(size_t)m1 * N + row1] = __float2half_rn(y[3]); }
        }
    }
}
"""

VARIANT = re.compile(r"^l(\d+)u(\d)m(\d)$")


@dataclass(frozen=True)
class Lean:
    name: str
    ks: int
    u: int
    mb: int

    @staticmethod
    def parse(text: str) -> Lean:
        m = VARIANT.match(text)
        if not m:
            raise SystemExit(f"bad variant {text!r}")
        return Lean(text, int(m[1]), int(m[2]), int(m[3]))

    def defines(self, group: int) -> list[str]:
        return [f"-DKS={self.ks}", f"-DUNR={self.u}", f"-DMB={self.mb}", f"-DGS={group}"]

    def smem(self, k: int, group: int) -> int:
        return self.mb * k * 2 + 2 * self.mb * (k // group) * 4 + self.ks * 32 * 4 * 4 + 16 * (k // group) * 4


PVARIANT = re.compile(r"^p(\d+)u(\d)m(\d)b(\d+)$")


@dataclass(frozen=True)
class Persistent:
    """``lean2``: the lean arithmetic in a persistent grid of PER_SM threadgroups an SM (X staged once each)."""

    name: str
    ks: int
    u: int
    mb: int
    per_sm: int

    @staticmethod
    def parse(text: str) -> Persistent:
        m = PVARIANT.match(text)
        if not m:
            raise SystemExit(f"bad variant {text!r}")
        return Persistent(text, int(m[1]), int(m[2]), int(m[3]), int(m[4]))

    def defines(self, group: int) -> list[str]:
        return [f"-DKS={self.ks}", f"-DUNR={self.u}", f"-DMB={self.mb}", f"-DGS={group}"]

    def smem(self, k: int, group: int) -> int:
        return self.mb * k * 2 + 2 * self.mb * (k // group) * 4 + 2 * self.ks * 32 * 4 * 4


def dry(leans: list[Lean | Persistent], group: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "lean.cu"
        src.write_text(SOURCE)
        for v in leans:
            cmd = ["nvcc", "-arch=sm_90", "-cubin", "-Xptxas", "-v", *v.defines(group), "-o", str(Path(tmp) / "l.cubin"),
                   str(src)]
            got = subprocess.run(cmd, capture_output=True, text=True, check=False)
            kernel = "lean2" if isinstance(v, Persistent) else "lean"
            regs = re.findall(rf"Function properties for {kernel}\n[\s\S]*?Used (\d+) registers", got.stderr)
            spill = re.findall(r"(\d+) bytes spill stores", got.stderr)
            print(v.name, "ok" if got.returncode == 0 else got.stderr[-3000:], "registers", regs, "spills", spill,
                  "smem K=11008", v.smem(11008, group))
            if got.returncode:
                return 1
    return 0


def _lean_row(cp: Any, np: Any, v: Lean, wt: proto.Weights, group: int, reps: int) -> dict[str, Any]:
    fn = cp.RawModule(code=SOURCE, options=tuple(v.defines(group))).get_function("lean")
    smem = v.smem(wt.k, group)
    fn.max_dynamic_shared_size_bytes = smem
    grid = wt.n // 16
    y = cp.zeros((v.mb, wt.n), dtype=cp.float16)
    x = cp.ascontiguousarray(wt.x4[:v.mb])  # type: ignore[attr-defined]
    ref = wt.ref4[:v.mb]  # type: ignore[attr-defined]

    def launch(i: int) -> None:
        fn((grid,), (v.ks * 32,), (wt.w[i], wt.s[i], wt.b[i], x, y, np.int32(wt.n), np.int32(wt.k)), shared_mem=smem)

    launch(0)
    got = cp.asnumpy(y).astype(np.float64)
    err = float(np.max(np.abs(got - ref) / (2e-3 * np.sqrt(wt.k) + 2e-3 * np.abs(ref))))
    return {**asdict(v), "n": wt.n, "k": wt.k, "grid": grid, "regs": fn.num_regs,
            "us": proto._time(cp, launch, len(wt.w), reps), "err_over_tol": err, "ok": err <= 1.0}


def _persistent_row(cp: Any, np: Any, v: Persistent, wt: proto.Weights, group: int, sms: int, reps: int
                    ) -> dict[str, Any]:
    fn = cp.RawModule(code=SOURCE, options=tuple(v.defines(group))).get_function("lean2")
    smem = v.smem(wt.k, group)
    fn.max_dynamic_shared_size_bytes = smem
    by_smem = (227 * 1024) // (smem + 1024)
    by_regs = 65536 // (((fn.num_regs + 7) // 8 * 8) * v.ks * 32)
    per_sm = max(1, min(v.per_sm, by_smem, by_regs))
    grid = min(wt.n // 16, sms * per_sm)
    y = cp.zeros((v.mb, wt.n), dtype=cp.float16)
    x = cp.ascontiguousarray(wt.x4[:v.mb])  # type: ignore[attr-defined]
    ref = wt.ref4[:v.mb]  # type: ignore[attr-defined]

    def launch(i: int) -> None:
        fn((grid,), (v.ks * 32,), (wt.w[i], wt.s[i], wt.b[i], x, y, np.int32(wt.n), np.int32(wt.k)), shared_mem=smem)

    launch(0)
    got = cp.asnumpy(y).astype(np.float64)
    err = float(np.max(np.abs(got - ref) / (2e-3 * np.sqrt(wt.k) + 2e-3 * np.abs(ref))))
    return {**asdict(v), "n": wt.n, "k": wt.k, "grid": grid, "per_sm_run": per_sm, "regs": fn.num_regs,
            "us": proto._time(cp, launch, len(wt.w), reps), "err_over_tol": err, "ok": err <= 1.0}


def measure(names: list[str], shapes: list[str], reps: int, group: int, out: Path) -> int:
    import cupy as cp
    import numpy as np

    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    sms = props["multiProcessorCount"]
    chip = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    print("device:", chip, "SMs", sms, "group", group, flush=True)
    rows: list[dict[str, Any]] = []
    stream_k = cp.RawModule(code=proto.SOURCE, options=("-DRT=1", "-DUNR=1", "-DBLOCK=128", "-DSUMCHUNK=0")
                            ).get_function("stream")
    out.mkdir(parents=True, exist_ok=True)
    for sname in shapes:
        n, k = proto.SHAPES[sname]
        wt = ring._weights(cp, np, n, k, group, mmax=8)
        sink = cp.zeros(1, dtype=cp.uint32)
        words = np.uint64(n * k // 32)
        stream_us = proto._time(cp, lambda i, wt=wt, words=words, sink=sink: stream_k(
            (sms * 4,), (512,), (wt.flat[i], words, sink)), len(wt.w), reps)
        print(f"{sname} {n}x{k}: stream of W {stream_us:.1f} us ({n * k / 2 / stream_us / 1e6:.2f} TB/s), "
              f"{len(wt.w)} copies", flush=True)
        for name in names:
            try:
                if name.startswith("l"):
                    row = _lean_row(cp, np, Lean.parse(name), wt, group, reps)
                elif name.startswith("p"):
                    row = _persistent_row(cp, np, Persistent.parse(name), wt, group, sms, reps)
                elif name.startswith("r"):
                    row = ring._ring_row(cp, np, ring.Ring.parse(name), wt, sms, reps)
                else:
                    row = proto._variant_row(cp, np, proto.Variant.parse(name), wt, sms, reps)
            except Exception as exc:  # a variant that fails is a row, not the end of the run
                row = {"name": name, "error": f"{type(exc).__name__}: {exc}"[:300], "us": float("nan")}
            row.update(shape=sname, group=group, stream_us=stream_us, chip=chip,
                       pct_of_stream=100.0 * stream_us / row["us"])
            rows.append(row)
            print(f"  {name:16s} grid {row.get('grid', 0):5d} regs {row.get('regs', '-')!s:>4}: {row['us']:7.1f} us "
                  f"({row['pct_of_stream']:5.1f} % of stream)  err/tol {row.get('err_over_tol', float('nan')):.3f}"
                  f"{'  ' + row['error'] if 'error' in row else ''}", flush=True)
            (out / f"gpu_core_lean_g{group}.json").write_text(json.dumps({"chip": chip, "rows": rows}, indent=1))
        wt.w = wt.s = wt.b = wt.flat = []
        cp.get_default_memory_pool().free_all_blocks()
    return 0


DEFAULT = ("a1u4b256p4s,l4u2m1,p8u2m1b2,p8u4m1b2,p4u4m1b4,p8u2m1b4,p16u2m1b1,p4u2m1b4,p8u2m4b2,p8u4m4b2,p4u4m4b4,"
           "p8u2m8b2")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--shapes", default="qkv,down,o,gate_up")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--group", type=int, default=64, choices=(32, 64, 128))
    ap.add_argument("--variants", default=DEFAULT)
    args = ap.parse_args()
    names = args.variants.split(",")
    if args.dry:
        return dry([Lean.parse(t) if t.startswith("l") else Persistent.parse(t) for t in names if t[0] in "lp"],
                   args.group)
    return measure(names, args.shapes.split(","), args.reps, args.group, args.out)


if __name__ == "__main__":
    sys.exit(main())

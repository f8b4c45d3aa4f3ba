"""Issue 35, a design question asked of the GPU before a template is written: can a 4-bit matrix-vector product laid
out like a streaming read (lanes side by side along K, each lane several 16-byte chunks in flight, a grid sized to
the chip, X staged once per block in shared memory) approach the streaming read of its bytes in a chain of
dependent calls, where the quad-layout core (templates/_lib) reaches 40-70 %?

M = 1, 4 bits, group 64, float16, MLX's layout; one matrix (no norm, no residual): the question is the loop's.
Each variant, ``quantized_matmul`` and the streaming read run as chains over 16 layers' weights (cold), interleaved;
each variant's output is checked against ``quantized_matmul``'s first.

    PYTHONPATH=/tmp/site:/tmp/site3 python3 benchmarks/gpu_gemv_proto.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx

from kernsearch.bench._decode import Paired, derive, interleaved, median, stream_reader

SOURCE = """
    constexpr int WR = {WR}, U = {U}, NW = {NW};
    const int K = X_shape[1], N = W_shape[0], KW = W_shape[1], NG = S_shape[1];
    const int CH = KW / 4, G = K / NG;
    __shared__ __align__(16) __half xs[{KMAX}];
    __shared__ float xsum[{KMAX} / 32];
    for (int i = threadIdx.x * 8; i < K; i += blockDim.x * 8) {{
        *reinterpret_cast<uint4*>(xs + i) = *reinterpret_cast<const uint4*>(X + i);
    }}
    __syncthreads();
    for (int c = threadIdx.x; c < CH; c += blockDim.x) {{  // each chunk's sum of x (the bias term)
        float s = 0.0f;
        for (int f = 0; f < 32; ++f) s += __half2float(xs[c * 32 + f]);
        xsum[c] = s;
    }}
    __syncthreads();
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const uint4* Wv = reinterpret_cast<const uint4*>(W);
    for (int row0 = (blockIdx.x * NW + w) * WR; row0 < N; row0 += gridDim.x * NW * WR) {{
        float acc[WR];
#pragma unroll
        for (int r = 0; r < WR; ++r) acc[r] = 0.0f;
        for (int c0 = 0; c0 < CH; c0 += 32 * U) {{
            uint4 wv[WR][U];
            float sc[WR][U], bi[WR][U];
#pragma unroll
            for (int r = 0; r < WR; ++r)
#pragma unroll
                for (int u = 0; u < U; ++u) {{
                    const int c = c0 + u * 32 + lane;
                    const int row = min(row0 + r, N - 1);
                    const bool ok = c < CH;
                    wv[r][u] = ok ? __ldg(Wv + (size_t)row * CH + c) : make_uint4(0u, 0u, 0u, 0u);
                    const int g = ok ? c * 32 / G : 0;
                    sc[r][u] = ok ? __half2float(S[(size_t)row * NG + g]) : 0.0f;
                    bi[r][u] = ok ? __half2float(Bq[(size_t)row * NG + g]) : 0.0f;
                }}
#pragma unroll
            for (int u = 0; u < U; ++u) {{
                const int c = c0 + u * 32 + lane;
                if (c >= CH) continue;
                float dot[WR];
#pragma unroll
                for (int r = 0; r < WR; ++r) dot[r] = 0.0f;
#pragma unroll
                for (int j = 0; j < 4; ++j) {{
                    const int wd = (j + (lane >> 1)) & 3;  // rotated: the warp's shared loads in 4 wavefronts
                    const uint4 xv = *reinterpret_cast<const uint4*>(xs + c * 32 + wd * 8);
                    const __half2* xh = reinterpret_cast<const __half2*>(&xv);
                    float xf[8];
#pragma unroll
                    for (int p = 0; p < 4; ++p) {{ const float2 t = __half22float2(xh[p]); xf[2 * p] = t.x; xf[2 * p + 1] = t.y; }}
#pragma unroll
                    for (int r = 0; r < WR; ++r) {{
                        const unsigned int word = wd == 0 ? wv[r][u].x : wd == 1 ? wv[r][u].y : wd == 2 ? wv[r][u].z : wv[r][u].w;
#pragma unroll
                        for (int f = 0; f < 8; ++f) {{
                            const float q = __uint_as_float(((word >> (4 * f)) & 0xFu) | 0x4B000000u) - 8388608.0f;
                            dot[r] = fmaf(q, xf[f], dot[r]);
                        }}
                    }}
                }}
#pragma unroll
                for (int r = 0; r < WR; ++r) acc[r] = fmaf(sc[r][u], dot[r], fmaf(bi[r][u], xsum[c], acc[r]));
            }}
        }}
#pragma unroll
        for (int r = 0; r < WR; ++r) {{
            float v = acc[r];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0 && row0 + r < N) Y[row0 + r] = __float2half(v);
        }}
    }}
"""

#: The same loop with half2 arithmetic: a word's eight 4-bit fields become four exact half2 pairs by one shift and
#: four LOP3s (fields placed under 1024's exponent; the high nibble of each byte read as 16·q and scaled by 1/16 in
#: the same FMA that takes 1024 off), multiplied with X's matching pairs (staged once per block, paired (k, k+4)
#: within each word) in half2, each word's products summed in float; the group's scale and bias applied per chunk.
SOURCE_H2 = """
    constexpr int WR = {WR}, U = {U}, NW = {NW};
    const int K = X_shape[1], N = W_shape[0], KW = W_shape[1], NG = S_shape[1];
    const int CH = KW / 4, G = K / NG;
    __shared__ __align__(16) __half2 xs[{KMAX} / 2];
    __shared__ float xsum[{KMAX} / 32];
    for (int i = threadIdx.x; i < K / 2; i += blockDim.x) {{  // pair (k, k + 4) of each word's eight values
        const int wdx = i / 4, p = i % 4;
        xs[i] = __halves2half2(X[wdx * 8 + p], X[wdx * 8 + p + 4]);
    }}
    __syncthreads();
    for (int c = threadIdx.x; c < CH; c += blockDim.x) {{
        float s = 0.0f;
        for (int f = 0; f < 16; ++f) {{ const float2 t = __half22float2(xs[c * 16 + f]); s += t.x + t.y; }}
        xsum[c] = s;
    }}
    __syncthreads();
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const uint4* Wv = reinterpret_cast<const uint4*>(W);
    const __half2 k1024 = __float2half2_rn(1024.0f), k16th = __float2half2_rn(0.0625f), km64 = __float2half2_rn(-64.0f);
    for (int row0 = (blockIdx.x * NW + w) * WR; row0 < N; row0 += gridDim.x * NW * WR) {{
        float acc[WR];
#pragma unroll
        for (int r = 0; r < WR; ++r) acc[r] = 0.0f;
        for (int c0 = 0; c0 < CH; c0 += 32 * U) {{
            uint4 wv[WR][U];
            float sc[WR][U], bi[WR][U];
#pragma unroll
            for (int r = 0; r < WR; ++r)
#pragma unroll
                for (int u = 0; u < U; ++u) {{
                    const int c = c0 + u * 32 + lane;
                    const int row = min(row0 + r, N - 1);
                    const bool ok = c < CH;
                    wv[r][u] = ok ? __ldg(Wv + (size_t)row * CH + c) : make_uint4(0u, 0u, 0u, 0u);
                    const int g = ok ? c * 32 / G : 0;
                    sc[r][u] = ok ? __half2float(S[(size_t)row * NG + g]) : 0.0f;
                    bi[r][u] = ok ? __half2float(Bq[(size_t)row * NG + g]) : 0.0f;
                }}
#pragma unroll
            for (int u = 0; u < U; ++u) {{
                const int c = c0 + u * 32 + lane;
                if (c >= CH) continue;
                float dot[WR];
#pragma unroll
                for (int r = 0; r < WR; ++r) dot[r] = 0.0f;
#pragma unroll
                for (int j = 0; j < 4; ++j) {{
                    const int wd = (j + (lane >> 1)) & 3;
                    const uint4 xv = *reinterpret_cast<const uint4*>(xs + (c * 4 + wd) * 4);
                    const __half2* x2 = reinterpret_cast<const __half2*>(&xv);
#pragma unroll
                    for (int r = 0; r < WR; ++r) {{
                        const unsigned int word = wd == 0 ? wv[r][u].x : wd == 1 ? wv[r][u].y : wd == 2 ? wv[r][u].z : wv[r][u].w;
                        const unsigned int hi = word >> 8;
                        unsigned int q0 = (word & 0x000F000Fu) | 0x64006400u, q1 = (word & 0x00F000F0u) | 0x64006400u;
                        unsigned int q2 = (hi & 0x000F000Fu) | 0x64006400u, q3 = (hi & 0x00F000F0u) | 0x64006400u;
                        const __half2 h0 = __hsub2(*reinterpret_cast<__half2*>(&q0), k1024);
                        const __half2 h1 = __hfma2(*reinterpret_cast<__half2*>(&q1), k16th, km64);
                        const __half2 h2 = __hsub2(*reinterpret_cast<__half2*>(&q2), k1024);
                        const __half2 h3 = __hfma2(*reinterpret_cast<__half2*>(&q3), k16th, km64);
                        __half2 a2 = __hmul2(h0, x2[0]);
                        a2 = __hfma2(h1, x2[1], a2);
                        a2 = __hfma2(h2, x2[2], a2);
                        a2 = __hfma2(h3, x2[3], a2);
                        const float2 f = __half22float2(a2);
                        dot[r] += f.x + f.y;
                    }}
                }}
#pragma unroll
                for (int r = 0; r < WR; ++r) acc[r] = fmaf(sc[r][u], dot[r], fmaf(bi[r][u], xsum[c], acc[r]));
            }}
        }}
#pragma unroll
        for (int r = 0; r < WR; ++r) {{
            float v = acc[r];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0 && row0 + r < N) Y[row0 + r] = __float2half(v);
        }}
    }}
"""


#: (half2?, rows per warp, chunks in flight per lane, warps per block, blocks per SM)
VARIANTS = [(False, 1, 2, 8, 4), (False, 2, 2, 4, 8), (True, 1, 2, 8, 4), (True, 2, 2, 8, 4), (True, 2, 1, 8, 8),
            (True, 4, 1, 8, 4), (True, 1, 4, 8, 4), (True, 2, 2, 4, 8), (True, 4, 2, 4, 8), (True, 2, 4, 8, 2)]


def make(wr: int, u: int, nw: int, bps: int, kmax: int, h2: bool = False) -> Any:
    source = (SOURCE_H2 if h2 else SOURCE).format(WR=wr, U=u, NW=nw, KMAX=kmax)
    kernel = mx.fast.cuda_kernel(name=f"proto_gemv{'_h2' if h2 else ''}_{wr}_{u}_{nw}_{bps}",
                                 input_names=["X", "W", "S", "Bq"], output_names=["Y"], source=source)
    sms = int(mx.device_info().get("multi_processor_count", 132) or 132)

    def call(x: Any, w: Any, s: Any, b: Any) -> Any:
        n = w.shape[0]
        blocks = min(-(-n // (nw * wr)), sms * bps)
        return kernel(inputs=[x, w, s, b], grid=(blocks * 32 * nw, 1, 1), threadgroup=(32 * nw, 1, 1),
                      output_shapes=[(1, n)], output_dtypes=[mx.float16])[0]

    return call


def run_shape(n: int, k: int, layers: int, rounds: int, read: Any) -> dict[str, Any]:
    """Every variant, the op and the streaming read of one shape, as chains over ``layers`` weight sets."""
    mats = []
    for i in range(layers):
        w = (0.02 * mx.random.normal((n, k), key=mx.random.key(i))).astype(mx.float16)
        mats.append(mx.quantize(w, group_size=64, bits=4))
        mx.eval(mats[-1])
    flats = [mx.zeros((n * k // 8 + n * k // 16,), dtype=mx.uint32) + i for i in range(layers)]
    mx.eval(flats)
    x0 = (0.5 * mx.random.normal((1, k), key=mx.random.key(99))).astype(mx.float16)
    variants = {f"{'h2' if h2 else 'f32'} WR={wr},U={u},NW={nw},BPS={bps}": make(wr, u, nw, bps, 11008, h2)
                for h2, wr, u, nw, bps in VARIANTS}
    errs = {}
    ref = mx.quantized_matmul(x0, *mats[0], transpose=True, group_size=64, bits=4)
    for name, fn in variants.items():
        got = fn(x0, *mats[0])
        errs[name] = float(mx.max(mx.abs(got.astype(mx.float32) - ref.astype(mx.float32))).item())

    def chain(step: Any) -> Any:
        def run() -> Any:
            x = x0
            for q in mats:
                x = derive(mx, step(x, q), k)
            return x
        return run

    forms = {"op": chain(lambda x, q: mx.quantized_matmul(x, *q, transpose=True, group_size=64, bits=4))}
    for name, fn in variants.items():
        forms[name] = chain(lambda x, q, fn=fn: fn(x, *q))

    def stream() -> Any:
        d = mx.zeros((1,), dtype=mx.uint32)
        for f in flats:
            d = read(f, d)
        return d

    forms["stream"] = stream
    t = interleaved(mx, forms, rounds)
    per = 1e3 / layers
    row = {"op_us": median(t["op"]) * per, "stream_us": median(t["stream"]) * per, "variants": {}}
    print(f"{n}x{k}: op {row['op_us']:.1f} us, stream {row['stream_us']:.1f} us", flush=True)
    for name in variants:
        p = Paired.of(t["op"], t[name])
        us = p.new_ms * per
        row["variants"][name] = {"us": us, "speedup": p.speedup, "low": p.low, "high": p.high,
                                 "pct_of_stream": 100 * row["stream_us"] / us, "max_abs_err": errs[name]}
        print(f"   {us:7.1f} us {p.speedup:.2f}x ({p.low:.2f}-{p.high:.2f}) {100 * row['stream_us'] / us:.0f}% "
              f"of stream, err {errs[name]:.3g}  {name}", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=25)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    read = stream_reader(mx, "cuda")
    result: dict[str, Any] = {"device": mx.device_info().get("device_name", "?"), "shapes": {}}
    for n, k in ((12288, 4096), (11008, 4096), (4096, 11008)):
        result["shapes"][f"{n}x{k}"] = run_shape(n, k, a.layers, a.rounds, read)
        (a.out / "gpu_gemv_proto.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

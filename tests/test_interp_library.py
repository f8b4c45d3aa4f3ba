"""What issue 14 lists by name runs with the values Metal gives, in fast and check mode: MLX's preamble in one
body with an empty header, the math library (gap 5), macros and literals (4), matrix arithmetic (2), votes,
shuffle-and-fill and prefix products (7), vector comparisons, integer-vector bit operations, .rgba,
multi-dimensional threadgroup arrays, range-for and volatile threadgroup pointers (8)."""

from __future__ import annotations

import numpy as np
import pytest

from kernsearch import KernelSource
from kernsearch.interp import run_kernel

MODES = ["fast", "check"]


def run(src: str, inputs: dict[str, np.ndarray], outputs: dict[str, tuple[int, ...]], mode: str, grid: int = 64,
        tg: int = 64, out_dtype: str = "float32", input_dtypes: list[str | None] | None = None) -> list[np.ndarray]:
    k = KernelSource("lib", "metal", tuple(inputs), tuple(outputs), "", src)
    r = run_kernel(k, (grid, 1, 1), (tg, 1, 1), list(outputs.values()), [out_dtype] * len(outputs),
                   list(inputs.values()), "float32", mode=mode, input_dtypes=input_dtypes)
    assert [d for d in r.diagnostics if d.severity == "error"] == []
    return r.outputs


@pytest.mark.parametrize("mode", MODES)
def test_mlx_preamble_names_in_one_body_with_an_empty_header(mode):
    src = """
  uint i = thread_position_in_grid.x;
  float v = simd_sum(inp[i]);                                   // simd function, no metal:: needed
  float f = floor(inp[i] * 3.0f);                               // unqualified math
  uint bits = as_type<uint>(inp[i]);                            // bit cast
  auto loc = elem_to_loc(i, inp_shape, inp_strides, inp_ndim);  // MLX helpers
  int blocks = ceildiv(int(i) + 1, 8);
  float lo = Limits<float>::min, hi = Limits<int>::max;
  out[i * 8 + 0] = v;
  out[i * 8 + 1] = f;
  out[i * 8 + 2] = float(bits >> 16);
  out[i * 8 + 3] = float(loc);
  out[i * 8 + 4] = float(blocks);
  out[i * 8 + 5] = float(isinf(lo) && lo < 0.0f);
  out[i * 8 + 6] = hi;
  out[i * 8 + 7] = float(WorkPerThread<half>::n * 10 + WorkPerThread<float>::n);
"""
    x = (np.arange(64, dtype=np.float32) - 20.0) / 7.0
    (out,) = run(src, {"inp": x}, {"out": (64, 8)}, mode)
    i = np.arange(64)
    want = np.stack([np.where(i < 32, x[:32].sum(), x[32:].sum()), np.floor(x * np.float32(3.0)),
                     (x.view(np.uint32) >> 16).astype(np.float64), i, (i + 8) // 8, np.ones(64),
                     np.full(64, 2.0 ** 31), np.full(64, 42.0)], axis=1)
    np.testing.assert_allclose(out, want, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_math_library_and_macros(mode):
    src = """
  uint i = thread_position_in_grid.x;
  float a = x[i], b = y[i];
  device float* o = out + i * 24;
  o[0] = sinh(a); o[1] = cosh(a); o[2] = atan2(a, b); o[3] = atan(a); o[4] = asin(a); o[5] = acos(a);
  o[6] = rint(a * 5.0f); o[7] = fmod(a * 7.0f, b); o[8] = copysign(b, a); o[9] = sign(a);
  o[10] = fract(a * 3.0f); o[11] = step(0.0f, a); o[12] = saturate(a * 2.0f); o[13] = log10(b);
  o[14] = ldexp(a, 3); o[15] = metal::fmax3(a, b, 1.25f); o[16] = metal::precise::atan2(b, a);
  float c; float s = sincos(a, c); o[17] = s + 2.0f * c;
  float2 v = sinh(float2(a, b)); o[18] = v.y;
  o[19] = metal::fast::step(b, 2.0f);
  o[20] = float(INFINITY > FLT_MAX) + 2.0f * float(isnan(NAN)) + 4.0f * float(1.0h + 0.5h == 1.5h);
  o[21] = M_PI_F;
  o[22] = float(fract(float2(a, -a)).y);
  o[23] = sign(float4(a, -a, 0.0f, b)).y;
"""
    r = np.random.default_rng(14)
    a = r.uniform(-0.9, 0.9, 64).astype(np.float32)
    b = r.uniform(0.5, 3.0, 64).astype(np.float32)
    (out,) = run(src, {"x": a, "y": b}, {"out": (64, 24)}, mode)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = np.stack([np.sinh(a64), np.cosh(a64), np.arctan2(a64, b64), np.arctan(a64), np.arcsin(a64),
                     np.arccos(a64), np.rint(a * np.float32(5)), np.fmod(a * np.float32(7), b), np.copysign(b64, a64),
                     np.sign(a64), a * np.float32(3) - np.floor(a * np.float32(3)), (a64 >= 0).astype(float),
                     np.clip(a64 * 2, 0, 1), np.log10(b64), a64 * 8, np.maximum(b64, 1.25), np.arctan2(b64, a64),
                     np.sin(a64) + 2 * np.cos(a64), np.sinh(b64), (2.0 >= b64).astype(float), np.full(64, 7.0),
                     np.full(64, np.pi), -a64 - np.floor(-a64), -np.sign(a64)], axis=1)
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("mode", MODES)
def test_matrix_types_and_arithmetic(mode):
    src = """
  uint i = thread_position_in_grid.x;
  if (i != 0) return;
  float4x4 A, B;
  for (int c = 0; c < 4; ++c) for (int r = 0; r < 4; ++r) { A[c][r] = m[c * 4 + r]; B[c][r] = m[16 + c * 4 + r]; }
  float4x4 C = A * B + 2.0f * A - B * 0.5f;
  half4x4 H = half4x4(C);
  matrix<float, 3, 2> N = matrix<float, 3, 2>(float2(1, 2), float2(3, 4), float2(5, 6));
  float2 nv = N * float3(1.0f, 10.0f, 100.0f);
  for (int c = 0; c < 4; ++c) for (int r = 0; r < 4; ++r) { out[c * 4 + r] = C[c][r]; out[16 + c * 4 + r] = float(H[c][r]); }
  out[32] = nv.x; out[33] = nv.y;
"""
    r = np.random.default_rng(2)
    mats = r.standard_normal(32).astype(np.float32)
    (out,) = run(src, {"m": mats}, {"out": (34,)}, mode, grid=1, tg=1)
    # column-major: A[c][r] is column c, row r, so the NumPy matrix is the transpose of the storage
    A, B = mats[:16].reshape(4, 4).T.astype(np.float64), mats[16:].reshape(4, 4).T.astype(np.float64)
    C = A @ B + 2 * A - 0.5 * B
    np.testing.assert_allclose(out[:16], C.T.reshape(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[16:32], C.T.reshape(-1).astype(np.float16), rtol=1e-3, atol=1e-3)
    assert out[32:].tolist() == [531.0, 642.0]


@pytest.mark.parametrize("mode", MODES)
def test_votes_shuffle_and_fill_and_prefix_products(mode):
    src = """
  uint simd_lid = thread_index_in_simdgroup, simdgroup_id = simdgroup_index_in_threadgroup;
  uint i = thread_position_in_grid.x;
  float v = x[i];
  device float* o = out + i * 7;
  o[0] = float(simd_all(v > 0.0f));
  o[1] = float(simd_any(v > 40.0f));
  o[2] = simd_shuffle_and_fill_up(v, -v, ushort(3));
  o[3] = simd_shuffle_and_fill_down(v, -v, ushort(5));
  o[4] = simd_prefix_inclusive_product(simd_lid < 6 ? 2.0f : 1.0f);
  o[5] = simd_prefix_exclusive_product(simd_lid < 6 ? 2.0f : 1.0f);
  o[6] = simd_broadcast_first(v) + 100.0f * float(simdgroup_id);
"""
    x = np.arange(64, dtype=np.float32)  # lane 0 of simdgroup 0 holds 0: simd_all(v > 0) is false there only
    (out,) = run(src, {"x": x}, {"out": (64, 7)}, mode)
    for g in range(2):
        lanes = np.arange(32)
        v = x[g * 32:(g + 1) * 32]
        up = np.where(lanes >= 3, v[(lanes - 3) % 32], -v[(lanes + 29) % 32])
        down = np.where(lanes + 5 < 32, v[(lanes + 5) % 32], -v[(lanes + 5) % 32])
        want = np.stack([np.full(32, float(g == 1)), np.full(32, float(g == 1)), up, down,
                         2.0 ** np.minimum(lanes + 1, 6), 2.0 ** np.minimum(lanes, 6), np.full(32, v[0] + 100 * g)],
                        axis=1)
        assert out[g * 32:(g + 1) * 32].tolist() == want.tolist(), g


@pytest.mark.parametrize("mode", MODES)
def test_vector_relations_bit_operations_swizzles_and_threadgroup_forms(mode):
    src = """
  threadgroup float cube[2][4][8];
  threadgroup int flags[64];
  uint t = thread_index_in_threadgroup;
  cube[t / 32][(t / 8) % 4][t % 8] = x[t];
  volatile threadgroup int* vf = flags;
  vf[t] = int(t) * 3;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float4 v = float4(x[t], -x[t], cube[1 - t / 32][(t / 8) % 4][t % 8], 0.5f);
  bool4 gt = v > 0.5f;
  int4 k = int4(int(t), 0x0f0f, -8, 255);
  int4 bits = (k & int4(6)) | (k << 2) ^ ~k;
  float4 rgba = v.bgra;
  float picked = select(v, float4(7.0f), v < float4(1.0f)).x;
  float vals[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  float acc = 0.0f;
  for (float e : vals) acc += e * v.a;
  device float* o = out + t * 8;
  o[0] = float(any(gt)); o[1] = float(all(gt.xw)); o[2] = float(bits.x); o[3] = float((k >> 1).z % 3);
  o[4] = rgba.r + 10.0f * rgba.a; o[5] = picked; o[6] = acc; o[7] = float(vf[(t + 1) % 64]);
"""
    x = np.arange(64, dtype=np.float32) / 16.0
    (out,) = run(src, {"x": x}, {"out": (64, 8)}, mode)
    t = np.arange(64)
    other = x[(t + 32) % 64]  # cube[1 - t/32] holds the other half's value
    v = np.stack([x, -x, other, np.full(64, 0.5)], axis=1)
    k = np.stack([t, np.full(64, 0x0F0F), np.full(64, -8), np.full(64, 255)], axis=1)
    bits = (k & 6) | ((k << 2) ^ ~k)
    want = np.stack([(v > 0.5).any(axis=1), (v[:, 0] > 0.5) & (v[:, 3] > 0.5), bits[:, 0],
                     np.fmod(-8 >> 1, 3) * np.ones(64), other + 10 * 0.5, np.where(x < 1, 7.0, x), 10 * 0.5 * np.ones(64),
                     ((t + 1) % 64) * 3], axis=1).astype(np.float64)
    assert out.tolist() == want.astype(np.float32).tolist()


@pytest.mark.parametrize("mode", MODES)
def test_swizzles_read_as_vectors_and_assign_through_references(mode):
    # Read swizzles are vector values (templates deduce them: length(v.xy), v.xy * s, dot(a.xyz, b.xyz));
    # assigned swizzles write into the vector, of a thread variable or of a threadgroup element.
    src = """
  threadgroup float4 tile[4];
  uint t = thread_index_in_threadgroup;
  float4 v = float4(1.0f, 2.0f, 3.0f, 4.0f);
  v.xy = v.yx;
  v.zw += 10.0f;
  v.rg *= float2(3.0f, 5.0f);
  v.ba -= v.rg;
  int4 k = int4(1, 2, 3, 4);
  k.yz <<= 1;
  k.xw ^= 3;
  tile[t].xy = float2(float(t), 1.0f);
  tile[t].zw = 2.0f;
  tile[t].yz += float2(10.0f, 20.0f);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  device float* o = out + t * 8;
  o[0] = length(v.xy - float2(6.0f, 1.0f));
  o[1] = dot(v.xyz, float3(1.0f, 10.0f, 100.0f));
  o[2] = (2.0f * v.ba).y + (-v.xy)[1];
  o[3] = float(all(v.xw > 5.0f)) + 2.0f * float(any(v.xy == v.zw));
  o[4] = cross(v.xyz, v.yzx).z;
  o[5] = float(k.x + 10 * k.y + 100 * k.z + 1000 * k.w);
  o[6] = dot(tile[(t + 1) % 4].xyz, float3(1.0f, 10.0f, 100.0f));
  o[7] = sinh(tile[t].zw).x;
"""
    (out,) = run(src, {"x": np.zeros(1, np.float32)}, {"out": (4, 8)}, mode, grid=4, tg=4)
    v = np.array([6.0, 5.0, 7.0, 9.0])  # (1,2,3,4) -> yx -> zw+10 -> rg*(3,5) -> ba-rg
    t = np.arange(4)
    row = [np.hypot(0.0, 4.0), v[:3] @ [1, 10, 100], 2 * v[3] - v[1], 1 + 0, np.cross(v[:3], v[[1, 2, 0]])[2],
           2 + 40 + 600 + 7000]
    want = np.stack([np.tile(row, (4, 1)).T[k] for k in range(6)]
                    + [(t + 1) % 4 + 110 + 2200, np.full(4, np.sinh(22.0))], axis=1)
    np.testing.assert_allclose(out, want, rtol=1e-6)

"""Language points third-party Metal uses: packed vectors with members, MLX's utilities (constant-expression Limits,
cast_to, complex64_t, elem_to_loc_2_nd, LoopedElemToLoc), rows of 2-D threadgroup arrays passed to helpers, vector
components of threadgroup elements, float atomics through a cast of a device float* (fast and check mode)."""

from __future__ import annotations

import numpy as np
import pytest

from kernsearch import KernelSource
from kernsearch.interp import run_kernel


def run(src: str, inputs: dict[str, np.ndarray], n: int, mode: str, header: str = "", out_dtype: str = "float32",
        **kw):  # noqa: ANN201
    k = KernelSource("lang", "metal", tuple(inputs), ("out",), header, src)
    r = run_kernel(k, (n, 1, 1), (n, 1, 1), [(n,)], [out_dtype], list(inputs.values()), "float32", mode=mode, **kw)
    assert [d for d in r.diagnostics if d.severity == "error"] == []
    return r.outputs[0]


@pytest.mark.parametrize("mode", ["fast", "check"])
def test_packed_vectors_have_members_swizzles_and_arithmetic(mode):
    src = """
    uint i = thread_position_in_grid.x;
    const device packed_float3* p = (const device packed_float3*) xyz;
    packed_float3 v = p[i];
    v.y += 1.0f;
    v.xz = float2(v.z, v.x);
    threadgroup packed_float3 tile[8];
    tile[i] = v;
    tile[i].x *= 2.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const packed_float3 w = tile[7 - i];
    float3 s = v + w;
    out[i] = dot(s, float3(1.0f, 10.0f, 100.0f)) + length(w - w) + float(sizeof(packed_float3)) + w.g;
"""
    xyz = np.arange(24.0)
    got = run(src, {"xyz": xyz}, 8, mode)
    v = xyz.reshape(8, 3).copy()
    v[:, 1] += 1
    v[:, [0, 2]] = v[:, [2, 0]]
    w = v.copy()
    w[:, 0] *= 2
    w = w[::-1]
    want = (v + w) @ np.array([1, 10, 100]) + 12 + w[:, 1]
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("mode", ["fast", "check"])
def test_mlx_utilities(mode):
    """Limits<T> in constant expressions (half and bfloat16 too), cast_to, complex64_t, elem_to_loc_2_nd and
    LoopedElemToLoc as MLX's utils.h gives them to a metal_kernel body."""
    header = """
template <typename T> struct Lowest { static constexpr T value = Limits<T>::min; };
constexpr float kFloatMin = Lowest<float>::value;
static_assert(Limits<int>::max == 2147483647 && Limits<uint8_t>::min == 0, "integer limits");
static_assert(float(Limits<bfloat16_t>::finite_max) > 3e38f && float(Limits<half>::finite_max) == 65504.0f, "");
"""
    src = """
    uint i = thread_position_in_grid.x;
    float m = kFloatMin;
    m = max(m, x[i]);
    complex64_t z = complex64_t(x[i], 1.0f) * complex64_t(0.0f, 1.0f);  // i * (x + i) = -1 + x i
    const int shape[3] = {2, 2, 2};
    const int64_t as[3] = {4, 2, 1}, bs[3] = {0, 1, 0};
    const auto loc = elem_to_loc_2_nd(uint3(i % 2, (i / 2) % 2, i / 4), shape, as, bs, 3);
    LoopedElemToLoc<2, int64_t> walk(2);
    const int rshape[2] = {2, 3};
    const int64_t rstrides[2] = {10, 1};
    walk.next(int(i), rshape, rstrides);
    out[i] = m + cast_to<float>(half(z.real)) + 10.0f * z.imag + 100.0f * float(loc.x) + 1000.0f * float(loc.y)
             + 10000.0f * float(walk.location());
"""
    x = np.arange(8.0) - 3
    got = run(src, {"x": x}, 8, mode, header=header)
    i = np.arange(8)
    walk = np.where(i < 6, (i // 3) * 10 + i % 3, 0)  # LoopedElemToLoc wraps past its 2x3 shape
    want = x - 1 + 10 * x + 100 * i + 1000 * ((i // 2) % 2) + 10000 * walk
    np.testing.assert_allclose(got[:6], want[:6])


@pytest.mark.parametrize("mode", ["fast", "check"])
def test_rows_of_a_2d_threadgroup_array_and_components_of_its_vectors(mode):
    header = "inline void put(threadgroup float2 (*rows)[9], uint r, uint c, float v) { rows[r][c] = float2(v, -v); }\n"
    src = """
    threadgroup float2 tile[8][9];
    uint t = thread_index_in_threadgroup;
    put(tile, t / 8, t % 8, x[t]);
    tile[t / 8][t % 8][1] += 100.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[t] = tile[t % 8][t / 8][0] + tile[t % 8][t / 8].y;
"""
    x = np.arange(64.0)
    got = run(src, {"x": x}, 64, mode, header=header)
    t = np.arange(64)
    src_idx = (t % 8) * 8 + t // 8
    np.testing.assert_array_equal(got, x[src_idx] + (100 - x[src_idx]))


@pytest.mark.parametrize("mode", ["fast", "check"])
def test_float_atomics_through_a_cast_of_a_device_float_pointer(mode):
    src = """
    uint i = thread_position_in_grid.x;
    atomic_fetch_add_explicit((device atomic<float>*) &out[idx[i]], x[i], memory_order_relaxed);
"""
    x = np.linspace(-1, 1, 64)
    idx = (np.arange(64) * 7 % 5).astype(np.uint32)
    got = run(src, {"x": x, "idx": idx}, 64, mode, init_value=0.0, input_dtypes=["float32", "uint32"])
    want = np.bincount(idx, weights=x.astype(np.float32), minlength=64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

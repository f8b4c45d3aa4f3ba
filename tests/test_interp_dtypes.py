"""Inputs of different dtypes in one kernel, exact integer buffers of every width, and atomics."""

from __future__ import annotations

import numpy as np
import pytest

from kernsearch import KernelSource
from kernsearch.interp import run_kernel

HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"


def kern(source: str, inputs: tuple[str, ...], outputs: tuple[str, ...] = ("out",), header: str = HEADER,
         template: tuple = ()) -> KernelSource:
    return KernelSource(name="t", target="metal", input_names=inputs, output_names=outputs, header=header,
                        source=source, template=template)


@pytest.mark.parametrize("mode", ["fast", "check"])
def test_q4_matvec_reads_uint32_words_beside_float16_scales_and_a_float32_vector(mode):
    # 4-bit weights packed 8 per uint32 word, one float16 scale and bias per group of 32, float32 x.
    rows, cols, group = 8, 64, 32
    rng = np.random.default_rng(1)
    q = rng.integers(0, 16, size=(rows, cols)).astype(np.uint32)
    words = np.zeros((rows, cols // 8), dtype=np.uint32)
    for k in range(8):
        words |= q[:, k::8] << np.uint32(4 * k)
    scales = rng.standard_normal((rows, cols // group)).astype(np.float16)
    biases = rng.standard_normal((rows, cols // group)).astype(np.float16)
    x = rng.standard_normal(cols).astype(np.float32) * np.float32(1.0 + 1e-6)  # not a float16 value
    src = """
    uint row = threadgroup_position_in_grid.x;
    uint lane = thread_index_in_simdgroup;
    float acc = 0.0f;
    for (uint w = lane; w < COLS / 8; w += 32) {
      uint word = w_q[row * (COLS / 8) + w];
      for (uint k = 0; k < 8; ++k) {
        uint col = w * 8 + k;
        float s = float(scales[row * (COLS / GROUP) + col / GROUP]);
        float b = float(biases[row * (COLS / GROUP) + col / GROUP]);
        acc += (s * float((word >> (4 * k)) & 0xfu) + b) * x[col];
      }
    }
    acc = simd_sum(acc);
    if (lane == 0) out[row] = acc;
"""
    header = HEADER + f"constant constexpr uint COLS = {cols};\nconstant constexpr uint GROUP = {group};\n"
    k = kern(src, ("w_q", "scales", "biases", "x"), header=header)
    r = run_kernel(k, (32 * rows, 1, 1), (32, 1, 1), [(rows,)], ["float32"], [words, scales, biases, x], "float16",
                   input_dtypes=["uint32", "float16", "float16", "float32"], mode=mode)
    assert "const device uint32_t* w_q" in r.kernel_text
    assert "const device float16_t* scales" in r.kernel_text and "const device float* x" in r.kernel_text
    deq = (scales.astype(np.float32).repeat(group, 1) * q + biases.astype(np.float32).repeat(group, 1))
    np.testing.assert_allclose(r.outputs[0], deq @ x, rtol=1e-5, atol=1e-4)
    assert not [d for d in r.diagnostics if d.severity == "error"]


def test_default_rule_is_unchanged_float_inputs_take_the_kernel_dtype():
    k = kern("uint i = thread_position_in_grid.x; out[i] = float(a[i]);", ("a",))
    a = np.array([1.0 + 2 ** -12] * 4)
    r = run_kernel(k, (4, 1, 1), (4, 1, 1), [(4,)], ["float32"], [a], "float16")
    assert "const constant float16_t* a" in r.kernel_text
    assert r.outputs[0][0] == np.float32(np.float16(a[0]))


@pytest.mark.parametrize("np_type,name", [(np.int8, "int8_t"), (np.uint8, "uint8_t"), (np.int16, "int16_t"),
                                          (np.uint16, "uint16_t"), (np.uint64, "uint64_t"), (np.int64, "int64_t")])
def test_integer_buffers_keep_their_width_and_values(np_type, name):
    info = np.iinfo(np_type)
    a = np.array([info.min, info.max, 0, 1, info.max - 1, info.min + 1, 7, 100 % info.max], dtype=np_type)
    k = kern("uint i = thread_position_in_grid.x; out[i] = a[i]; bits[i] = uint(sizeof(a[0]));", ("a",),
             ("out", "bits"))
    mlx_name = np.dtype(np_type).name
    r = run_kernel(k, (8, 1, 1), (8, 1, 1), [(8,), (8,)], [mlx_name, "uint32"], [a], "float32")
    assert f"const device {name}* a" in r.kernel_text
    assert r.outputs[0].dtype == np_type and np.array_equal(r.outputs[0], a)
    assert set(r.outputs[1].tolist()) == {np.dtype(np_type).itemsize}


def test_values_an_integer_dtype_cannot_hold_are_refused_not_wrapped():
    k = kern("out[0] = a[0];", ("a",))
    with pytest.raises(ValueError, match="outside the range of int8"):
        run_kernel(k, (1, 1, 1), (1, 1, 1), [(1,)], ["int8"], [np.array([300, 1])], "float32",
                   input_dtypes=["int8"])
    with pytest.raises(ValueError, match="non-integer"):
        run_kernel(k, (1, 1, 1), (1, 1, 1), [(1,)], ["int8"], [np.array([0.5, 1])], "float32",
                   input_dtypes=["int8"])


def test_integer_outputs_unwritten_are_poisoned_not_nan_cast():
    k = kern("uint i = thread_position_in_grid.x; if (i == 0) out[i] = 5;", ("a",))
    r = run_kernel(k, (4, 1, 1), (4, 1, 1), [(4,)], ["uint8"], [np.zeros(4, np.int32)], "float32")
    assert r.outputs[0].tolist() == [5, 255, 255, 255]


@pytest.mark.parametrize("mode", ["fast", "check"])
def test_histogram_with_device_and_threadgroup_atomics(mode):
    bins, n = 16, 1000
    vals = np.random.default_rng(2).integers(0, bins, size=n).astype(np.uint8)
    src = """
    threadgroup atomic_uint local[BINS];
    uint t = thread_index_in_threadgroup;
    if (t < BINS) atomic_store_explicit(&local[t], 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint i = thread_position_in_grid.x;
    if (i < N) atomic_fetch_add_explicit(&local[v[i]], 1u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (t < BINS) atomic_fetch_add_explicit(&hist[t], atomic_load_explicit(&local[t], memory_order_relaxed),
                                            memory_order_relaxed);
"""
    header = HEADER + f"constant constexpr uint BINS = {bins};\nconstant constexpr uint N = {n};\n"
    k = kern(src, ("v",), ("hist",), header=header)
    r = run_kernel(k, (1024, 1, 1), (128, 1, 1), [(bins,)], ["uint32"], [vals], "float32", init_value=0,
                   atomic_outputs=True, mode=mode)
    assert "device atomic<uint32_t>* hist" in r.kernel_text
    assert r.outputs[0].tolist() == np.bincount(vals, minlength=bins).tolist()
    assert r.diagnostics == []


def test_split_k_gemm_accumulates_with_atomic_float():
    m, n, kk, splits = 4, 4, 64, 4
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((m, kk)), rng.standard_normal((kk, n))
    src = """
    uint col = thread_position_in_grid.x, row = thread_position_in_grid.y, split = thread_position_in_grid.z;
    float acc = 0.0f;
    for (uint k = split * (K / S); k < (split + 1) * (K / S); ++k) acc += A[row * K + k] * B[k * N + col];
    atomic_fetch_add_explicit(&C[row * N + col], acc, memory_order_relaxed);
"""
    header = HEADER + f"constant constexpr uint K = {kk};\nconstant constexpr uint N = {n};\n" \
                      f"constant constexpr uint S = {splits};\n"
    k = kern(src, ("A", "B"), ("C",), header=header)
    r = run_kernel(k, (n, m, splits), (n, m, 1), [(m, n)], ["float32"], [a, b], "float32", init_value=0.0,
                   atomic_outputs=True)
    np.testing.assert_allclose(r.outputs[0], a @ b, rtol=1e-5, atol=1e-5)


def test_compare_exchange_max_and_threadgroup_scalar_counter():
    src = """
    threadgroup atomic_int count;
    threadgroup float total;
    uint t = thread_index_in_threadgroup;
    if (t == 0) { atomic_store_explicit(&count, 0, memory_order_relaxed); total = 0.0f; }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (a[t] > 0) atomic_fetch_add_explicit(&count, 1, memory_order_relaxed);
    int expected = atomic_load_explicit(&mx[0], memory_order_relaxed);
    while (a[t] > expected &&
           !atomic_compare_exchange_weak_explicit(&mx[0], &expected, a[t], memory_order_relaxed,
                                                  memory_order_relaxed)) {}
    atomic_fetch_min_explicit(&mx[1], a[t], memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (t == 0) atomic_store_explicit(&mx[2], atomic_load_explicit(&count, memory_order_relaxed),
                                      memory_order_relaxed);
"""
    a = np.array([3, -7, 12, 0, 5, -2, 9, 1], dtype=np.int32)
    k = kern(src, ("a",), ("mx",))
    for mode in ("fast", "check"):
        r = run_kernel(k, (8, 1, 1), (8, 1, 1), [(3,)], ["int32"], [a], "float32", init_value=0, mode=mode,
                       atomic_outputs=True)
        assert r.outputs[0].tolist() == [12, -7, 5], mode
        assert r.diagnostics == [], mode

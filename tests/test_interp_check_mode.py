"""Check mode compiles what fast mode runs: threadgroup elements passed to collectives and math, compound
assignment from them, vector elements read through them; the two modes agree."""

from __future__ import annotations

import numpy as np
import pytest

from kernsearch import KernelSource
from kernsearch.interp import run_kernel

SRC = """
  threadgroup float tile[64];
  threadgroup float4 v4[4];
  uint t = thread_index_in_threadgroup;
  tile[t] = a[t];
  if (t < 4) v4[t] = float4(float(t), 1.0f, 2.0f, 3.0f);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float s = simd_sum(tile[t]);
  float m = max(tile[t], tile[63 - t]);
  float acc = 0.0f;
  for (uint k = 0; k < 4; ++k) acc += tile[k];
  float4 w = v4[t % 4];
  out[t] = s + m + acc + w.x + exp(tile[0]);
"""


@pytest.mark.parametrize("mode", ["fast", "check"])
def test_threadgroup_elements_in_collectives_math_and_compound_assignment(mode):
    k = KernelSource("chk", "metal", ("a",), ("out",), "", SRC)
    a = np.arange(64.0)
    r = run_kernel(k, (64, 1, 1), (64, 1, 1), [(64,)], ["float32"], [a], "float32", mode=mode)
    t = np.arange(64)
    sums = np.where(t < 32, np.arange(32).sum(), np.arange(32, 64).sum())
    expected = sums + np.maximum(t, 63 - t) + 6 + (t % 4) + 1
    assert r.outputs[0].tolist() == expected.astype(np.float32).tolist()
    assert r.diagnostics == []


@pytest.mark.parametrize("mode", ["fast", "check"])
def test_components_of_threadgroup_vectors_read_and_written(mode):
    src = """
  threadgroup float4 acc[32];
  uint t = thread_index_in_threadgroup;
  acc[t].x = a[t];
  acc[t].y = 2.0f * a[t];
  acc[t].z = 0.0f;
  acc[t].w = 1.0f;
  acc[t].z += acc[t].x + acc[t].y;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[t] = acc[31 - t].z + acc[t].w;
"""
    k = KernelSource("comp", "metal", ("a",), ("out",), "", src)
    a = np.arange(32.0)
    r = run_kernel(k, (32, 1, 1), (32, 1, 1), [(32,)], ["float32"], [a], "float32", mode=mode)
    assert r.outputs[0].tolist() == (3 * a[::-1] + 1).tolist()
    assert r.diagnostics == []


def test_component_race_is_still_a_race():
    """Thread t reads the component thread t + 32 (another simdgroup) writes, with no barrier."""
    src = """
  threadgroup float4 acc[64];
  uint t = thread_index_in_threadgroup;
  acc[t].x = a[t];
  out[t] = acc[(t + 32) % 64].x;
"""
    k = KernelSource("comprace", "metal", ("a",), ("out",), "", src)
    r = run_kernel(k, (64, 1, 1), (64, 1, 1), [(64,)], ["float32"], [np.arange(64.0)], "float32", mode="check")
    assert any(d.kind in ("race", "uninitialized") and d.severity == "error" for d in r.diagnostics), r.diagnostics


@pytest.mark.parametrize("mode", ["fast", "check"])
def test_an_error_inside_the_shim_names_the_kernel_line(mode):
    from kernsearch._errors import VariantFailure

    src = "uint t = thread_position_in_grid.x;\nfloat x = a[t];\nout[t] = as_type<float>(half(x));\n"
    k = KernelSource("shimerr", "metal", ("a",), ("out",), "", src)
    with pytest.raises(VariantFailure) as exc:
        run_kernel(k, (4, 1, 1), (4, 1, 1), [(4,)], ["float32"], [np.zeros(4)], "float32", mode=mode)
    # no header; "[[kernel]] void ...(" and 3 parameter lines (a, out, thread_position_in_grid): body line 3 is 7
    assert exc.value.detail.startswith("line 7:") and "as_type" in exc.value.detail, exc.value.detail


@pytest.mark.parametrize("mode", ["fast", "check"])
def test_range_for_over_a_threadgroup_array(mode):
    src = """
  threadgroup float buf[16];
  uint t = thread_index_in_threadgroup;
  buf[t] = a[t];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float s = 0.0f;
  for (float x : buf) s += x;
  out[t] = s;
"""
    k = KernelSource("rangefor", "metal", ("a",), ("out",), "", src)
    r = run_kernel(k, (16, 1, 1), (16, 1, 1), [(16,)], ["float32"], [np.arange(16.0)], "float32", mode=mode)
    assert r.outputs[0].tolist() == [120.0] * 16
    assert r.diagnostics == []


HELPERS = """
struct Pair { float a; int b; };
template <typename T> inline T twice(T x) { return x + x; }
struct Add { template <typename T> T operator()(T x, T y) const { return x + y; } };
inline float scaled(threadgroup float* s, uint i) { return s[i] * 2.0f; }
"""


@pytest.mark.parametrize("mode", ["fast", "check"])
def test_threadgroup_elements_in_templates_select_unary_increments_and_struct_members(mode):
    # In check mode each of these failed to compile (a checked reference is not a float to a template, select,
    # unary minus, ++ or <<=; `.a` / `.b` of a struct element were taken for vector components).
    src = """
  threadgroup float buf[32];
  threadgroup int cnt[32];
  threadgroup Pair ps[32];
  uint t = thread_index_in_threadgroup;
  buf[t] = a[t];
  cnt[t] = int(t);
  ps[t].a = a[t] * 3.0f;
  ps[t].b = int(t);
  ps[t].b += 100;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  cnt[t]++;
  ++cnt[t];
  cnt[t] <<= 1;
  cnt[t] |= 1;
  auto e = buf[t];
  Add op;
  float v = twice(buf[t]) + op(buf[t], 1.0f) + select(buf[t], -1.0f, t > 15) - buf[(t + 1) % 32] + -e;
  out[t] = v + float(cnt[t]) + ps[31 - t].a + float(ps[t].b) + scaled(buf, t) + float(sizeof(buf[0]));
"""
    k = KernelSource("tgforms", "metal", ("a",), ("out",), HELPERS, src)
    a = np.arange(32.0)
    r = run_kernel(k, (32, 1, 1), (32, 1, 1), [(32,)], ["float32"], [a], "float32", mode=mode)
    t = np.arange(32)
    v = 2 * a + (a + 1) + np.where(t > 15, -1.0, a) - a[(t + 1) % 32] - a
    want = v + (((t + 2) << 1) | 1) + 3 * a[31 - t] + (t + 100) + 2 * a + 4
    assert r.outputs[0].tolist() == want.tolist()
    assert r.diagnostics == []


def test_struct_member_and_read_races_are_still_races():
    """Across simdgroups (thread t reads what t + 32 writes) a missing barrier is a race."""
    src = """
  threadgroup Pair ps[64];
  threadgroup float buf[64];
  uint t = thread_index_in_threadgroup;
  ps[t].a = a[t];
  buf[t] = a[t];
  out[t] = ps[(t + 32) % 64].a + twice(buf[(t + 32) % 64]);
"""
    k = KernelSource("tgrace", "metal", ("a",), ("out",), HELPERS, src)
    r = run_kernel(k, (64, 1, 1), (64, 1, 1), [(64,)], ["float32"], [np.arange(64.0)], "float32", mode="check")
    lines = {d.code for d in r.diagnostics if d.kind in ("race", "uninitialized") and d.severity == "error"}
    assert any("ps[(t + 32) % 64].a" in c for c in lines) and any("twice(buf" in c for c in lines), r.diagnostics


CAST_SRC = """
  threadgroup float shmem[64];
  uint t = thread_index_in_threadgroup;
  threadgroup float4* s4 = (threadgroup float4*) shmem;
  s4[t] = float4(a[4 * t], a[4 * t + 1], a[4 * t + 2], a[4 * t + 3]);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  threadgroup float2* s2 = reinterpret_cast<threadgroup float2*>(shmem + 8);
  float4 w = ((threadgroup float4*)&shmem[0])[(t + 1) % 16];
  out[t] = shmem[(t * 4 + 5) % 64] + w.x + 100.0f * s2[t].y + float(s2 == s2);
"""


@pytest.mark.parametrize("mode", ["fast", "check"])
def test_threadgroup_memory_viewed_through_a_pointer_cast(mode):
    # llama.cpp's `threadgroup float4 * shmem_f4 = (threadgroup float4 *) shmem;`: the lint refused the cast
    k = KernelSource("tgcast", "metal", ("a",), ("out",), "", CAST_SRC)
    a = np.arange(64.0)
    r = run_kernel(k, (16, 1, 1), (16, 1, 1), [(16,)], ["float32"], [a], "float32", mode=mode)
    t = np.arange(16)
    assert r.outputs[0].tolist() == (a[(4 * t + 5) % 64] + a[4 * ((t + 1) % 16)] + 100 * a[9 + 2 * t] + 1).tolist()
    assert r.diagnostics == []


def test_a_conflict_through_a_cast_view_is_found_on_the_declared_elements():
    """Without the barrier, thread t reads what thread t + 1 wrote through the float4 view: one simdgroup, so the
    lanes' lockstep is named (a warning), on the declared array's elements."""
    src = CAST_SRC.replace("threadgroup_barrier(mem_flags::mem_threadgroup);", "")
    k = KernelSource("tgcastrace", "metal", ("a",), ("out",), "", src)
    r = run_kernel(k, (16, 1, 1), (16, 1, 1), [(16,)], ["float32"], [np.arange(64.0)], "float32", mode="check")
    assert any(d.kind == "simdgroup_synchronous" and "shmem[" in d.message for d in r.diagnostics), r.diagnostics
    r = run_kernel(KernelSource("tgcastoob", "metal", ("a",), ("out",), "", CAST_SRC.replace("s4[t] =", "s4[t + 1] =")),
                   (16, 1, 1), (16, 1, 1), [(16,)], ["float32"], [np.arange(64.0)], "float32", mode="check")
    assert any(d.kind == "threadgroup_bounds" for d in r.diagnostics), r.diagnostics

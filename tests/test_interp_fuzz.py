"""Schedule fuzz: kernels whose output depends on the order threadgroups or threads run are reported with the
first differing element; order-independent kernels are not."""

from __future__ import annotations

import numpy as np
import pytest

from kernsearch import KernelSource
from kernsearch.interp import fuzz_schedule, run_kernel


def kern(source: str, inputs=("a",), outputs=("out",)) -> KernelSource:
    return KernelSource(name="fz", target="metal", input_names=inputs, output_names=outputs, header="", source=source)


def test_reading_another_threadgroups_device_output_is_order_dependent():
    # Each threadgroup writes its block, then reads the previous block's first element: in grid order it is
    # already written; reversed, it is still the NaN prefill.
    src = """
    uint i = thread_position_in_grid.x, g = threadgroup_position_in_grid.x;
    out[i] = a[i];
    threadgroup_barrier(mem_flags::mem_device);
    if (g > 0 && thread_index_in_threadgroup == 0) out[i] += out[(g - 1) * 32];
"""
    r = fuzz_schedule(kern(src), (128, 1, 1), (32, 1, 1), [(128,)], ["float32"], [np.arange(128.0)], "float32")
    assert r.order_dependent
    d = r.dependence
    assert d.schedule == "reversed" and d.output == "out" and d.index == (32,)
    assert d.in_order == 32.0 and np.isnan(d.other)
    assert "element (32,)" in str(d)


def test_device_memory_ordered_only_by_a_threadgroup_barrier_between_simdgroups():
    # Thread t reads what thread t+32 wrote to device memory: only the resume order makes it work.
    src = """
    uint t = thread_index_in_threadgroup;
    scratch[t] = a[t] * 2.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (t < 32) out[t] = scratch[t + 32];
"""
    k = kern(src, outputs=("out", "scratch"))
    # The barrier does order it: threads all reach the barrier before any reads, so this one is NOT dependent.
    r = fuzz_schedule(k, (64, 1, 1), (64, 1, 1), [(32,), (64,)], ["float32", "float32"], [np.arange(64.0)],
                      "float32")
    assert not r.order_dependent
    # Without the barrier the read depends on which simdgroup ran first.
    racy = kern(src.replace("threadgroup_barrier(mem_flags::mem_threadgroup);", ""), outputs=("out", "scratch"))
    r = fuzz_schedule(racy, (64, 1, 1), (64, 1, 1), [(32,), (64,)], ["float32", "float32"], [np.arange(64.0)],
                      "float32")
    assert r.order_dependent and r.dependence.output == "out" and r.dependence.index == (0,)


def test_order_independent_kernel_with_atomics_is_clean():
    src = """
    uint i = thread_position_in_grid.x;
    atomic_fetch_add_explicit(&out[a[i] % 8], 1u, memory_order_relaxed);
"""
    vals = np.random.default_rng(0).integers(0, 1000, 4096).astype(np.uint32)
    r = fuzz_schedule(kern(src), (4096, 1, 1), (256, 1, 1), [(8,)], ["uint32"], [vals], "float32", init_value=0,
                      atomic_outputs=True)
    assert not r.order_dependent
    assert r.runs["shuffled"].outputs[0].tolist() == np.bincount(vals % 8, minlength=8).tolist()


@pytest.mark.parametrize("schedule", ["reversed", "shuffled"])
def test_every_threadgroup_still_runs_exactly_once(schedule):
    src = "uint i = thread_position_in_grid.x; out[i] = float(threadgroup_position_in_grid.x);"
    r = run_kernel(kern(src), (1000, 1, 1), (64, 1, 1), [(1000,)], ["float32"], [np.zeros(1)], "float32",
                   schedule=schedule, seed=7)
    assert r.outputs[0].tolist() == [float(i // 64) for i in range(1000)]


def test_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="unknown schedule"):
        run_kernel(kern("out[0] = 1.0f;"), (1, 1, 1), (1, 1, 1), [(1,)], ["float32"], [np.zeros(1)], "float32",
                   schedule="sideways")


def test_a_sampled_set_of_threadgroups_runs_in_fuzzed_order_too():
    src = "uint i = thread_position_in_grid.x; out[i] = float(threadgroup_position_in_grid.x);"
    picks = [(0, 0, 0), (5, 0, 0), (9, 0, 0)]
    for schedule in ("in-order", "reversed", "shuffled"):
        r = run_kernel(kern(src), (640, 1, 1), (64, 1, 1), [(640,)], ["float32"], [np.zeros(1)], "float32",
                       schedule=schedule, threadgroups=picks)
        out = r.outputs[0]
        for g in range(10):
            block = out[g * 64:(g + 1) * 64]
            if (g, 0, 0) in picks:
                assert (block == g).all(), (schedule, g)
            else:
                assert np.isnan(block).all(), (schedule, g)

"""Persistent launches on the interpreter (``launch.persistent``, ks_pool): every threadgroup resident at once,
threads switching at atomics, so a threadgroup may wait for another's work as on the GPU; other kernels still run
threadgroups one after another."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kernsearch import KernelSource
from kernsearch._errors import VariantFailure
from kernsearch.interp import run_kernel

#: Threadgroup 0 waits until the last threadgroup has published its value, then adds it: one after another (grid
#: order) threadgroup 0 would spin forever; resident side by side it finishes. Every threadgroup also counts its
#: arrival, and threadgroup memory stays each threadgroup's own (a per-threadgroup sum through it).
WAITS = """
    uint g = threadgroup_position_in_grid.x, t = thread_index_in_threadgroup, n = threadgroups_per_grid.x;
    device atomic_uint* flags = (device atomic_uint*)(sync);
    threadgroup float part[64];
    part[t] = a[g * 64 + t];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float s = 0.0f;
    for (uint k = 0; k < 64; ++k) s += part[k];
    if (t == 0) {
        atomic_fetch_add_explicit(flags + 1, 1u, memory_order_relaxed);
        if (g == n - 1) {
            out[g] = s;
            atomic_store_explicit(flags, 1u, memory_order_relaxed);
        } else if (g == 0) {
            while (atomic_load_explicit(flags, memory_order_relaxed) == 0u) {
            }
            out[g] = s + out[n - 1];
        } else {
            out[g] = s;
        }
    }
"""


def kern(persistent: bool) -> KernelSource:
    return KernelSource(name="pw", target="metal", input_names=("a",), output_names=("out", "sync"), header="",
                        source=WAITS, persistent=persistent)


def _run(kernel: KernelSource, schedule: str = "in-order", timeout: float = 30.0) -> list[np.ndarray]:
    a = np.arange(6 * 64, dtype=np.float32) / 64
    return run_kernel(kernel, (6 * 64, 1, 1), (64, 1, 1), [(6,), (2,)], ["float32", "uint32"], [a], "float32",
                      init_value=0.0, schedule=schedule, seed=5, timeout=timeout).outputs


@pytest.mark.parametrize("schedule", ["in-order", "reversed", "shuffled"])
def test_a_threadgroup_waits_for_another_in_a_persistent_launch(schedule: str) -> None:
    out, sync = _run(kern(True), schedule)
    sums = (np.arange(6 * 64, dtype=np.float64) / 64).reshape(6, 64).sum(axis=1)
    assert out.tolist() == [sums[0] + sums[5], *sums[1:].tolist()]
    assert sync.tolist() == [1, 6]


@pytest.mark.slow
def test_threadgroups_run_one_after_another_otherwise() -> None:
    with pytest.raises(VariantFailure) as failed:  # grid order: threadgroup 0 waits for one that never runs
        _run(replace(kern(True), persistent=False), timeout=3.0)
    assert failed.value.reason == "timeout"

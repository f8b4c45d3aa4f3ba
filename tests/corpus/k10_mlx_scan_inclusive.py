"""Inclusive prefix sum of a row: simd_prefix_inclusive_sum then per-simdgroup totals through threadgroup memory."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "MLX kernels/scan.h: contiguous_scan (simd prefix + threadgroup simdgroup sums)"
FEATURES = ("simd_prefix_inclusive_sum", "simd_prefix_exclusive_sum", "threadgroup array", "int32 buffers")


def case() -> Case:
    n = 256
    x = rng(10).integers(-100, 100, size=n).astype(np.int32)
    src = """
        uint t = thread_index_in_threadgroup;
        uint simd_lane_id = thread_index_in_simdgroup, simd_group_id = simdgroup_index_in_threadgroup;
        threadgroup int totals[8];
        int v = inp[t];
        int pre = simd_prefix_inclusive_sum(v);
        if (simd_lane_id == 31) totals[simd_group_id] = pre;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (simd_group_id == 0) {
            int tot = simd_lane_id < 8 ? totals[simd_lane_id] : 0;
            int ex = simd_prefix_exclusive_sum(tot);
            if (simd_lane_id < 8) totals[simd_lane_id] = ex;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        out[t] = pre + totals[simd_group_id];
    """
    return Case(src, {"inp": x}, {"out": ((n,), "int32")}, lambda inp: [np.cumsum(inp).astype(np.int32)],
                (n, 1, 1), (n, 1, 1))

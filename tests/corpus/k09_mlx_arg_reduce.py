"""Argmax of each row: (value, index) pairs reduced with simd_shuffle_down, ties to the lower index."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "MLX kernels/arg_reduce.metal: ArgMax with simd_shuffle_down of value and index"
FEATURES = ("simd_shuffle_down", "struct in header", "uint32 output", "threadgroup arrays of two types")


def case() -> Case:
    rows, cols = 5, 200
    x = rng(9).integers(-50, 50, size=(rows, cols)).astype(np.float64)
    header = """
struct IndexValue { uint index; float value; };
inline IndexValue better(IndexValue a, IndexValue b) {
  return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
}
"""
    src = """
        uint row = threadgroup_position_in_grid.x, lid = thread_index_in_threadgroup;
        uint simd_lane_id = thread_index_in_simdgroup, simd_group_id = simdgroup_index_in_threadgroup;
        threadgroup uint tg_idx[32];
        threadgroup float tg_val[32];
        IndexValue best = {0u, -INFINITY};
        for (uint c = lid; c < COLS; c += 64) best = better(best, IndexValue{c, inp[row * COLS + c]});
        for (ushort off = 16; off > 0; off /= 2) {
            IndexValue o = {simd_shuffle_down(best.index, off), simd_shuffle_down(best.value, off)};
            best = better(best, o);
        }
        if (simd_lane_id == 0) { tg_idx[simd_group_id] = best.index; tg_val[simd_group_id] = best.value; }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (lid == 0) {
            IndexValue r = {tg_idx[0], tg_val[0]};
            r = better(r, IndexValue{tg_idx[1], tg_val[1]});
            out[row] = r.index;
        }
    """
    header += "constant constexpr uint COLS = 200;\n"
    return Case(src, {"inp": x}, {"out": ((rows,), "uint32")}, lambda inp: [inp.argmax(1).astype(np.uint32)],
                (64 * rows, 1, 1), (64, 1, 1), header=header)

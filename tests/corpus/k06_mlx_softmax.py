"""Row softmax: one threadgroup per row, simd_max / simd_sum then threadgroup partials across simdgroups."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "MLX kernels/softmax.h: softmax_single_row (simd reductions + threadgroup local_max/local_normalizer)"
FEATURES = ("simd_max", "simd_sum", "threadgroup arrays", "Limits<T>::min", "simd_lane_id / simd_group_id names",
            "fast::exp", "threadgroup scalar")


def case() -> Case:
    rows, cols = 4, 300
    x = rng(6).standard_normal((rows, cols)) * 3
    src = """
        uint row = threadgroup_position_in_grid.x;
        uint lid = thread_position_in_threadgroup.x;
        uint simd_lane_id = thread_index_in_simdgroup;
        uint simd_group_id = simdgroup_index_in_threadgroup;
        threadgroup float local_max[32];
        threadgroup float local_sum[32];
        threadgroup float row_max;
        float m = Limits<float>::min;
        for (uint c = lid; c < COLS; c += 256) m = max(m, float(inp[row * COLS + c]));
        m = simd_max(m);
        if (simd_lane_id == 0) local_max[simd_group_id] = m;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (simd_group_id == 0) {
            m = simd_max(simd_lane_id < 8 ? local_max[simd_lane_id] : Limits<float>::min);
            if (simd_lane_id == 0) row_max = m;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float mx = row_max;
        float s = 0;
        for (uint c = lid; c < COLS; c += 256) s += fast::exp(float(inp[row * COLS + c]) - mx);
        s = simd_sum(s);
        if (simd_lane_id == 0) local_sum[simd_group_id] = s;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float total = 0;
        for (int k = 0; k < 8; ++k) total += local_sum[k];
        for (uint c = lid; c < COLS; c += 256) out[row * COLS + c] = fast::exp(float(inp[row * COLS + c]) - mx) / total;
    """

    def ref(inp):
        e = np.exp(inp - inp.max(1, keepdims=True))
        return [e / e.sum(1, keepdims=True)]
    return Case(src, {"inp": x}, {"out": ((rows, cols), "float32")}, ref, (256 * rows, 1, 1), (256, 1, 1),
                header=f"constant constexpr uint COLS = {cols};\n", rtol=1e-5, atol=1e-7)

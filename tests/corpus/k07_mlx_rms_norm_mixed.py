"""RMS norm of float16 rows with a float32 weight vector: inputs of two dtypes in one kernel."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "MLX kernels/rms_norm.metal: rms_single_row (simd_sum, threadgroup partials, precise::rsqrt)"
FEATURES = ("mixed input dtypes (half x, float w)", "simd_sum", "threadgroup array", "metal::precise::rsqrt",
            "half output")


def case() -> Case:
    rows, d = 3, 256
    r = rng(7)
    x = r.standard_normal((rows, d)).astype(np.float16)
    w = (1 + 0.1 * r.standard_normal(d)).astype(np.float32)
    src = """
        uint row = threadgroup_position_in_grid.x, lid = thread_index_in_threadgroup;
        uint simd_lane_id = thread_index_in_simdgroup, simd_group_id = simdgroup_index_in_threadgroup;
        threadgroup float partial[32];
        float acc = 0;
        for (uint i = lid; i < D; i += 128) { float v = x[row * D + i]; acc += v * v; }
        acc = simd_sum(acc);
        if (simd_lane_id == 0) partial[simd_group_id] = acc;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float total = partial[0] + partial[1] + partial[2] + partial[3];
        float scale = metal::precise::rsqrt(total / D + 1e-5f);
        for (uint i = lid; i < D; i += 128) out[row * D + i] = half(float(x[row * D + i]) * scale * w[i]);
    """

    def ref(x, w):
        xf = x.astype(np.float64)
        return [xf / np.sqrt((xf ** 2).mean(1, keepdims=True) + 1e-5) * w]
    return Case(src, {"x": x, "w": w}, {"out": ((rows, d), "float16")}, ref, (128 * rows, 1, 1), (128, 1, 1),
                header=f"constant constexpr uint D = {d};\n", input_dtypes=["float16", "float32"], rtol=2e-3,
                atol=2e-3)

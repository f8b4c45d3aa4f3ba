"""Layer norm with mean and variance through simd_sum and a threadgroup array per statistic."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "MLX kernels/layer_norm.metal: layer_norm_single_row"
FEATURES = ("two-pass threadgroup reduction", "simd_sum", "metal::rsqrt", "float4 loads", "bias and weight")


def case() -> Case:
    rows, d = 2, 128
    r = rng(8)
    x, w, b = r.standard_normal((rows, d)), r.standard_normal(d), r.standard_normal(d)
    src = """
        uint row = threadgroup_position_in_grid.x, lid = thread_index_in_threadgroup;
        threadgroup float sums[2];
        const device float4* xr = (const device float4*)(x + row * D);
        float4 v = xr[lid];
        float s = simd_sum(v.x + v.y + v.z + v.w);
        if (thread_index_in_simdgroup == 0) sums[simdgroup_index_in_threadgroup] = s;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float mean = (sums[0] + 0.0f) / D;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float4 c = v - mean;
        float q = simd_sum(dot(c, c));
        if (thread_index_in_simdgroup == 0) sums[simdgroup_index_in_threadgroup] = q;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float inv = metal::rsqrt(sums[0] / D + 1e-5f);
        for (int k = 0; k < 4; ++k) out[row * D + lid * 4 + k] = c[k] * inv * w[lid * 4 + k] + b[lid * 4 + k];
    """

    def ref(x, w, b):
        m = x.mean(1, keepdims=True)
        return [(x - m) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * w + b]
    return Case(src, {"x": x, "w": w, "b": b}, {"out": ((rows, d), "float32")}, ref, (32 * rows, 1, 1), (32, 1, 1),
                header=f"constant constexpr uint D = {d};\n", rtol=1e-4, atol=1e-5)

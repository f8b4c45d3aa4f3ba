"""Softmax with a scale and an additive mask (-INFINITY entries), max and sum through simd and threadgroup."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "llama.cpp ggml-metal.metal: kernel_soft_max (scale, mask, -INFINITY, simd_max/simd_sum, buf[32])"
FEATURES = ("-INFINITY in the mask", "simd_max", "simd_sum", "threadgroup buf[32]", "exp of -inf", "two inputs")


def case() -> Case:
    rows, cols = 3, 64
    r = rng(24)
    x = r.standard_normal((rows, cols))
    mask = np.where(np.triu(np.ones((rows, cols)), 20) > 0, -np.inf, 0.0)
    src = """
        uint row = threadgroup_position_in_grid.x, tpitg = thread_position_in_threadgroup.x;
        uint tiisg = thread_index_in_simdgroup, sgitg = simdgroup_index_in_threadgroup;
        threadgroup float buf[32];
        float lmax = -INFINITY;
        for (uint i = tpitg; i < NE00; i += 64) lmax = max(lmax, x[row * NE00 + i] * SCALE + mask[row * NE00 + i]);
        float m = simd_max(lmax);
        if (tiisg == 0) buf[sgitg] = m;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        m = max(buf[0], buf[1]);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float lsum = 0;
        for (uint i = tpitg; i < NE00; i += 64) {
            float e = exp(x[row * NE00 + i] * SCALE + mask[row * NE00 + i] - m);
            lsum += e;
            dst[row * NE00 + i] = e;
        }
        float s = simd_sum(lsum);
        if (tiisg == 0) buf[sgitg] = s;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float inv = 1.0f / (buf[0] + buf[1]);
        for (uint i = tpitg; i < NE00; i += 64) dst[row * NE00 + i] *= inv;
    """

    def ref(x, mask):
        z = x * 0.5 + mask
        e = np.exp(z - z.max(1, keepdims=True))
        return [e / e.sum(1, keepdims=True)]
    return Case(src, {"x": x, "mask": mask}, {"dst": ((rows, cols), "float32")}, ref, (64 * rows, 1, 1), (64, 1, 1),
                header=f"constant constexpr uint NE00 = {cols};\nconstant constexpr float SCALE = 0.5f;\n",
                rtol=1e-5, atol=1e-7)

"""Row logsumexp with an online max/sum pair reduced across the simdgroup."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "MLX kernels/logsumexp.h: logsumexp (online max and normaliser, simd_max / simd_sum)"
FEATURES = ("simd_max", "simd_sum", "fast::exp", "fast::log", "-INFINITY", "isinf")


def case() -> Case:
    rows, cols = 6, 100
    x = rng(21).standard_normal((rows, cols)) * 4
    src = """
        uint row = threadgroup_position_in_grid.x, lane = thread_index_in_simdgroup;
        float m = -INFINITY, s = 0.0f;
        for (uint c = lane; c < COLS; c += 32) {
            float v = inp[row * COLS + c];
            float nm = max(m, v);
            s = s * fast::exp(m - nm) + fast::exp(v - nm);
            m = nm;
        }
        float gm = simd_max(m);
        s = simd_sum(isinf(m) ? 0.0f : s * fast::exp(m - gm));
        if (lane == 0) out[row] = gm + fast::log(s);
    """

    def ref(inp):
        m = inp.max(1)
        return [m + np.log(np.exp(inp - m[:, None]).sum(1))]
    return Case(src, {"inp": x}, {"out": ((rows,), "float32")}, ref, (32 * rows, 1, 1), (32, 1, 1),
                header=f"constant constexpr uint COLS = {cols};\n", rtol=1e-5)

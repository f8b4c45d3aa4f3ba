"""Row softmax, one simdgroup per row: the row maximum is published in a threadgroup slot by lane 0, read by every
lane, and the slot reset right after (no barrier) to accumulate the row sum."""
import numpy as np
from _case import Case, rng

MODELLED_ON = ("llama.cpp ggml-metal.metal kernel_soft_max (2023): simd_max / simd_sum per simdgroup and a "
               "threadgroup buf[] slot per simdgroup for the broadcast")
FEATURES = ("lockstep simdgroup: shared slot written, read by every lane, reset right after", "simd_max", "simd_sum",
            "INFINITY", "two simdgroups per threadgroup, one row each")

ROWS, COLS, NSG = 8, 100, 2


def case() -> Case:
    x = rng(48).standard_normal((ROWS, COLS)) * 3
    src = """
        uint sg = simdgroup_index_in_threadgroup, lane = thread_index_in_simdgroup;
        uint row = threadgroup_position_in_grid.x * NSG + sg;
        threadgroup float slot[NSG];
        const device float* xr = inp + row * COLS;
        device float* yr = out + row * COLS;
        float lmax = -INFINITY;
        for (uint i = lane; i < COLS; i += 32) lmax = max(lmax, xr[i]);
        lmax = simd_max(lmax);
        if (lane == 0) slot[sg] = lmax;
        const float m = slot[sg];
        if (lane == 0) slot[sg] = 0.0f;
        float lsum = 0.0f;
        for (uint i = lane; i < COLS; i += 32) {
            const float e = exp(xr[i] - m);
            yr[i] = e;
            lsum += e;
        }
        lsum = simd_sum(lsum);
        if (lane == 0) slot[sg] += lsum;
        const float inv = 1.0f / slot[sg];
        for (uint i = lane; i < COLS; i += 32) yr[i] *= inv;
    """

    def ref(inp):
        e = np.exp(inp - inp.max(axis=1, keepdims=True))
        return [e / e.sum(axis=1, keepdims=True)]
    return Case(src, {"inp": x}, {"out": ((ROWS, COLS), "float32")}, ref, (32 * ROWS, 1, 1), (32 * NSG, 1, 1),
                header=f"constant constexpr uint COLS = {COLS}, NSG = {NSG};\n", rtol=1e-5, atol=1e-6, lockstep=True)

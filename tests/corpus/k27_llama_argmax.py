"""Argmax over a row with simd_max, a ballot of the lanes holding the max, and ctz of the vote to pick one."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "llama.cpp ggml-metal.metal: kernel_argmax (simd_max then lane selection) with simd_ballot"
FEATURES = ("simd_max", "simd_ballot", "simd_vote to uint64_t", "ctz", "simd_shuffle", "int32 output")


def case() -> Case:
    rows, cols = 4, 96
    x = rng(27).permuted(np.tile(np.arange(cols, dtype=np.float64), (rows, 1)), axis=1)
    src = """
        uint row = threadgroup_position_in_grid.x, lane = thread_index_in_simdgroup;
        float best = -INFINITY; int best_i = -1;
        for (uint c = lane; c < COLS; c += 32) {
            float v = x[row * COLS + c];
            if (v > best) { best = v; best_i = int(c); }
        }
        float m = simd_max(best);
        uint64_t vote = uint64_t(simd_ballot(best == m));
        ushort winner = ushort(ctz(uint(vote)));
        int idx = simd_shuffle(best_i, winner);
        if (lane == 0) dst[row] = idx;
    """
    return Case(src, {"x": x}, {"dst": ((rows,), "int32")}, lambda x: [x.argmax(1).astype(np.int32)],
                (32 * rows, 1, 1), (32, 1, 1), header=f"constant constexpr uint COLS = {cols};\n")

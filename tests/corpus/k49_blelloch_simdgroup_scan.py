"""Exclusive scan of 64 values by one simdgroup: Blelloch up-sweep, the last element cleared, down-sweep, with no
barrier anywhere (the 32 lanes run together)."""
import numpy as np
from _case import Case, rng

MODELLED_ON = ("GPU Gems 3, ch. 39 (Harris, Sengupta, Owens), work-efficient (Blelloch) scan: up-sweep, clear the "
               "last element, down-sweep; here for 2 x 32 elements in one simdgroup, its barriers dropped as "
               "warp-synchronous ports do")
FEATURES = ("lockstep simdgroup: up-sweep followed by a write and a down-sweep, no barrier", "loops whose active lanes "
            "shrink and then grow", "several threadgroups")

GROUPS = 3


def case() -> Case:
    x = rng(49).integers(0, 10, size=64 * GROUPS).astype(np.float64)
    src = """
        uint lane = thread_index_in_simdgroup, base = threadgroup_position_in_grid.x * 64;
        threadgroup float s[64];
        s[2 * lane] = inp[base + 2 * lane];
        s[2 * lane + 1] = inp[base + 2 * lane + 1];
        uint off = 1;
        for (uint d = 32; d > 0; d >>= 1) {
            if (lane < d) {
                uint ai = off * (2 * lane + 1) - 1, bi = off * (2 * lane + 2) - 1;
                s[bi] += s[ai];
            }
            off *= 2;
        }
        if (lane == 0) s[63] = 0.0f;
        for (uint d = 1; d < 64; d *= 2) {
            off >>= 1;
            if (lane < d) {
                uint ai = off * (2 * lane + 1) - 1, bi = off * (2 * lane + 2) - 1;
                float t = s[ai];
                s[ai] = s[bi];
                s[bi] += t;
            }
        }
        out[base + 2 * lane] = s[2 * lane];
        out[base + 2 * lane + 1] = s[2 * lane + 1];
    """

    def ref(inp):
        blocks = inp.reshape(GROUPS, 64)
        return [(np.cumsum(blocks, axis=1) - blocks).reshape(-1)]
    return Case(src, {"inp": x}, {"out": ((64 * GROUPS,), "float32")}, ref, (32 * GROUPS, 1, 1), (32, 1, 1),
                lockstep=True)

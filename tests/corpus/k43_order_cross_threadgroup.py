"""Order dependence (expected detection): a 'decoupled look-back' scan without flags, reading the previous
threadgroup's device output as if threadgroups ran in order."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "Single-pass chained scan (Merrill & Garland decoupled look-back) with the status flags left out"
FEATURES = ("planted bug: cross-threadgroup device read without synchronisation", "schedule fuzz detection",
            "mem_device barrier that orders nothing across threadgroups")


def case() -> Case:
    x = rng(43).standard_normal(256)
    src = """
        uint t = thread_index_in_threadgroup, g = threadgroup_position_in_grid.x;
        threadgroup float tile[64];
        tile[t] = inp[g * 64 + t];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float s = 0.0f;
        for (uint k = 0; k <= t; ++k) s += tile[k];
        float carry = g == 0 ? 0.0f : out[g * 64 - 1];
        threadgroup_barrier(mem_flags::mem_device);
        out[g * 64 + t] = s + carry;
    """
    return Case(src, {"inp": x}, {"out": ((256,), "float32")}, lambda inp: [np.cumsum(inp)], (256, 1, 1),
                (64, 1, 1), expect="order")

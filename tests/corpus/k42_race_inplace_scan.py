"""Classic race (expected detection): Hillis-Steele inclusive scan in place, reading a neighbour's slot that
another thread is updating in the same step (no double buffer, no barrier between read and write)."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "GPU Gems 3 ch. 39 naive (Hillis-Steele) scan, single-buffered"
FEATURES = ("planted race: in-place scan reads temp[t - offset] while it is written", "expected detection")


def case() -> Case:
    x = rng(42).standard_normal(64)
    src = """
        uint t = thread_index_in_threadgroup;
        threadgroup float temp[64];
        temp[t] = inp[t];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint offset = 1; offset < 64; offset *= 2) {
            if (t >= offset) temp[t] += temp[t - offset];
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        out[t] = temp[t];
    """
    return Case(src, {"inp": x}, {"out": ((64,), "float32")}, lambda inp: [np.cumsum(inp)], (64, 1, 1), (64, 1, 1),
                expect="race")

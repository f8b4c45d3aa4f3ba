"""Classic race (expected detection): a threadgroup tree reduction with the barrier inside the loop missing."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "NVIDIA 'Optimizing Parallel Reduction in CUDA' (Harris) reduction #1, with its __syncthreads removed"
FEATURES = ("planted race: missing threadgroup_barrier in a tree reduction", "expected detection in check mode")


def case() -> Case:
    x = rng(41).standard_normal(128)
    src = """
        uint t = thread_index_in_threadgroup;
        threadgroup float sdata[128];
        sdata[t] = inp[t];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint s = 64; s > 0; s >>= 1) {
            if (t < s) sdata[t] += sdata[t + s];
            // threadgroup_barrier(mem_flags::mem_threadgroup);  <- missing
        }
        if (t == 0) out[0] = sdata[0];
    """
    return Case(src, {"inp": x}, {"out": ((1,), "float32")}, lambda inp: [np.array([inp.sum()])], (128, 1, 1),
                (128, 1, 1), expect="race")

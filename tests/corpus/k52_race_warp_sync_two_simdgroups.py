"""Real race (expected detection): the reduction of k46 with its barrier-free tail widened to 64 lanes, two
simdgroups, which the hardware does not run together."""
import numpy as np
from _case import Case, rng

MODELLED_ON = ("NVIDIA 'Optimizing Parallel Reduction in CUDA' (Harris), kernel 6, with the warp-synchronous tail "
               "started at 64 threads instead of 32: a race across simdgroups")
FEATURES = ("planted race across simdgroups in a barrier-free tail", "expected detection in check mode",
            "volatile threadgroup pointer")


def case() -> Case:
    x = rng(52).standard_normal(256)
    src = """
        uint tid = thread_index_in_threadgroup;
        threadgroup float sdata[128];
        sdata[tid] = inp[tid] + inp[tid + 128];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (tid < 64) {  // two simdgroups: lanes 32-63 do not run in step with lanes 0-31
            volatile threadgroup float* v = sdata;
            v[tid] += v[tid + 64];
            v[tid] += v[tid + 32];
            v[tid] += v[tid + 16];
            v[tid] += v[tid + 8];
            v[tid] += v[tid + 4];
            v[tid] += v[tid + 2];
            v[tid] += v[tid + 1];
        }
        if (tid == 0) out[0] = sdata[0];
    """
    return Case(src, {"inp": x}, {"out": ((1,), "float32")}, lambda inp: [np.array([inp.sum()])], (128, 1, 1),
                (128, 1, 1), expect="race")

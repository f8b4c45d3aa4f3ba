"""Bitonic sort of 32 keys per simdgroup through threadgroup memory: each lane reads its partner's key and writes its
own with no barrier between the compare-exchange steps."""
import numpy as np
from _case import Case, rng

MODELLED_ON = ("warp-level bitonic sort of GPU top-k / block-sort kernels (e.g. the 32-key warp sort of CUDA "
               "sample 'sortingNetworks', bitonicSortShared, run by one warp without __syncthreads)")
FEATURES = ("lockstep simdgroup: compare-exchange reading a partner lane's key, no barrier", "min / max",
            "xor partner index", "two simdgroups")


def case() -> Case:
    x = rng(51).standard_normal(64)
    src = """
        uint tid = thread_index_in_threadgroup, lane = thread_index_in_simdgroup, sg = simdgroup_index_in_threadgroup;
        threadgroup float keys[64];
        keys[tid] = inp[tid];
        for (uint k = 2; k <= 32; k <<= 1) {
            for (uint j = k >> 1; j > 0; j >>= 1) {
                const uint partner = lane ^ j;
                const float a = keys[sg * 32 + lane], b = keys[sg * 32 + partner];
                const bool ascending = (lane & k) == 0;
                const bool take_min = (lane < partner) == ascending;
                keys[sg * 32 + lane] = take_min ? min(a, b) : max(a, b);
            }
        }
        out[tid] = keys[tid];
    """
    return Case(src, {"inp": x}, {"out": ((64,), "float32")}, lambda inp: [np.sort(inp.reshape(2, 32), 1).reshape(-1)],
                (64, 1, 1), (64, 1, 1), lockstep=True)

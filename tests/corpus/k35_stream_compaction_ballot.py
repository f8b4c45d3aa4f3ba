"""Stream compaction inside a simdgroup: ballot of the kept lanes, popcount of the lower lanes gives the slot."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "Warp-aggregated stream compaction (ballot + popc, NVIDIA 'CUDA Pro Tip: Optimized Filtering') in Metal"
FEATURES = ("simd_ballot", "popcount on a vote mask", "simd_broadcast_first", "atomic counter", "int outputs")


def case() -> Case:
    x = rng(35).standard_normal(64)
    src = """
        uint i = thread_position_in_grid.x, lane = thread_index_in_simdgroup, sg = simdgroup_index_in_threadgroup;
        bool keep = x[i] > 0.0f;
        uint mask = uint(uint64_t(simd_ballot(keep)));
        uint rank = popcount(mask & ((1u << lane) - 1u));
        uint base = sg * 32;
        if (keep) idx[base + rank] = int(i);
        if (simd_is_first()) atomic_fetch_add_explicit((device atomic_int*)&count[sg], int(popcount(mask)),
                                                       memory_order_relaxed);
    """

    def ref(x):
        idx = np.full(64, -1, dtype=np.int32)
        counts = np.zeros(2, dtype=np.int32)
        for sg in range(2):
            kept = [i for i in range(sg * 32, sg * 32 + 32) if x[i] > 0]
            idx[sg * 32:sg * 32 + len(kept)] = kept
            counts[sg] = len(kept) - 1  # the counters start from init_value -1, like the unwritten slots
        return [idx, counts]
    case_ = Case(src, {"x": x}, {"idx": ((64,), "int32"), "count": ((2,), "int32")}, ref, (64, 1, 1), (64, 1, 1),
                 init_value=-1)
    return case_

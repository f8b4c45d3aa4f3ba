"""Inclusive block scan: each simdgroup scans its 32 values in threadgroup memory with no barrier, then the
simdgroup totals are scanned the same way and added."""
import numpy as np
from _case import Case, rng

MODELLED_ON = ("Sengupta, Harris, Garland, 'Efficient Parallel Scan Algorithms for GPUs' (NVIDIA 2008): scan_warp "
               "(Hillis-Steele over the 32 lanes of a warp in shared memory, no barrier) and scan_block")
FEATURES = ("lockstep simdgroup: in-place Hillis-Steele scan without barriers", "chained assignment s[i] = v = ...",
            "int32 buffers", "scan of per-simdgroup totals")

BLOCK, GROUPS = 128, 3


def case() -> Case:
    x = rng(47).integers(-50, 50, size=BLOCK * GROUPS).astype(np.int32)
    src = """
        uint tid = thread_index_in_threadgroup, lane = thread_index_in_simdgroup;
        uint warp = simdgroup_index_in_threadgroup, base = threadgroup_position_in_grid.x * BLOCK;
        threadgroup int s[BLOCK];
        threadgroup int warp_total[BLOCK / 32];
        s[tid] = inp[base + tid];
        int v = s[tid];
        if (lane >= 1) s[tid] = v = s[tid - 1] + v;
        if (lane >= 2) s[tid] = v = s[tid - 2] + v;
        if (lane >= 4) s[tid] = v = s[tid - 4] + v;
        if (lane >= 8) s[tid] = v = s[tid - 8] + v;
        if (lane >= 16) s[tid] = v = s[tid - 16] + v;
        if (lane == 31) warp_total[warp] = v;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (warp == 0 && lane < BLOCK / 32) {
            int t = warp_total[lane];
            if (lane >= 1) warp_total[lane] = t = warp_total[lane - 1] + t;
            if (lane >= 2) warp_total[lane] = t = warp_total[lane - 2] + t;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        out[base + tid] = v + (warp > 0 ? warp_total[warp - 1] : 0);
    """
    return Case(src, {"inp": x}, {"out": ((BLOCK * GROUPS,), "int32")},
                lambda inp: [np.cumsum(inp.reshape(GROUPS, BLOCK), axis=1).reshape(-1).astype(np.int32)],
                (BLOCK * GROUPS, 1, 1), (BLOCK, 1, 1), header=f"constant constexpr uint BLOCK = {BLOCK};\n",
                lockstep=True)

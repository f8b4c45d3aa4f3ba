"""Block sum: a barrier tree down to 64 partial sums, then the last 32 lanes unrolled with no barrier (lockstep)."""
from _case import Case, rng

MODELLED_ON = ("NVIDIA 'Optimizing Parallel Reduction in CUDA' (Harris), kernel 6: first add during load, tree with "
               "barriers while more than 32 lanes take part, then the last simdgroup unrolled through a volatile "
               "pointer with no barrier (as its Metal ports write it)")
FEATURES = ("lockstep simdgroup: reduction tree across lanes without barriers", "volatile threadgroup pointer",
            "first add during load", "several threadgroups")

BLOCK, GROUPS = 128, 4


def case() -> Case:
    x = rng(46).standard_normal(2 * BLOCK * GROUPS)
    src = """
        uint tid = thread_index_in_threadgroup, gid = threadgroup_position_in_grid.x;
        threadgroup float sdata[BLOCK];
        uint i = gid * (BLOCK * 2) + tid;
        sdata[tid] = inp[i] + inp[i + BLOCK];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint s = BLOCK / 2; s > 32; s >>= 1) {
            if (tid < s) sdata[tid] += sdata[tid + s];
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        if (tid < 32) {  // one simdgroup: its lanes run together, no barrier needed on Apple GPUs
            volatile threadgroup float* v = sdata;
            v[tid] += v[tid + 32];
            v[tid] += v[tid + 16];
            v[tid] += v[tid + 8];
            v[tid] += v[tid + 4];
            v[tid] += v[tid + 2];
            v[tid] += v[tid + 1];
        }
        if (tid == 0) out[gid] = sdata[0];
    """
    return Case(src, {"inp": x}, {"out": ((GROUPS,), "float32")},
                lambda inp: [inp.reshape(GROUPS, 2 * BLOCK).sum(axis=1)], (BLOCK * GROUPS, 1, 1), (BLOCK, 1, 1),
                header=f"constant constexpr uint BLOCK = {BLOCK};\n", rtol=1e-4, atol=1e-4, lockstep=True)

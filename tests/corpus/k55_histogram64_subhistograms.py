"""64-bin histogram of bytes: one sub-histogram per simdgroup in a 2-D threadgroup array of atomics, merged per bin
and added to the output with device atomics."""
import numpy as np
from _case import Case, rng

MODELLED_ON = ("NVIDIA CUDA SDK histogram64 (Podlozhnyuk, 'Histogram calculation in CUDA'): per-warp sub-histograms "
               "in shared memory, merged per bin, global atomicAdd")
FEATURES = ("2-D threadgroup array of atomic_uint", "atomic_fetch_add_explicit on threadgroup and device memory",
            "uint8 input (input_dtypes)", "atomic_outputs", "init_value=0")

N, NSG, GROUPS = 1000, 4, 2


def case() -> Case:
    data = rng(55).integers(0, 256, size=N).astype(np.uint8)
    src = """
        const uint tid = thread_index_in_threadgroup, sg = simdgroup_index_in_threadgroup;
        threadgroup atomic_uint sub[NSG][64];
        for (uint b = tid; b < NSG * 64; b += NSG * 32) atomic_store_explicit(&sub[b / 64][b % 64], 0u, memory_order_relaxed);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint i = thread_position_in_grid.x; i < N; i += threads_per_grid.x)
            atomic_fetch_add_explicit(&sub[sg][data[i] >> 2], 1u, memory_order_relaxed);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (tid < 64) {
            uint total = 0;
            for (uint s = 0; s < NSG; ++s) total += atomic_load_explicit(&sub[s][tid], memory_order_relaxed);
            atomic_fetch_add_explicit(&hist[tid], total, memory_order_relaxed);
        }
    """
    return Case(src, {"data": data}, {"hist": ((64,), "uint32")},
                lambda data: [np.bincount(data >> 2, minlength=64).astype(np.uint32)], (32 * NSG * GROUPS, 1, 1),
                (32 * NSG, 1, 1), header=f"constant constexpr uint N = {N}, NSG = {NSG};\n", input_dtypes=["uint8"],
                atomic_outputs=True, init_value=0.0)

"""256-bin byte histogram: privatised threadgroup atomic bins, merged into device bins with atomics."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "NVIDIA 'GPU Pro Tip: Fast Histograms Using Shared Atomics' (shared-memory privatisation) in Metal"
FEATURES = ("threadgroup atomic_uint array", "atomic_store / fetch_add / load", "uint8 input", "atomic_outputs",
            "grid-stride loop")


def case() -> Case:
    data = rng(32).integers(0, 256, size=10000).astype(np.uint8)
    src = """
        threadgroup atomic_uint bins[256];
        uint t = thread_index_in_threadgroup;
        for (uint b = t; b < 256; b += threads_per_threadgroup.x) atomic_store_explicit(&bins[b], 0u, memory_order_relaxed);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint i = thread_position_in_grid.x; i < N; i += threads_per_grid.x)
            atomic_fetch_add_explicit(&bins[data[i]], 1u, memory_order_relaxed);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint b = t; b < 256; b += threads_per_threadgroup.x) {
            uint c = atomic_load_explicit(&bins[b], memory_order_relaxed);
            if (c) atomic_fetch_add_explicit(&hist[b], c, memory_order_relaxed);
        }
    """
    return Case(src, {"data": data}, {"hist": ((256,), "uint32")},
                lambda data: [np.bincount(data, minlength=256).astype(np.uint32)], (1024, 1, 1), (128, 1, 1),
                header="constant constexpr uint N = 10000;\n", atomic_outputs=True, init_value=0)

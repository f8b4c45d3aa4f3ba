"""Sum of a large array: per-thread strided loop, simd_sum, threadgroup partials, one atomic add per threadgroup."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "MLX kernels/reduction (all_reduce) and the classic CUDA 'reduce6' with a final atomicAdd"
FEATURES = ("atomic<float> output", "simd_sum", "threadgroup partials", "grid-stride loop", "threads_per_grid")


def case() -> Case:
    n = 5000
    x = rng(12).standard_normal(n)
    src = """
        uint gid = thread_position_in_grid.x, lid = thread_index_in_threadgroup;
        threadgroup float partial[4];
        float acc = 0.0f;
        for (uint i = gid; i < N; i += threads_per_grid.x) acc += inp[i];
        acc = simd_sum(acc);
        if (thread_index_in_simdgroup == 0) partial[simdgroup_index_in_threadgroup] = acc;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (lid == 0) atomic_fetch_add_explicit(&out[0], partial[0] + partial[1] + partial[2] + partial[3],
                                                memory_order_relaxed);
    """
    return Case(src, {"inp": x}, {"out": ((1,), "float32")}, lambda inp: [np.array([inp.sum()])], (512, 1, 1),
                (128, 1, 1), header=f"constant constexpr uint N = {n};\n", atomic_outputs=True, init_value=0.0,
                rtol=1e-4, atol=1e-4)

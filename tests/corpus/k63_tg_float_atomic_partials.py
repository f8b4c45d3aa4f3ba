"""Bucketed sums: per-threadgroup partials in threadgroup atomic<float>, then one device float atomic per bucket and
threadgroup through a cast of the output pointer."""
import numpy as np
from _case import Case, rng

MODELLED_ON = ("MLX kernels/reduction/reduce_all.h (the atomic path): a threadgroup partial, then an atomic add of it "
               "into the output (mlx_atomic_fetch_add_explicit)")
FEATURES = ("threadgroup atomic<float> array", "atomic_store / atomic_fetch_add / atomic_load on threadgroup floats",
            "float atomics via (device atomic<float>*) cast", "uint32 bucket ids (input_dtypes)", "init_value=0")

N, B, TG = 300, 4, 64


def case() -> Case:
    r = rng(63)
    vals = r.standard_normal(N)
    bucket = r.integers(0, B, size=N).astype(np.uint32)
    src = """
        const uint tid = thread_index_in_threadgroup, i = thread_position_in_grid.x;
        threadgroup atomic<float> part[B];
        if (tid < B) atomic_store_explicit(&part[tid], 0.0f, memory_order_relaxed);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (i < N) atomic_fetch_add_explicit(&part[bucket[i]], vals[i], memory_order_relaxed);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (tid < B) {
            device atomic<float>* o = (device atomic<float>*) out;
            atomic_fetch_add_explicit(&o[tid], atomic_load_explicit(&part[tid], memory_order_relaxed),
                                      memory_order_relaxed);
        }
    """
    return Case(src, {"vals": vals, "bucket": bucket}, {"out": ((B,), "float32")},
                lambda vals, bucket: [np.bincount(bucket, weights=vals, minlength=B)], (320, 1, 1), (TG, 1, 1),
                header=f"constant constexpr uint N = {N}, B = {B};\n", input_dtypes=["float32", "uint32"],
                init_value=0.0, rtol=1e-4, atol=1e-4)

"""Block bitonic sort in threadgroup memory: compare-exchange stages separated by barriers."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "MLX kernels/sort.h: block_sort (bitonic merge in threadgroup memory)"
FEATURES = ("nested loops of barriers", "threadgroup float array", "select", "xor partner index")


def case() -> Case:
    n = 128
    x = rng(19).standard_normal(n)
    src = """
        uint t = thread_index_in_threadgroup;
        threadgroup float v[N];
        v[t] = inp[t];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint k = 2; k <= N; k <<= 1) {
            for (uint j = k >> 1; j > 0; j >>= 1) {
                uint p = t ^ j;
                float a = v[t], b = v[p];
                threadgroup_barrier(mem_flags::mem_threadgroup);
                bool up = (t & k) == 0;
                bool take_min = (t < p) == up;
                v[t] = select(max(a, b), min(a, b), take_min);
                threadgroup_barrier(mem_flags::mem_threadgroup);
            }
        }
        out[t] = v[t];
    """
    return Case(src, {"inp": x}, {"out": ((n,), "float32")}, lambda inp: [np.sort(inp)], (n, 1, 1), (n, 1, 1),
                header=f"constant constexpr uint N = {n};\n")

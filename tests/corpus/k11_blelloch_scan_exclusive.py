"""Work-efficient exclusive scan (up-sweep / down-sweep) in threadgroup memory with a barrier per level."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "GPU Gems 3 ch. 39 (Blelloch) exclusive scan, as ported in public Metal scan samples"
FEATURES = ("threadgroup tree with barriers in loops", "uint buffers", "bit shifts", "early-exit-free barriers")


def case() -> Case:
    n = 128
    x = rng(11).integers(0, 1000, size=n).astype(np.uint32)
    src = """
        uint t = thread_index_in_threadgroup;
        threadgroup uint temp[256];
        temp[2 * t] = inp[2 * t];
        temp[2 * t + 1] = inp[2 * t + 1];
        uint offset = 1;
        for (uint d = N >> 1; d > 0; d >>= 1) {
            threadgroup_barrier(mem_flags::mem_threadgroup);
            if (t < d) { uint ai = offset * (2 * t + 1) - 1, bi = offset * (2 * t + 2) - 1; temp[bi] += temp[ai]; }
            offset *= 2;
        }
        if (t == 0) temp[N - 1] = 0;
        for (uint d = 1; d < N; d *= 2) {
            offset >>= 1;
            threadgroup_barrier(mem_flags::mem_threadgroup);
            if (t < d) {
                uint ai = offset * (2 * t + 1) - 1, bi = offset * (2 * t + 2) - 1;
                uint x = temp[ai]; temp[ai] = temp[bi]; temp[bi] += x;
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        out[2 * t] = temp[2 * t];
        out[2 * t + 1] = temp[2 * t + 1];
    """
    ref = lambda inp: [np.concatenate([[0], np.cumsum(inp)[:-1]]).astype(np.uint32)]  # noqa: E731
    return Case(src, {"inp": x}, {"out": ((n,), "uint32")}, ref, (n // 2, 1, 1), (n // 2, 1, 1),
                header=f"constant constexpr uint N = {n};\n")

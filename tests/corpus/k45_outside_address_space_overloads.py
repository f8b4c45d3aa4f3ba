"""Outside the subset (documented): helper overloads that differ only by address space. On the CPU the
address-space qualifiers vanish, so the two overloads are one function defined twice (a compile error)."""

from _case import Case, rng

MODELLED_ON = "MLX kernels/steel loaders: helpers overloaded for `device` and `threadgroup` pointers"
FEATURES = ("overloads by address space", "threadgroup staging", "device pointer helper")


def case() -> Case:
    x = rng(45).standard_normal(32)
    header = """
inline float load2(const device float* p, uint i) { return p[i] * 2.0f; }
inline float load2(const threadgroup float* p, uint i) { return p[i] * 2.0f; }
"""
    src = """
        threadgroup float tile[32];
        uint t = thread_index_in_threadgroup;
        tile[t] = load2(inp, t);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        out[t] = load2(tile, 31 - t);
    """
    return Case(src, {"inp": x}, {"out": ((32,), "float32")}, lambda inp: [4 * inp[::-1]], (32, 1, 1), (32, 1, 1),
                header=header, expect="outside",
                reason="address-space qualifiers vanish on the CPU: overloads that differ only by them collide")

"""Split-K GEMM: each z-slice of the grid computes a K-range partial product and adds it with atomic<float>."""

from _case import Case, rng

MODELLED_ON = "Split-K GEMM with atomic accumulation (CUTLASS 'serial/parallel split-K' reduction) as an MLX kernel"
FEATURES = ("atomic_outputs with float", "3-D grid (z = split)", "threadgroup 2-D tiles", "barriers in a K loop")


def case() -> Case:
    m, n, k, splits = 16, 16, 64, 4
    r = rng(36)
    a, b = r.standard_normal((m, k)), r.standard_normal((k, n))
    src = """
        threadgroup float As[8][8];
        threadgroup float Bs[8][8];
        uint2 tp = thread_position_in_threadgroup.xy;
        uint col = thread_position_in_grid.x, row = thread_position_in_grid.y, split = thread_position_in_grid.z;
        float acc = 0.0f;
        for (uint k0 = split * (K / S); k0 < (split + 1) * (K / S); k0 += 8) {
            As[tp.y][tp.x] = A[row * K + k0 + tp.x];
            Bs[tp.y][tp.x] = B[(k0 + tp.y) * N + col];
            threadgroup_barrier(mem_flags::mem_threadgroup);
            for (uint kk = 0; kk < 8; ++kk) acc += As[tp.y][kk] * Bs[kk][tp.x];
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        atomic_fetch_add_explicit(&C[row * N + col], acc, memory_order_relaxed);
    """
    header = f"constant constexpr uint K = {k}, N = {n}, S = {splits};\n"
    return Case(src, {"A": a, "B": b}, {"C": ((m, n), "float32")}, lambda A, B: [A @ B], (n, m, splits), (8, 8, 1),
                header=header, atomic_outputs=True, init_value=0.0, rtol=1e-4, atol=1e-4)

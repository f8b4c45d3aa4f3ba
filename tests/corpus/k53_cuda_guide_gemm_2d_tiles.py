"""Tiled matrix product with two-dimensional threadgroup tiles (padded rows), ragged edges guarded."""
from _case import Case, rng

MODELLED_ON = ("CUDA C Programming Guide, Shared Memory: matrix multiplication with __shared__ float "
               "As[BLOCK_SIZE][BLOCK_SIZE] tiles (as Metal tutorials port it, with a padding column)")
FEATURES = ("2-D threadgroup arrays", "thread_position_in_threadgroup.xy swizzle", "uint2 positions",
            "ragged edges")

M, N, K, TILE = 20, 24, 36, 8


def case() -> Case:
    r = rng(53)
    a, b = r.standard_normal((M, K)), r.standard_normal((K, N))
    src = """
        const uint2 t = thread_position_in_threadgroup.xy, g = threadgroup_position_in_grid.xy;
        const uint row = g.y * TILE + t.y, col = g.x * TILE + t.x;
        threadgroup float As[TILE][TILE + 1];
        threadgroup float Bs[TILE][TILE + 1];
        float acc = 0.0f;
        for (uint k0 = 0; k0 < K; k0 += TILE) {
            As[t.y][t.x] = (row < M && k0 + t.x < K) ? A[row * K + k0 + t.x] : 0.0f;
            Bs[t.y][t.x] = (k0 + t.y < K && col < N) ? B[(k0 + t.y) * N + col] : 0.0f;
            threadgroup_barrier(mem_flags::mem_threadgroup);
            for (uint k = 0; k < TILE; ++k) acc += As[t.y][k] * Bs[k][t.x];
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        if (row < M && col < N) C[row * N + col] = acc;
    """
    return Case(src, {"A": a, "B": b}, {"C": ((M, N), "float32")}, lambda A, B: [A @ B], (N, M + 4, 1), (TILE, TILE, 1),
                header=f"constant constexpr uint M = {M}, N = {N}, K = {K}, TILE = {TILE};\n", rtol=1e-4, atol=1e-4)

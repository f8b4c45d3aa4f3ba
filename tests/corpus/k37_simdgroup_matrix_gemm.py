"""8x8 simdgroup_matrix GEMM tile: load A and B fragments from threadgroup memory, multiply-accumulate, store."""

from _case import Case, rng

MODELLED_ON = "MLX kernels/steel/gemm/mma.h: BlockMMA with simdgroup_float8x8 (simdgroup_load / multiply_accumulate)"
FEATURES = ("simdgroup_float8x8", "simdgroup_load / store", "simdgroup_multiply_accumulate",
            "make_filled_simdgroup_matrix", "threadgroup staging")


def case() -> Case:
    m, n, k = 16, 16, 32
    r = rng(37)
    a, b = r.standard_normal((m, k)), r.standard_normal((k, n))
    src = """
        threadgroup float As[8 * 8];
        threadgroup float Bs[8 * 8];
        uint lane = thread_index_in_simdgroup;
        uint2 tile = threadgroup_position_in_grid.xy;
        simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
        for (uint k0 = 0; k0 < K; k0 += 8) {
            for (uint e = lane; e < 64; e += 32) {
                As[e] = A[(tile.y * 8 + e / 8) * K + k0 + e % 8];
                Bs[e] = B[(k0 + e / 8) * N + tile.x * 8 + e % 8];
            }
            threadgroup_barrier(mem_flags::mem_threadgroup);
            simdgroup_float8x8 fa, fb;
            simdgroup_load(fa, As, 8);
            simdgroup_load(fb, Bs, 8);
            simdgroup_multiply_accumulate(acc, fa, fb, acc);
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        simdgroup_store(acc, C + tile.y * 8 * N + tile.x * 8, N);
    """
    return Case(src, {"A": a, "B": b}, {"C": ((m, n), "float32")}, lambda A, B: [A @ B], (32 * 2, 2, 1), (32, 1, 1),
                header=f"constant constexpr uint K = {k}, N = {n};\n", rtol=1e-4, atol=1e-4)

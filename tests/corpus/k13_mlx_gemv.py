"""Matrix-vector product: one simdgroup per row, float4 loads, simd_sum."""

from _case import Case, rng

MODELLED_ON = "MLX kernels/gemv.metal: GEMVKernel (per-simdgroup rows, vectorised loads, simd_sum)"
FEATURES = ("float4 pointer casts", "dot", "simd_sum", "2-D threadgroup (x lanes, y rows)")


def case() -> Case:
    m, k = 8, 128
    r = rng(13)
    a, x = r.standard_normal((m, k)), r.standard_normal(k)
    src = """
        uint row = threadgroup_position_in_grid.y * 4 + thread_position_in_threadgroup.y;
        uint lane = thread_index_in_simdgroup;
        const device float4* ar = (const device float4*)(mat + row * K);
        const device float4* xv = (const device float4*)vec;
        float acc = 0;
        for (uint c = lane; c < K / 4; c += 32) acc += dot(ar[c], xv[c]);
        acc = simd_sum(acc);
        if (lane == 0) out[row] = acc;
    """
    return Case(src, {"mat": a, "vec": x}, {"out": ((m,), "float32")}, lambda mat, vec: [mat @ vec], (32, m, 1),
                (32, 4, 1), header=f"constant constexpr uint K = {k};\n", rtol=1e-5, atol=1e-5)

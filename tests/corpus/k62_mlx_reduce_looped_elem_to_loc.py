"""Sum over two non-contiguous axes (0 and 2) of a 3-D array, one simdgroup per output: each lane walks its share of
the reduced elements with LoopedElemToLoc, then simd_sum."""
from _case import Case, rng

MODELLED_ON = ("MLX kernels/reduction/reduce_row.h and reduce_col.h: LoopedElemToLoc over the reduction's shape and "
               "strides (row_reduce_looped)")
FEATURES = ("MLX utils: LoopedElemToLoc (next, next(n), location)", "strided reduction", "simd_sum", "x_shape")

D0, D1, D2 = 6, 5, 8


def case() -> Case:
    x = rng(62).standard_normal((D0, D1, D2))
    src = """
        const uint j = threadgroup_position_in_grid.x, lane = thread_index_in_simdgroup;
        const int rshape[2] = {x_shape[0], x_shape[2]};
        const int64_t rstrides[2] = {int64_t(x_shape[1]) * x_shape[2], 1};
        const int total = rshape[0] * rshape[1];
        LoopedElemToLoc<2, int64_t> loop(2);
        loop.next(int(lane), rshape, rstrides);
        float acc = 0.0f;
        for (int k = int(lane); k < total; k += 32) {
            acc += x[int64_t(j) * x_shape[2] + loop.location()];
            loop.next(32, rshape, rstrides);
        }
        acc = simd_sum(acc);
        if (lane == 0) out[j] = acc;
    """
    return Case(src, {"x": x}, {"out": ((D1,), "float32")}, lambda x: [x.sum(axis=(0, 2))], (32 * D1, 1, 1), (32, 1, 1),
                rtol=1e-5, atol=1e-5)

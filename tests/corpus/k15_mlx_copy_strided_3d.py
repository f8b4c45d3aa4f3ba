"""Strided copy of a transposed 3-D view with a 3-D grid and elem_to_loc on a uint3 position."""

from _case import Case, rng

MODELLED_ON = "MLX kernels/copy.h: copy_g_nd3 / copy_g (elem_to_loc on a uint3 grid position)"
FEATURES = ("elem_to_loc(uint3, shape, strides, ndim)", "3-D grid", "constant arrays in the body")


def case() -> Case:
    a = rng(15).standard_normal((3, 4, 5))
    src = """
        uint3 pos = thread_position_in_grid;
        constexpr int shape[3] = {5, 4, 3};
        constexpr int64_t strides[3] = {1, 5, 20};  // the transposed view (2, 1, 0) of a (3, 4, 5) array
        int64_t src_idx = elem_to_loc(pos, shape, strides, 3);
        out[(pos.z * 4 + pos.y) * 3 + pos.x] = inp[src_idx];
    """
    return Case(src, {"inp": a}, {"out": ((5, 4, 3), "float32")}, lambda inp: [inp.transpose(2, 1, 0)], (3, 4, 5),
                (3, 4, 1))

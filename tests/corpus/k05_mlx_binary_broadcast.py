"""Binary op with broadcasting: each operand located through its own strides (elem_to_loc_2)."""

from _case import Case, rng

MODELLED_ON = "MLX kernels/binary.h: binary_g_nd2 with per-operand strides"
FEATURES = ("elem_to_loc_2", "uint2 grid position", "2-D grid", "constant strides arrays")


def case() -> Case:
    r = rng(5)
    a, b = r.standard_normal((5, 9)), r.standard_normal((1, 9))
    src = """
        uint2 index = thread_position_in_grid.xy;
        constexpr int64_t a_st[2] = {9, 1};
        constexpr int64_t b_st[2] = {0, 1};
        auto a_idx = elem_to_loc_2(index, a_st);
        auto b_idx = elem_to_loc_2(index, b_st);
        out[index.y * 9 + index.x] = a[a_idx] * b[b_idx] + 1.0f;
    """
    return Case(src, {"a": a, "b": b}, {"out": ((5, 9), "float32")}, lambda a, b: [a * b + 1], (9, 5, 1), (16, 4, 1))

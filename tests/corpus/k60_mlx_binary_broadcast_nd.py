"""Broadcast binary op over a 3-D grid: each thread finds its element in both inputs with elem_to_loc_2_nd, given
the inputs' strides with broadcast dimensions set to zero."""
from _case import Case, rng

MODELLED_ON = "MLX kernels/binary.h: binary_g (general strided binary op, elem_to_loc_2_nd over a 3-D grid)"
FEATURES = ("MLX utils: elem_to_loc_2_nd", "a_shape / a_strides / b_shape / b_strides", "broadcast strides",
            "uint3 grid positions", "header helper with a template")

S = (3, 4, 8)


def case() -> Case:
    r = rng(60)
    a, b = r.standard_normal((3, 1, 8)), r.standard_normal((1, 4, 1))
    header = """
// Strides of an input broadcast to the output's shape: zero along its dimensions of extent 1.
template <int N> inline void broadcast_strides(const constant int* shape, const constant int64_t* strides,
                                               thread int64_t* out) {
    for (int d = 0; d < N; ++d) out[d] = shape[d] == 1 ? 0 : strides[d];
}
"""
    src = """
        const int out_shape[3] = {3, 4, 8};
        int64_t as[3], bs[3];
        broadcast_strides<3>(a_shape, a_strides, as);
        broadcast_strides<3>(b_shape, b_strides, bs);
        const uint3 pos = thread_position_in_grid;
        const auto loc = elem_to_loc_2_nd(pos, out_shape, as, bs, 3);
        const uint o = (pos.z * 4 + pos.y) * 8 + pos.x;
        out[o] = a[loc.x] * 2.0f - b[loc.y];
    """
    return Case(src, {"a": a, "b": b}, {"out": (S, "float32")}, lambda a, b: [a * 2 - b], (8, 4, 3), (8, 4, 1),
                header=header)

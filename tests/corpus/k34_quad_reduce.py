"""2x2 box filter by quads: each quad of lanes averages its four values with quad_sum and quad_broadcast."""

from _case import Case, rng

MODELLED_ON = "Metal quad-group functions as used in image downsampling (mip generation) compute kernels"
FEATURES = ("quad_sum", "quad_broadcast", "quad_shuffle_xor", "thread_index_in_quadgroup", "quadgroup_index")


def case() -> Case:
    x = rng(34).standard_normal(128)
    src = """
        uint i = thread_position_in_grid.x;
        uint q = thread_index_in_quadgroup;
        float v = x[i];
        float avg = quad_sum(v) * 0.25f;
        float first = quad_broadcast(v, 0);
        float partner = quad_shuffle_xor(v, 1);
        if (q == 0) down[i / 4] = avg;
        mixed[i] = first + partner;
    """

    def ref(x):
        g = x.reshape(-1, 4)
        partner = x.reshape(-1, 2)[:, ::-1].reshape(-1)
        return [g.mean(1), g[:, :1].repeat(4, 1).reshape(-1) + partner]
    return Case(src, {"x": x}, {"down": ((32,), "float32"), "mixed": ((128,), "float32")}, ref, (128, 1, 1),
                (64, 1, 1))

"""Element-wise exp with a template type parameter and no header (the preamble gives metal::)."""
from _case import Case, rng

MODELLED_ON = "MLX documentation, Custom Metal Kernels: the `myexp` element-wise example"
FEATURES = ("template T", "metal::exp", "empty header", "thread_position_in_grid")


def case() -> Case:
    a = rng(1).standard_normal(1000)
    src = """
        uint elem = thread_position_in_grid.x;
        T tmp = inp[elem];
        out[elem] = metal::exp(tmp);
    """
    import numpy as np
    return Case(src, {"inp": a}, {"out": ((1000,), "float32")}, lambda inp: [np.exp(inp)], (1000, 1, 1), (256, 1, 1),
                template=(("T", "float32"),), rtol=1e-5)

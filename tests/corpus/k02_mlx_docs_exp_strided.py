"""Element-wise exp over a strided input located with elem_to_loc (ensure_row_contiguous=False style)."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "MLX documentation, Custom Metal Kernels: the strided `myexp_strided` example using elem_to_loc"
FEATURES = ("elem_to_loc", "inp_shape / inp_strides / inp_ndim", "MLX preamble", "template T")


def case() -> Case:
    a = rng(2).standard_normal((6, 7))
    src = """
        uint elem = thread_position_in_grid.x;
        uint loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
        T tmp = inp[loc];
        out[elem] = metal::exp(tmp);
    """
    return Case(src, {"inp": a}, {"out": ((6, 7), "float32")}, lambda inp: [np.exp(inp)], (42, 1, 1), (32, 1, 1),
                template=(("T", "float32"),))

"""Exact GELU with erf, and its tanh approximation in a second output."""
import math

import numpy as np
from _case import Case, rng

MODELLED_ON = "MLX nn.gelu / nn.gelu_approx as a custom element-wise kernel (metal::erf, metal::precise::tanh)"
FEATURES = ("erf", "precise::tanh", "M_SQRT1_2_F", "M_2_SQRTPI_F", "two outputs")


def case() -> Case:
    x = rng(20).standard_normal(500) * 3
    src = """
        uint i = thread_position_in_grid.x;
        if (i >= 500) return;
        float v = x[i];
        exact[i] = 0.5f * v * (1.0f + erf(v * M_SQRT1_2_F));
        float c = 0.5f * M_2_SQRTPI_F * M_SQRT2_F;
        approx[i] = 0.5f * v * (1.0f + metal::precise::tanh(c * (v + 0.044715f * v * v * v)));
    """

    def ref(x):
        erf = np.vectorize(math.erf)
        return [0.5 * x * (1 + erf(x / np.sqrt(2))),
                0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))]
    return Case(src, {"x": x}, {"exact": ((500,), "float32"), "approx": ((500,), "float32")}, ref, (512, 1, 1),
                (128, 1, 1), rtol=1e-5, atol=1e-6)

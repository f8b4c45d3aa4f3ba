"""SiLU and tanh-GELU over float4 elements with ggml's GELU constants."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "llama.cpp ggml-metal.metal: kernel_silu_4 and kernel_gelu_4 (GELU_COEF_A, SQRT_2_OVER_PI, precise::tanh)"
FEATURES = ("float4 element-wise math", "metal::exp on float4", "precise::tanh on float4", "constants in header")


def case() -> Case:
    x = rng(28).standard_normal(256) * 2
    header = """
constant float GELU_COEF_A = 0.044715f;
constant float SQRT_2_OVER_PI = 0.79788456080286535587989211986876f;
"""
    src = """
        uint tpig = thread_position_in_grid.x;
        float4 v = ((const device float4*)src0)[tpig];
        ((device float4*)silu)[tpig] = v / (1.0f + exp(-v));
        ((device float4*)gelu)[tpig] = 0.5f * v * (1.0f + precise::tanh(SQRT_2_OVER_PI * v * (1.0f + GELU_COEF_A * v * v)));
    """

    def ref(src0):
        return [src0 / (1 + np.exp(-src0)),
                0.5 * src0 * (1 + np.tanh(0.7978845608028654 * src0 * (1 + 0.044715 * src0 ** 2)))]
    return Case(src, {"src0": x}, {"silu": ((256,), "float32"), "gelu": ((256,), "float32")}, ref, (64, 1, 1),
                (32, 1, 1), header=header, rtol=1e-5, atol=1e-6)

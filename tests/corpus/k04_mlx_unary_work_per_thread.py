"""Element-wise op where each thread handles WorkPerThread<T>::n elements, with a ragged tail."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "MLX kernels/unary.h: unary_v2 with WorkPerThread and a bounds-checked tail"
FEATURES = ("WorkPerThread", "half input", "float16 output", "metal::abs", "loop with tail")


def case() -> Case:
    n = 1003
    a = rng(4).standard_normal(n).astype(np.float16)
    src = """
        constexpr int N_ = WorkPerThread<T>::n;
        uint base = thread_position_in_grid.x * N_;
        for (int k = 0; k < N_ && base + k < size; ++k) out[base + k] = T(metal::abs(inp[base + k]) * T(2));
    """
    header = f"constant constexpr uint size = {n};\n"
    return Case(src, {"inp": a}, {"out": ((n,), "float16")}, lambda inp: [np.abs(inp.astype(np.float16)) * 2],
                ((n + 3) // 4, 1, 1), (64, 1, 1), header=header, template=(("T", "float16"),),
                dtype="float16", rtol=1e-3)

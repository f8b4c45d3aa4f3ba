"""Copy float32 to float16 with round-to-nearest-even, including overflow to infinity and subnormals."""
import numpy as np
from _case import Case

MODELLED_ON = "llama.cpp ggml-metal.metal: kernel_cpy_f32_f16"
FEATURES = ("float to half conversion", "half output", "infinity and subnormal halves")


def case() -> Case:
    x = np.array([0.0, 1.0, -2.5, 65504.0, 70000.0, 1e-6, 3.0e-8, -1e9, 0.1, 1.0 / 3.0] * 4, dtype=np.float32)
    src = """
        uint i = thread_position_in_grid.x;
        dst[i] = half(src0[i]);
    """
    def ref(src0):
        with np.errstate(over="ignore"):  # 70000 and -1e9 overflow to infinity, as on the GPU
            return [src0.astype(np.float32).astype(np.float16).astype(np.float64)]
    return Case(src, {"src0": x}, {"dst": ((40,), "float16")}, ref, (40, 1, 1), (40, 1, 1),
                input_dtypes=["float32"], rtol=0, atol=0)

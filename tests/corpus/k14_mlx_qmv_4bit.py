"""4-bit affine-quantized matrix-vector product: uint32 words (8 nibbles) beside float16 scales and biases."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "MLX kernels/quantized.h: qmv_fast (bits=4, group_size=32, scales and biases per group)"
FEATURES = ("mixed dtypes: uint32 words, float16 scales/biases, float32 x", "bit extraction", "simd_sum",
            "half to float conversion")


def case() -> Case:
    rows, cols, group = 4, 128, 32
    r = rng(14)
    q = r.integers(0, 16, size=(rows, cols)).astype(np.uint32)
    words = np.zeros((rows, cols // 8), dtype=np.uint32)
    for k in range(8):
        words |= q[:, k::8] << np.uint32(4 * k)
    scales = (r.standard_normal((rows, cols // group)) * 0.1).astype(np.float16)
    biases = (r.standard_normal((rows, cols // group)) * 0.1).astype(np.float16)
    x = r.standard_normal(cols).astype(np.float32)
    src = """
        uint row = threadgroup_position_in_grid.x, simd_lid = thread_index_in_simdgroup;
        float acc = 0;
        for (uint w = simd_lid; w < COLS / 8; w += 32) {
            uint packed = w_q[row * (COLS / 8) + w];
            uint g = (w * 8) / GROUP;
            float s = scales[row * (COLS / GROUP) + g], b = biases[row * (COLS / GROUP) + g];
            for (int k = 0; k < 8; ++k) acc += (s * float((packed >> (4 * k)) & 0xf) + b) * x[w * 8 + k];
        }
        acc = simd_sum(acc);
        if (simd_lid == 0) y[row] = acc;
    """

    def ref(w_q, scales, biases, x):
        deq = scales.astype(np.float64).repeat(group, 1) * q + biases.astype(np.float64).repeat(group, 1)
        return [deq @ x]
    return Case(src, {"w_q": words, "scales": scales, "biases": biases, "x": x}, {"y": ((rows,), "float32")}, ref,
                (32 * rows, 1, 1), (32, 1, 1), header=f"constant constexpr uint COLS = {cols}, GROUP = {group};\n",
                input_dtypes=["uint32", "float16", "float16", "float32"], rtol=1e-4, atol=1e-4)

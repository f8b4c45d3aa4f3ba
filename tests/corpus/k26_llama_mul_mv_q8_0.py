"""int8 weights with a float16 scale per block of 32, dotted with a float32 vector (exact int8 buffer)."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "llama.cpp ggml-metal.metal: kernel_mul_mv_q8_0_f32 (int8 qs, half d per 32-block)"
FEATURES = ("int8 buffer (exact, signed)", "float16 scales", "char4 vector loads", "simd_sum", "mixed dtypes")


def case() -> Case:
    rows, k = 4, 128
    r = rng(26)
    q = r.integers(-128, 128, size=(rows, k)).astype(np.int8)
    d = (r.random((rows, k // 32)) * 0.05).astype(np.float16)
    x = r.standard_normal(k).astype(np.float32)
    src = """
        uint row = threadgroup_position_in_grid.x, lane = thread_index_in_simdgroup;
        const device char4* q4 = (const device char4*)(qs + row * K);
        float acc = 0;
        for (uint c = lane; c < K / 4; c += 32) {
            char4 v = q4[c];
            float s = d[row * (K / 32) + (c * 4) / 32];
            acc += s * dot(float4(v), float4(x[4 * c], x[4 * c + 1], x[4 * c + 2], x[4 * c + 3]));
        }
        acc = simd_sum(acc);
        if (lane == 0) dst[row] = acc;
    """

    def ref(qs, d, x):
        w = qs.astype(np.float64) * d.astype(np.float64).repeat(32, 1)
        return [w @ x]
    return Case(src, {"qs": q, "d": d, "x": x}, {"dst": ((rows,), "float32")}, ref, (32 * rows, 1, 1), (32, 1, 1),
                header=f"constant constexpr uint K = {k};\n", input_dtypes=["int8", "float16", "float32"],
                rtol=1e-4, atol=1e-4)

"""Complex multiply-divide on interleaved float pairs viewed as MLX's complex64_t."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "MLX kernels/complex.h and binary_ops.h: complex64_t arithmetic (Multiply, Divide, Add) on complex arrays"
FEATURES = ("MLX utils: complex64_t (.real / .imag, * / + -)", "device float* viewed as complex64_t*",
            "complex64_t comparison")

N = 50


def case() -> Case:
    r = rng(61)
    a, b = r.standard_normal((N, 2)), r.standard_normal((N, 2)) + 2.0
    src = """
        const uint i = thread_position_in_grid.x;
        if (i >= N) return;
        const device complex64_t* za = (const device complex64_t*) a;
        const device complex64_t* zb = (const device complex64_t*) b;
        device complex64_t* zo = (device complex64_t*) out;
        const complex64_t x = za[i], y = zb[i];
        complex64_t v = x * y + complex64_t(1.0f, 0.0f) / y - x;
        if (x > y) v = -v;
        zo[i] = v;
    """

    def ref(a, b):
        x, y = a[:, 0] + 1j * a[:, 1], b[:, 0] + 1j * b[:, 1]
        v = x * y + 1 / y - x
        greater = (a[:, 0] > b[:, 0]) | ((a[:, 0] == b[:, 0]) & (a[:, 1] > b[:, 1]))
        v = np.where(greater, -v, v)
        return [np.stack([v.real, v.imag], axis=1)]
    return Case(src, {"a": a, "b": b}, {"out": ((N, 2), "float32")}, ref, (64, 1, 1), (32, 1, 1),
                header=f"constant constexpr uint N = {N};\n", rtol=1e-5, atol=1e-5)

"""Rotary position embedding: pairs rotated by position * inverse frequency, sin and cos from sincos."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "MLX kernels/rope.metal: rope_single / rope (theta = pos * base^(-2i/d), metal::precise)"
FEATURES = ("sincos", "metal::exp2", "metal::log2", "float2 from pairs", "2-D grid")


def case() -> Case:
    seq, d = 6, 16
    x = rng(17).standard_normal((seq, d))
    src = """
        uint i = thread_position_in_grid.x, pos = thread_position_in_grid.y;
        float inv_freq = metal::exp2(-float(2 * i) / D * metal::log2(10000.0f));
        float theta = float(pos) * inv_freq;
        float c;
        float s = sincos(theta, c);
        float2 v = float2(x[pos * D + 2 * i], x[pos * D + 2 * i + 1]);
        out[pos * D + 2 * i] = v.x * c - v.y * s;
        out[pos * D + 2 * i + 1] = v.x * s + v.y * c;
    """

    def ref(x):
        i = np.arange(d // 2)
        theta = np.arange(seq)[:, None] * 10000.0 ** (-2 * i / d)
        c, s = np.cos(theta), np.sin(theta)
        o = np.empty_like(x)
        o[:, 0::2] = x[:, 0::2] * c - x[:, 1::2] * s
        o[:, 1::2] = x[:, 0::2] * s + x[:, 1::2] * c
        return [o]
    return Case(src, {"x": x}, {"out": ((seq, d), "float32")}, ref, (d // 2, seq, 1), (8, 6, 1),
                header=f"constant constexpr uint D = {d};\n", rtol=1e-4, atol=1e-5)

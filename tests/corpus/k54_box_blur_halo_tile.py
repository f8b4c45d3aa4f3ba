"""3x3 box blur of an image: each threadgroup stages its tile and a one-pixel apron (edges clamped) in a 2-D
threadgroup array, then averages."""
import numpy as np
from _case import Case, rng

MODELLED_ON = ("NVIDIA 'Image Convolution with CUDA' (Podlozhnyuk, CUDA SDK convolutionSeparable / convolutionTexture):"
               " a tile plus its apron staged in shared memory, clamp-to-edge")
FEATURES = ("2-D threadgroup array with an apron", "several loads per thread", "clamp", "2-D grid")

H, W, TS = 21, 19, 8


def case() -> Case:
    img = rng(54).uniform(0, 1, size=(H, W))
    src = """
        const int2 t = int2(thread_position_in_threadgroup.xy);
        const int2 origin = int2(threadgroup_position_in_grid.xy) * TS - 1;
        threadgroup float tile[TS + 2][TS + 2];
        for (int y = t.y; y < TS + 2; y += TS) {
            for (int x = t.x; x < TS + 2; x += TS) {
                const int gy = clamp(origin.y + y, 0, H - 1), gx = clamp(origin.x + x, 0, W - 1);
                tile[y][x] = img[gy * W + gx];
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        const int2 p = origin + 1 + t;
        if (p.x >= W || p.y >= H) return;
        float s = 0.0f;
        for (int dy = 0; dy < 3; ++dy)
            for (int dx = 0; dx < 3; ++dx) s += tile[t.y + dy][t.x + dx];
        out[p.y * W + p.x] = s / 9.0f;
    """

    def ref(img):
        pad = np.pad(img, 1, mode="edge")
        return [sum(pad[dy:dy + H, dx:dx + W] for dy in range(3) for dx in range(3)) / 9]
    return Case(src, {"img": img}, {"out": ((H, W), "float32")}, ref, (24, 24, 1), (TS, TS, 1),
                header=f"constant constexpr int H = {H}, W = {W}, TS = {TS};\n", rtol=1e-5, atol=1e-6)

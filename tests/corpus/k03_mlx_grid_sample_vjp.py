"""Bilinear scatter of gradients into an image with atomic<float> outputs."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "MLX documentation, Custom Metal Kernels: grid_sample VJP with atomic_outputs=True"
FEATURES = ("atomic_outputs", "atomic_fetch_add_explicit on atomic<float>", "floor", "int casts", "init_value=0")

H, W, N = 8, 8, 200


def case() -> Case:
    r = rng(3)
    pts = r.uniform(0, W - 1.001, size=(N, 2))
    g = r.standard_normal(N)
    src = """
        uint i = thread_position_in_grid.x;
        if (i >= NPTS) return;
        float x = pts[2 * i], y = pts[2 * i + 1];
        int x0 = int(floor(x)), y0 = int(floor(y));
        float fx = x - x0, fy = y - y0;
        float gv = grad[i];
        atomic_fetch_add_explicit(&img[y0 * W + x0], gv * (1 - fx) * (1 - fy), memory_order_relaxed);
        atomic_fetch_add_explicit(&img[y0 * W + x0 + 1], gv * fx * (1 - fy), memory_order_relaxed);
        atomic_fetch_add_explicit(&img[(y0 + 1) * W + x0], gv * (1 - fx) * fy, memory_order_relaxed);
        atomic_fetch_add_explicit(&img[(y0 + 1) * W + x0 + 1], gv * fx * fy, memory_order_relaxed);
    """
    header = f"constant constexpr uint NPTS = {N};\nconstant constexpr int W = {W};\n"

    def ref(pts, grad):
        img = np.zeros((H, W))
        for (x, y), gv in zip(pts.reshape(-1, 2), grad):
            x0, y0 = int(np.floor(x)), int(np.floor(y))
            fx, fy = x - x0, y - y0
            img[y0, x0] += gv * (1 - fx) * (1 - fy)
            img[y0, x0 + 1] += gv * fx * (1 - fy)
            img[y0 + 1, x0] += gv * (1 - fx) * fy
            img[y0 + 1, x0 + 1] += gv * fx * fy
        return [img]
    return Case(src, {"pts": pts.reshape(-1), "grad": g}, {"img": ((H, W), "float32")}, ref, (256, 1, 1), (64, 1, 1),
                header=header, atomic_outputs=True, init_value=0.0, rtol=1e-4, atol=1e-4)

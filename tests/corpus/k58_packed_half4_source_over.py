"""Source-over compositing of half-precision RGBA pixels stored as packed_half4, with .rgb / .a swizzles of packed
vectors, written back as packed_half4."""
import numpy as np
from _case import Case, rng

MODELLED_ON = ("Apple's 'Processing a Texture in a Compute Function' sample style, on buffers of packed half RGBA "
               "pixels: Porter-Duff source-over (Core Image CISourceOverCompositing)")
FEATURES = ("packed_half4 buffers through casts", ".rgb / .a swizzles of packed vectors", "half arithmetic",
            "packed_half4 from half4", "float16 kernel dtype")

NPIX = 70


def case() -> Case:
    r = rng(58)
    fg = r.uniform(0, 1, size=(NPIX, 4)).astype(np.float16)
    bg = r.uniform(0, 1, size=(NPIX, 4)).astype(np.float16)
    src = """
        const uint i = thread_position_in_grid.x;
        if (i >= NPIX) return;
        const device packed_half4* f = (const device packed_half4*) fg;
        const device packed_half4* b = (const device packed_half4*) bg;
        device packed_half4* o = (device packed_half4*) out;
        const packed_half4 src = f[i], dst = b[i];
        const half a = src.a + dst.a * (1.0h - src.a);
        const half3 rgb = src.rgb * src.a + dst.rgb * dst.a * (1.0h - src.a);
        o[i] = packed_half4(half4(rgb / max(a, 1e-3h), a));
    """

    def ref(fg, bg):
        f, b = fg.astype(np.float64), bg.astype(np.float64)
        a = f[:, 3] + b[:, 3] * (1 - f[:, 3])
        rgb = f[:, :3] * f[:, 3:] + b[:, :3] * b[:, 3:] * (1 - f[:, 3:])
        return [np.concatenate([rgb / np.maximum(a, 1e-3)[:, None], a[:, None]], axis=1)]
    return Case(src, {"fg": fg, "bg": bg}, {"out": ((NPIX, 4), "float16")}, ref, (96, 1, 1), (32, 1, 1),
                header=f"constant constexpr uint NPIX = {NPIX};\n", dtype="float16", rtol=1e-2, atol=1e-2)

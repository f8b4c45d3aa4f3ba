"""Triangle normals from packed_float3 vertices: cross, normalize, length, and a packed store."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "Apple Metal sample code style mesh processing (packed_float3 vertex buffers, cross / normalize)"
FEATURES = ("packed_float3 reinterpretation of a float buffer", "cross", "normalize", "length", ".rgb swizzle")


def case() -> Case:
    tris = 10
    v = rng(39).standard_normal((tris, 3, 3))
    src = """
        uint t = thread_position_in_grid.x;
        const device packed_float3* p = (const device packed_float3*)verts;
        float3 a = p[3 * t], b = p[3 * t + 1], c = p[3 * t + 2];
        float3 nrm = normalize(cross(b - a, c - a));
        device packed_float3* o = (device packed_float3*)normals;
        float4 color = float4(nrm, 1.0f);
        o[t] = color.rgb;
        area[t] = 0.5f * length(cross(b - a, c - a));
    """

    def ref(verts):
        vv = verts.reshape(tris, 3, 3)
        cr = np.cross(vv[:, 1] - vv[:, 0], vv[:, 2] - vv[:, 0])
        ln = np.linalg.norm(cr, axis=1)
        return [cr / ln[:, None], 0.5 * ln]
    return Case(src, {"verts": v.reshape(-1)}, {"normals": ((tris, 3), "float32"), "area": ((tris,), "float32")},
                ref, (tris, 1, 1), (tris, 1, 1), rtol=1e-4, atol=1e-5)

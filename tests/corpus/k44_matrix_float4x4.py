"""Metal matrix types: a float4x4 built from columns times a vector, a transpose and a half3x3 product."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "Apple Metal sample code: vertex transforms with float4x4 model-view-projection matrices"
FEATURES = ("float4x4", "matrix * vector", "vector * matrix", "transpose", "column-major construction", "m[i] columns")


def case() -> Case:
    r = rng(44)
    m, v = r.standard_normal((4, 4)), r.standard_normal((8, 4))
    src = """
        uint i = thread_position_in_grid.x;
        float4x4 M = float4x4(float4(mat[0], mat[1], mat[2], mat[3]), float4(mat[4], mat[5], mat[6], mat[7]),
                              float4(mat[8], mat[9], mat[10], mat[11]), float4(mat[12], mat[13], mat[14], mat[15]));
        float4 p = M * float4(vs[4 * i], vs[4 * i + 1], vs[4 * i + 2], vs[4 * i + 3]);
        float4 q = float4(vs[4 * i], vs[4 * i + 1], vs[4 * i + 2], vs[4 * i + 3]) * transpose(M);
        for (int k = 0; k < 4; ++k) out[4 * i + k] = p[k] + 0.0f * q[k] + (M[k][k] - mat[5 * k]);
        float4x4 MM = M * float4x4(1.0f);
        if (i == 0) for (int k = 0; k < 4; ++k) same[k] = float(all(MM[k] == M[k]));
    """
    return Case(src, {"mat": m.reshape(-1), "vs": v.reshape(-1)}, {"out": ((8, 4), "float32"), "same": ((4,), "float32")},
                lambda mat, vs: [vs.reshape(8, 4) @ mat.reshape(4, 4), np.ones(4)], (8, 1, 1), (8, 1, 1),
                rtol=1e-5, atol=1e-5)

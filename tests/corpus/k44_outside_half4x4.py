"""Outside the subset (documented): Metal matrix types (half4x4, float4x4, matrix<T, C, R>) and their arithmetic."""
import numpy as np

from _case import Case, rng

MODELLED_ON = "Apple Metal sample code: vertex transforms with float4x4 model-view-projection matrices"
FEATURES = ("float4x4", "matrix * vector", "column-major matrix construction")


def case() -> Case:
    r = rng(44)
    m, v = r.standard_normal((4, 4)), r.standard_normal((8, 4))
    src = """
        uint i = thread_position_in_grid.x;
        float4x4 M = float4x4(float4(mat[0], mat[1], mat[2], mat[3]), float4(mat[4], mat[5], mat[6], mat[7]),
                              float4(mat[8], mat[9], mat[10], mat[11]), float4(mat[12], mat[13], mat[14], mat[15]));
        float4 p = M * float4(vs[4 * i], vs[4 * i + 1], vs[4 * i + 2], vs[4 * i + 3]);
        for (int k = 0; k < 4; ++k) out[4 * i + k] = p[k];
    """
    return Case(src, {"mat": m.reshape(-1), "vs": v.reshape(-1)}, {"out": ((8, 4), "float32")},
                lambda mat, vs: [vs.reshape(8, 4) @ mat.reshape(4, 4)], (8, 1, 1), (8, 1, 1), expect="outside",
                reason="matrix types (floatNxM, halfNxM, matrix<T, C, R>) are not in the shim yet")

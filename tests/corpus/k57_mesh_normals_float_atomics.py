"""Vertex normals of a triangle mesh: each thread takes one triangle, computes its (area-weighted) face normal from
packed_float3 corners and adds it to its three vertices with float atomics reached through a cast of the device
float* output (no atomic_outputs)."""
import numpy as np
from _case import Case, rng

MODELLED_ON = ("MLX's scatter-add / VJP kernels (atomic_fetch_add_explicit on device atomic<float>* obtained by "
               "casting the output pointer) applied to mesh vertex-normal accumulation")
FEATURES = ("float atomics via (device atomic<float>*) cast of a device float*", "packed_float3 vertices", "cross",
            "uint32 indices beside float32 positions (input_dtypes)", "init_value=0")

NV, NF = 40, 90


def case() -> Case:
    r = rng(57)
    verts = r.standard_normal((NV, 3))
    faces = np.stack([r.choice(NV, size=3, replace=False) for _ in range(NF)]).astype(np.uint32)
    src = """
        const uint f = thread_position_in_grid.x;
        if (f >= NF) return;
        const device packed_float3* v = (const device packed_float3*) verts;
        const uint i0 = faces[3 * f], i1 = faces[3 * f + 1], i2 = faces[3 * f + 2];
        const float3 n = cross(v[i1] - v[i0], v[i2] - v[i0]);
        for (uint k = 0; k < 3; ++k) {
            device atomic<float>* dst = (device atomic<float>*) (normals + 3 * faces[3 * f + k]);
            atomic_fetch_add_explicit(dst + 0, n.x, memory_order_relaxed);
            atomic_fetch_add_explicit(dst + 1, n.y, memory_order_relaxed);
            atomic_fetch_add_explicit(dst + 2, n.z, memory_order_relaxed);
        }
    """

    def ref(verts, faces):
        verts, faces = verts.reshape(NV, 3), faces.reshape(NF, 3)
        n = np.cross(verts[faces[:, 1]] - verts[faces[:, 0]], verts[faces[:, 2]] - verts[faces[:, 0]])
        out = np.zeros((NV, 3))
        for k in range(3):
            np.add.at(out, faces[:, k], n)
        return [out]
    return Case(src, {"verts": verts.reshape(-1), "faces": faces.reshape(-1)}, {"normals": ((NV, 3), "float32")}, ref,
                (96, 1, 1), (32, 1, 1), header=f"constant constexpr uint NF = {NF};\n",
                input_dtypes=["float32", "uint32"], init_value=0.0, rtol=1e-4, atol=1e-4)

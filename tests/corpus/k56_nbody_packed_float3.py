"""All-pairs gravitational acceleration: positions read as packed_float3 (12 bytes each), tiles of bodies staged in
threadgroup memory, accelerations written as packed_float3."""
import numpy as np
from _case import Case, rng

MODELLED_ON = ("GPU Gems 3, ch. 31 (Nyland, Harris, Prins), 'Fast N-Body Simulation with CUDA': tiles of bodies in "
               "shared memory, softened body-body interaction (the CUDA SDK nbody sample)")
FEATURES = ("packed_float3 through a cast of a device float*", "packed vector members .x .y .z",
            "packed - packed arithmetic giving float3", "rsqrt", "threadgroup float4 tile", "dot")

NB, TILE = 96, 32
EPS2 = 0.01


def case() -> Case:
    r = rng(56)
    pos = r.standard_normal((NB, 3))
    mass = r.uniform(0.5, 1.5, size=NB)
    src = """
        const uint i = thread_position_in_grid.x, t = thread_index_in_threadgroup;
        const device packed_float3* p = (const device packed_float3*) pos;
        device packed_float3* a = (device packed_float3*) acc;
        const packed_float3 me = p[i];
        threadgroup float4 tile[TILE];
        float3 sum = float3(0.0f);
        for (uint base = 0; base < NB; base += TILE) {
            const packed_float3 q = p[base + t];
            tile[t] = float4(q.x, q.y, q.z, mass[base + t]);
            threadgroup_barrier(mem_flags::mem_threadgroup);
            for (uint j = 0; j < TILE; ++j) {
                const float4 other = tile[j];
                const float3 d = other.xyz - me;
                const float inv = rsqrt(dot(d, d) + EPS2);
                sum += d * (other.w * inv * inv * inv);
            }
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        a[i] = sum;
    """

    def ref(pos, mass):
        pos = pos.reshape(NB, 3)
        d = pos[None, :, :] - pos[:, None, :]
        inv = (np.sum(d * d, axis=2) + EPS2) ** -1.5
        return [np.sum(d * (mass[None, :] * inv)[:, :, None], axis=1)]
    return Case(src, {"pos": pos.reshape(-1), "mass": mass}, {"acc": ((NB, 3), "float32")}, ref, (NB, 1, 1),
                (TILE, 1, 1), header=f"constant constexpr uint NB = {NB}, TILE = {TILE};\n"
                f"constant constexpr float EPS2 = {EPS2}f;\n", rtol=1e-4, atol=1e-4)

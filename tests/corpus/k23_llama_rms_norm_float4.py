"""RMS norm over float4 elements with a shared sum[32] across simdgroups."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "llama.cpp ggml-metal.metal: kernel_rms_norm (float4 sums, simd_sum, shared_memory[32])"
FEATURES = ("float4 device pointer", "simd_sum", "threadgroup float[32] with zero init", "barriers",
            "tiisg / sgitg names")


def case() -> Case:
    rows, ne00 = 2, 256
    x = rng(23).standard_normal((rows, ne00))
    src = """
        uint tgpig = threadgroup_position_in_grid.x, tpitg = thread_position_in_threadgroup.x;
        uint ntg = threads_per_threadgroup.x, tiisg = thread_index_in_simdgroup, sgitg = simdgroup_index_in_threadgroup;
        threadgroup float shared_memory[32];
        if (sgitg == 0) shared_memory[tiisg] = 0.0f;
        const device float4* x4 = (const device float4*)(src0 + tgpig * NE00);
        float sumf = 0;
        for (uint i00 = tpitg; i00 < NE00 / 4; i00 += ntg) sumf += dot(x4[i00], x4[i00]);
        sumf = simd_sum(sumf);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (tiisg == 0) shared_memory[sgitg] = sumf;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        sumf = shared_memory[tiisg];
        sumf = simd_sum(sumf);
        const float scale = 1.0f / sqrt(sumf / NE00 + 1e-6f);
        device float4* y = (device float4*)(dst + tgpig * NE00);
        for (uint i00 = tpitg; i00 < NE00 / 4; i00 += ntg) y[i00] = x4[i00] * scale;
    """
    return Case(src, {"src0": x}, {"dst": ((rows, ne00), "float32")},
                lambda src0: [src0 / np.sqrt((src0 ** 2).mean(1, keepdims=True) + 1e-6)], (64 * rows, 1, 1),
                (64, 1, 1), header=f"constant constexpr uint NE00 = {ne00};\n", rtol=1e-5)

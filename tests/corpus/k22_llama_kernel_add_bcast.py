"""Broadcast add of a row vector over rows, addressed through byte strides (nb) like ggml tensors."""

from _case import Case, rng

MODELLED_ON = "llama.cpp ggml-metal.metal: kernel_add (ne/nb byte strides, i10 = i0 % ne10 broadcasting)"
FEATURES = ("device char* byte addressing", "pointer casts", "modulo broadcasting", "args struct in header")


def case() -> Case:
    r = rng(22)
    a, b = r.standard_normal((4, 24)), r.standard_normal(24)
    header = """
struct ggml_add_args { int ne00, ne01, ne10; ulong nb01, nb00, nb10; };
constant constexpr ggml_add_args args = {24, 4, 24, 24 * 4, 4, 4};
"""
    src = """
        uint i01 = threadgroup_position_in_grid.x, tpitg = thread_position_in_threadgroup.x;
        const device char* src0_ptr = (const device char*)src0 + i01 * args.nb01;
        device char* dst_ptr = (device char*)dst + i01 * args.nb01;
        for (int i0 = tpitg; i0 < args.ne00; i0 += threads_per_threadgroup.x) {
            const int i10 = i0 % args.ne10;
            *((device float*)(dst_ptr + i0 * args.nb00)) =
                *((const device float*)(src0_ptr + i0 * args.nb00)) + *((const device float*)((const device char*)src1 + i10 * args.nb10));
        }
    """
    return Case(src, {"src0": a, "src1": b}, {"dst": ((4, 24), "float32")}, lambda src0, src1: [src0 + src1],
                (4 * 16, 1, 1), (16, 1, 1), header=header)

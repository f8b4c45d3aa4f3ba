"""Sum of each row by a single thread per row (ggml's simple kernel_sum_rows), with ggml's byte strides."""

from _case import Case, rng

MODELLED_ON = "llama.cpp ggml-metal.metal: kernel_sum_rows"
FEATURES = ("one thread per row", "uint64 strides in a struct", "device char* arithmetic")


def case() -> Case:
    x = rng(31).standard_normal((7, 33))
    header = "struct sum_rows_args { long ne00; ulong nb01; };\nconstant sum_rows_args args = {33, 33 * 4};\n"
    src = """
        uint r = thread_position_in_grid.x;
        if (r >= 7) return;
        const device float* row = (const device float*)((const device char*)src0 + r * args.nb01);
        float s = 0.0f;
        for (long i = 0; i < args.ne00; ++i) s += row[i];
        dst[r] = s;
    """
    return Case(src, {"src0": x}, {"dst": ((7,), "float32")}, lambda src0: [src0.sum(1)], (8, 1, 1), (8, 1, 1),
                header=header, rtol=1e-5, atol=1e-5)

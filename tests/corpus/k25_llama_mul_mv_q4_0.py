"""Matrix-vector product over ggml block_q4_0 blocks (half scale + 16 bytes of nibbles) read from a uint8 buffer."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "llama.cpp ggml-metal.metal: kernel_mul_mv_q4_0_f32 (block_q4_0 {half d; uint8_t qs[16]})"
FEATURES = ("uint8 buffer reinterpreted as a struct with a half member", "nibble unpacking", "simd_sum",
            "packed struct layout")

QK = 32


def case() -> Case:
    rows, blocks = 4, 4
    r = rng(25)
    d = (r.random((rows, blocks)) * 0.1 + 0.01).astype(np.float16)
    q = r.integers(0, 16, size=(rows, blocks, QK)).astype(np.uint8)
    raw = np.zeros((rows, blocks, 18), dtype=np.uint8)
    raw[:, :, 0:2] = d.view(np.uint8).reshape(rows, blocks, 2)
    raw[:, :, 2:] = q[:, :, :16] | (q[:, :, 16:] << 4)
    x = r.standard_normal(blocks * QK).astype(np.float32)
    header = """
#define QK4_0 32
typedef struct { half d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
static_assert(sizeof(block_q4_0) == 18, "wrong q4_0 block size");
"""
    src = """
        uint row = threadgroup_position_in_grid.x, tiisg = thread_index_in_simdgroup;
        const device block_q4_0* xb = (const device block_q4_0*)(src0) + row * NB;
        float sumf = 0;
        for (uint ib = 0; ib < NB; ++ib) {
            if (tiisg < 16) {
                uint8_t byte = xb[ib].qs[tiisg];
                float lo = float(byte & 0x0F) - 8.0f, hi = float(byte >> 4) - 8.0f;
                sumf += float(xb[ib].d) * (lo * src1[ib * QK4_0 + tiisg] + hi * src1[ib * QK4_0 + tiisg + 16]);
            }
        }
        float all = simd_sum(sumf);
        if (tiisg == 0) dst[row] = all;
    """

    def ref(src0, src1):
        w = (q.astype(np.float64) - 8) * d.astype(np.float64)[:, :, None]
        return [w.reshape(rows, -1) @ src1]
    return Case(src, {"src0": raw.reshape(-1), "src1": x}, {"dst": ((rows,), "float32")}, ref, (32 * rows, 1, 1),
                (32, 1, 1), header=header + f"constant constexpr uint NB = {blocks};\n",
                input_dtypes=["uint8", "float32"], rtol=1e-4, atol=1e-4)

"""Bit statistics of 32-bit words: popcount, leading/trailing zeros, bit fields, reversal and mulhi."""
import numpy as np
from _case import Case, rng

MODELLED_ON = "Metal Shading Language integer functions as used by radix-sort digit extraction kernels"
FEATURES = ("popcount", "clz", "ctz", "extract_bits", "insert_bits", "reverse_bits", "mulhi", "uint4 output")


def case() -> Case:
    w = rng(33).integers(0, 2 ** 32, size=64, dtype=np.uint64).astype(np.uint32)
    w[0] = 0
    src = """
        uint i = thread_position_in_grid.x;
        uint v = words[i];
        ((device uint4*)out)[i] = uint4(popcount(v), clz(v), ctz(v), extract_bits(v, 8u, 8u));
        ((device uint2*)out2)[i] = uint2(reverse_bits(v), mulhi(v, 0x9E3779B9u) ^ insert_bits(v, 0xFu, 4u, 4u));
    """

    def ref(words):
        res, res2 = [], []
        for v in (int(x) for x in words):
            pc = bin(v).count("1")
            clz = 32 - v.bit_length()
            ctz = 32 if v == 0 else (v & -v).bit_length() - 1
            rev = int(f"{v:032b}"[::-1], 2)
            hi = (v * 0x9E3779B9) >> 32
            ins = (v & ~0xF0) | 0xF0
            res.append([pc, clz, ctz, (v >> 8) & 0xFF])
            res2.append([rev, hi ^ ins])
        return [np.array(res, dtype=np.uint32), np.array(res2, dtype=np.uint32)]
    return Case(src, {"words": w}, {"out": ((64, 4), "uint32"), "out2": ((64, 2), "uint32")}, ref, (64, 1, 1),
                (64, 1, 1))

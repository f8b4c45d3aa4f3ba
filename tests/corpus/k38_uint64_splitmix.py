"""splitmix64 hashing of uint64 seeds: 64-bit multiplies, shifts and xors, exact uint64 in and out."""
import numpy as np
from _case import Case

MODELLED_ON = "splitmix64 (Steele, Lea, Flood 2014) as used for per-thread seeding in public Metal RNG kernels"
FEATURES = ("uint64 input and output buffers (exact)", "ulong arithmetic wrap-around", "64-bit constants")


def case() -> Case:
    seeds = np.array([0, 1, 2 ** 63, 2 ** 64 - 1, 12345678901234567890, 42, 7, 2 ** 32], dtype=np.uint64)
    src = """
        uint i = thread_position_in_grid.x;
        ulong z = seeds[i] + 0x9E3779B97F4A7C15ul;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ul;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBul;
        out[i] = z ^ (z >> 31);
    """

    def ref(seeds):
        m = (1 << 64) - 1
        out = []
        for s in (int(v) for v in seeds):
            z = (s + 0x9E3779B97F4A7C15) & m
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
            out.append(z ^ (z >> 31))
        return [np.array(out, dtype=np.uint64)]
    return Case(src, {"seeds": seeds}, {"out": ((8,), "uint64")}, ref, (8, 1, 1), (8, 1, 1))

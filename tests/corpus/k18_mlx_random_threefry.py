"""Counter-based random bits: Threefry-2x32 rounds with rotate on uint2."""
import numpy as np
from _case import Case

MODELLED_ON = "MLX kernels/random.metal: threefry2x32_hash (rotations, key schedule, uint2 state)"
FEATURES = ("rotate", "uint2 arithmetic and xor", "constant arrays", "uint32 output", "exact integer wrap-around")

ROT = [13, 15, 26, 6, 17, 29, 16, 24]


def case() -> Case:
    n = 64
    src = """
        uint i = thread_position_in_grid.x;
        constexpr uint rot[8] = {13, 15, 26, 6, 17, 29, 16, 24};
        uint k0 = key[0], k1 = key[1], k2 = k0 ^ k1 ^ 0x1BD11BDAu;
        uint ks[3] = {k0, k1, k2};
        uint2 x = uint2(i + ks[0], 0u + ks[1]);
        for (int r = 0; r < 5; ++r) {
            for (int j = 0; j < 4; ++j) {
                x.x += x.y;
                x.y = rotate(x.y, rot[(r % 2) * 4 + j]);
                x.y ^= x.x;
            }
            x.x += ks[(r + 1) % 3];
            x.y += ks[(r + 2) % 3] + uint(r + 1);
        }
        out[2 * i] = x.x;
        out[2 * i + 1] = x.y;
    """

    def ref(key):
        m = 0xFFFFFFFF
        k0, k1 = int(key[0]), int(key[1])
        ks = [k0, k1, k0 ^ k1 ^ 0x1BD11BDA]
        out = []
        for i in range(n):
            x0, x1 = (i + ks[0]) & m, ks[1] & m
            for r in range(5):
                for j in range(4):
                    x0 = (x0 + x1) & m
                    s = ROT[(r % 2) * 4 + j]
                    x1 = ((x1 << s) | (x1 >> (32 - s))) & m
                    x1 ^= x0
                x0 = (x0 + ks[(r + 1) % 3]) & m
                x1 = (x1 + ks[(r + 2) % 3] + r + 1) & m
            out += [x0, x1]
        return [np.array(out, dtype=np.uint32)]
    return Case(src, {"key": np.array([0xDEADBEEF, 42], dtype=np.uint32)}, {"out": ((2 * n,), "uint32")}, ref,
                (n, 1, 1), (32, 1, 1))

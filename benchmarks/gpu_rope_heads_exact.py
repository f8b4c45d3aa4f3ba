"""Issue 43 (sixteenth session): on the GPU, does MLX's RoPE with one offset a head (the patch's joined step: the
queries' and keys' heads at the position, the values' at 0) give the queries and keys of the call that turns only
theirs bit for bit, and the values unchanged? Prints one line a case and exits 1 on any difference.

    python3 benchmarks/gpu_rope_heads_exact.py        (any MLX back-end: --cpu forces the CPU)
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    import mlx.core as mx

    if "--cpu" in argv:
        mx.set_default_device(mx.cpu)
    bad = 0
    for dtype in (mx.float16, mx.bfloat16, mx.float32):
        for nh, nkv, d in ((32, 32, 128), (32, 8, 128), (14, 2, 64)):
            x = (mx.random.normal((nh + 2 * nkv, 1, 1, d), key=mx.random.key(nh + d)) * 20).astype(dtype)
            for kw in ({"base": 500000.0}, {"base": None, "freqs": mx.random.uniform(1, 8000, (d // 2,))}):
                for position in (0, 1, 77, 4095):
                    offsets = mx.array([position] * (nh + nkv) + [0] * nkv, dtype=mx.int32)
                    got = mx.fast.rope(x, d, traditional=False, scale=1.0, offset=offsets, **kw)
                    want = mx.fast.rope(x[:nh + nkv].reshape(1, nh + nkv, 1, d), d, traditional=False, scale=1.0,
                                        offset=mx.array([position], dtype=mx.int32), **kw)
                    same = mx.array_equal(got[:nh + nkv].reshape(want.shape), want).item()
                    kept = mx.array_equal(got[nh + nkv:], x[nh + nkv:]).item()
                    bad += not (same and kept)
                    print(f"{dtype} heads {nh}/{nkv} D {d} {'freqs' if 'freqs' in kw else 'base'} position "
                          f"{position}: queries and keys {'identical' if same else 'DIFFER'}, values "
                          f"{'unchanged' if kept else 'CHANGED'}")
    print(f"device {mx.default_device()}: {bad} case(s) differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

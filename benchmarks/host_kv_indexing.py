"""Host cost of a KV cache update's Python indexing (issue 43): mlx-lm's ``KVCache.update_and_fetch`` against the
same two writes and two slices indexed ``[:, :, a:b]`` (``_patch_step._written``) instead of ``[..., a:b, :]``; the
graph is built, evaluated every 100 updates (outside the timing). Least of 5 runs of 100 updates, µs an update.

    .venv/bin/python benchmarks/host_kv_indexing.py   (MLX's CPU back-end is enough: this is Python's and MLX's
                                                        graph building, not the device's work)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def main() -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    k = mx.zeros((1, 32, 1, 128), dtype=mx.float16)
    v = mx.zeros((1, 32, 1, 128), dtype=mx.float16)

    def bench(name: str, fn: Callable[[Any], Any]) -> None:
        times = []
        for _ in range(5):
            c = KVCache()
            c.update_and_fetch(mx.zeros((1, 32, 100, 128), mx.float16), mx.zeros((1, 32, 100, 128), mx.float16))
            mx.eval(c.keys, c.values)
            t = time.perf_counter()
            for _ in range(100):
                fn(c)
            times.append((time.perf_counter() - t) / 100 * 1e6)
            mx.eval(c.keys, c.values)
        print(f"{name:44s} {min(times):6.2f} us", flush=True)

    def lean(c: Any) -> Any:
        p, e = c.offset, c.offset + 1
        c.keys[:, :, p:e] = k
        c.values[:, :, p:e] = v
        c.offset = e
        return c.keys[:, :, :e], c.values[:, :, :e]

    def write_ellipsis(c: Any) -> None:
        c.keys[..., c.offset:c.offset + 1, :] = k
        c.offset += 1

    def write_plain(c: Any) -> None:
        c.keys[:, :, c.offset:c.offset + 1] = k
        c.offset += 1

    bench("update_and_fetch (mlx-lm)", lambda c: c.update_and_fetch(k, v))
    bench("the same, [:, :, a:b] (_patch_step._written)", lean)
    bench("one write [..., a:b, :]", write_ellipsis)
    bench("one write [:, :, a:b]", write_plain)
    bench("one slice [..., :e, :]", lambda c: c.keys[..., :c.offset, :])
    bench("one slice [:, :, :e]", lambda c: c.keys[:, :, :c.offset])


if __name__ == "__main__":
    main()

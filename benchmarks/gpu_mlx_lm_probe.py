"""Where a patched mlx-lm decode spends its host time (issue 43): the patched model's decode rate was two-valued on
an H200 (224-253 tokens/s in most rounds, 324-352 in others, plain mlx-lm steady), and the plain model is GPU-bound.

Two copies of the same random Llama model (mlx-lm's own, quantized by mlx-lm): one left as mlx-lm runs it, one
patched once (``--forms`` names the patched forms: ``compiled`` is ``patch(model)``, ``eager`` is
``patch(model, compiled=False)``, ``nostep`` is ``patch(model)`` with RoPE left out of the
compiled step (mlx-lm's RoPE op by op on every token, as before the fourteenth session); each its own
copy, patched once); ``nochain`` (with ``benchmarks/data/s15/chain.patch`` applied: the fifteenth session's chains,
measured and not kept) is ``patch(model)`` with no block's tail chained to the next block's step (two compiled calls
a layer, as ``patch`` runs it). ``mlxcache`` is ``patch(model)`` decoding with caches
of a subclass of mlx-lm's KVCache (the same code), which the step leaves to mlx-lm's ``update_and_fetch`` (as before
the fourteenth session's cache write). Two what-if forms bound what fusing more would save (their tokens are not the model's: never a
product path): ``norope`` is ``patch(model)`` with no RoPE at all in the compiled step (what RoPE and the queries'
and keys' split cost a layer), ``nocache`` is ``patch(model)`` decoding with a cache that keeps nothing (mlx-lm's two
cache writes and two slices a layer gone; the attention reads the step's own keys only). Rounds interleave the forms (order rotating);
each round runs mlx-lm's ``generate_step`` for ``--tokens`` greedy tokens and records, per decoded token: the wall
time, the host time inside the model's forward (building the step's graph), inside ``mx.async_eval`` (MLX sending the
step's kernels: on the GPU back-ends the encoding runs on the calling thread) and the garbage collector's passes and
time. ``--gc-off`` disables the collector during each timed generation; ``--isolate CPU`` puts the main thread
alone on one CPU after the warm-up (MLX's and CUDA's threads moved to the others).

    python3 benchmarks/gpu_mlx_lm_probe.py --store S --out $OUT [--rounds 8] [--forms compiled,eager] [--gc-off]

``--dry`` runs a tiny config on MLX's CPU back-end (it checks the script, not the GPU).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class _Clock:
    """Host seconds inside each model's forward and the collector's passes, for the generation being timed."""

    def __init__(self) -> None:
        self.forward = 0.0
        self.send = 0.0
        self.gc_s = 0.0
        self.gc_n = 0
        self._gc_t = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_t = time.perf_counter()
        else:
            self.gc_s += time.perf_counter() - self._gc_t
            self.gc_n += 1

    def reset(self) -> None:
        self.forward = self.send = self.gc_s = 0.0
        self.gc_n = 0


def _timed_call(cls: type, clock: _Clock) -> None:
    original = cls.__call__

    def call(self: Any, *args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return original(self, *args, **kw)
        finally:
            clock.forward += time.perf_counter() - t

    cls.__call__ = call  # type: ignore[method-assign]


def _timed_async_eval(clock: _Clock) -> None:
    """``mx.async_eval`` timed (mlx-lm's loop looks it up on ``mlx.core`` at each call)."""
    import mlx.core as mx

    original = mx.async_eval

    def send(*args: Any) -> Any:
        t = time.perf_counter()
        try:
            return original(*args)
        finally:
            clock.send += time.perf_counter() - t

    mx.async_eval = send


def _generate(model: Any, prompt: Any, tokens: int, clock: _Clock, gc_off: bool) -> dict[str, float]:
    from mlx_lm.generate import generate_step

    gc.collect()
    if gc_off:
        gc.disable()
    n, t1 = 0, 0.0
    t0 = time.perf_counter()
    try:
        for i, _ in enumerate(generate_step(prompt, model, max_tokens=tokens)):
            if i == 0:
                t1 = time.perf_counter()
                clock.reset()
            n += 1
    finally:
        gc.enable()
    wall = time.perf_counter() - t1
    steps = max(1, n - 1)
    return {"tps": steps / wall, "ms_token": 1e3 * wall / steps, "forward_ms_token": 1e3 * clock.forward / steps,
            "send_ms_token": 1e3 * clock.send / steps,
            "gc_passes": clock.gc_n, "gc_ms": 1e3 * clock.gc_s, "prompt_s": t1 - t0}


def _patched(pkg: Any, model: Any, form: str, always: bool) -> Any:
    """``model`` patched in ``form`` (see the module's docstring)."""
    step = sys.modules[pkg.__name__ + "._patch_step"]
    passes = step._passes_offset
    if form == "nostep":  # the step's RoPE refused at patch time: the fourteenth session's "before"
        step._passes_offset = lambda rope: False
    try:
        report = pkg.patch(model, always=always, compiled=form != "eager")
    finally:
        step._passes_offset = passes
    if form == "nochain":  # only with data/s15/chain.patch applied (its link): the chains taken off again
        step.link(list(model.layers), False)
    if form == "norope":
        _without_rope(step, model)
    if form == "nocache":
        _keeping_nothing(model)
    if form == "mlxcache":
        _mlx_lm_updates(model)
    return report


def _mlx_lm_updates(model: Any) -> None:
    """``model`` decodes with caches of a subclass of mlx-lm's KVCache (its code), updated by ``update_and_fetch``."""
    from mlx_lm.models.cache import KVCache

    class Subclassed(KVCache):
        pass

    model.make_cache = lambda: [Subclassed() for _ in model.layers]


def _without_rope(step: Any, model: Any) -> None:
    """Each patched block's compiled step with RoPE taken out (what-if: the heads as the projection gives them)."""
    import mlx.core as mx

    for block in model.layers:
        state = vars(block).get("_kernsearch_patch")
        if state is not None and state.step is not None:
            def bare(x: Any, offset: Any, attn: Any = block.self_attn, state: Any = state) -> Any:
                return step._roped(attn, step._heads(attn, state, x), lambda t: t)

            state.step = mx.compile(bare)


def _keeping_nothing(model: Any) -> None:
    """``model`` decodes with caches that keep nothing (what-if: mlx-lm's cache writes and fetches gone)."""
    from mlx_lm.models.cache import KVCache

    class Forgetful(KVCache):
        def update_and_fetch(self, keys: Any, values: Any) -> Any:
            self.offset += keys.shape[2]
            return keys, values

    model.make_cache = lambda: [Forgetful() for _ in model.layers]


def _census(model: Any, prompt: Any, folder: Path) -> dict[str, int]:
    """The primitives of one decode token's graph (``mx.export_to_dot``'s node labels, counted): what
    ``mx.async_eval`` encodes a token, by kind."""
    import collections
    import re

    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    mx.eval(model(prompt[None, :16], cache=cache))
    logits = model(prompt[None, 16:17], cache=cache)
    dot = folder / "token.dot"
    mx.export_to_dot(str(dot), logits)
    labels = collections.Counter(re.findall(r'label ="([^"]+)"', dot.read_text()))
    dot.unlink()
    mx.eval(logits)
    return dict(labels.most_common())


def _isolate(cpu: int) -> str:
    """The calling (main) thread on ``cpu`` alone, the process's other threads (MLX's and CUDA's) on the other CPUs
    it may use: whether the patched decode's slow rounds are threads sharing the main thread's CPU."""
    import os
    import threading

    allowed = os.sched_getaffinity(0)
    others = allowed - {cpu}
    main_tid = threading.get_native_id()
    moved = 0
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        try:
            os.sched_setaffinity(tid, {cpu} if tid == main_tid else others)
            moved += tid != main_tid
        except OSError:
            pass
    return f"main thread {main_tid} on CPU {cpu}, {moved} other threads on {len(others)} CPUs"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=Path("artifacts"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--forms", default="compiled,eager")
    ap.add_argument("--gc-off", action="store_true")
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--census", action="store_true", help="count one decode token's primitives for each form")
    ap.add_argument("--isolate", type=int, default=None,
                    help="after the warm-up, the main thread alone on this CPU, every other thread of the process off it")
    a = ap.parse_args(argv)
    import mlx.core as mx

    from kernsearch import ArtifactStore
    from kernsearch.bench._mlx_lm import LmConfig, build_model, import_package

    cfg = (LmConfig(hidden=256, ffn=512, layers=2, heads=4, kv_heads=4, vocab=512) if a.dry else LmConfig())
    clock = _Clock()
    models: dict[str, Any] = {"plain": build_model(cfg, 0)}
    _timed_call(type(models["plain"]), clock)
    _timed_async_eval(clock)
    with tempfile.TemporaryDirectory() as tmp:
        pkg = import_package(ArtifactStore(a.store), Path(tmp))
        for form in a.forms.split(","):
            models[form] = build_model(cfg, 0)
            print(form, str(_patched(pkg, models[form], form, a.dry)).splitlines()[0], flush=True)
        prompt = mx.random.randint(0, cfg.vocab, (128,), key=mx.random.key(1))
        for m in models.values():  # warm-up: traces, plans, kernels built
            _generate(m, prompt, 4, clock, a.gc_off)
        if a.isolate is not None:
            print("isolated:", _isolate(a.isolate), flush=True)
        census = {name: _census(m, prompt, Path(tmp)) for name, m in models.items()} if a.census else {}
        for name, counts in census.items():
            print(f"census {name}: {sum(counts.values())} primitives a token: {counts}", flush=True)
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in models}
        names = list(models)
        for r in range(a.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                row = _generate(models[name], prompt, a.tokens, clock, a.gc_off)
                rows[name].append(row)
                print(f"round {r + 1} {name}: {row['tps']:.1f} tokens/s, {row['ms_token']:.3f} ms a token, forward "
                      f"(host) {row['forward_ms_token']:.3f} ms, async_eval {row['send_ms_token']:.3f} ms, gc {row['gc_passes']} passes {row['gc_ms']:.1f} ms",
                      flush=True)
    for name, rs in rows.items():
        print(f"{name}: median {statistics.median(x['tps'] for x in rs):.1f} tokens/s, forward "
              f"{statistics.median(x['forward_ms_token'] for x in rs):.3f} ms a token (host), async_eval "
              f"{statistics.median(x['send_ms_token'] for x in rs):.3f} ms")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "gpu_mlx_lm_probe.json").write_text(json.dumps({"gc_off": a.gc_off, "rows": rows, "census": census}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 35 on the GPU: where a decode step's host time goes, and how much of it the GPU can hide.

MLX's CUDA back-end records a commit's launches into a CUDA graph and starts the GPU only when the commit is sent
(every 100 ops or 1,000 MB on sm_90), so inside one ``mx.eval`` the host's work on a launch and the GPU's work add
up. This probe times one Llama-shaped step (``kernsearch bench decode``'s layers and package, from a store tuned on
this chip) written several ways, in one process, interleaved round by round:

- ``sync``: one ``mx.eval`` per token (what ``bench decode`` times);
- ``layer``: ``mx.async_eval`` of each layer's output (the GPU starts on layer 1 while the host builds layer 2);
- ``pipe``: mlx-lm's decode loop, the next token's graph built and sent before the current token is waited on;
- ``layerpipe``: both;

for plain MLX (concatenated Q/K/V and gate/up) and the package's four launches a layer, and the package again with
its CUDA sources handed to MLX as an ``#include`` of a file (MLX rebuilds and hashes a custom kernel's whole source
on every call: ~0.5 µs a KB). Run it again under ``MLX_USE_CUDA_GRAPHS=0`` (every launch sent at once) to compare::

    PYTHONPATH=/tmp/site:/tmp/site3 python3 benchmarks/gpu_pipeline_probe.py --store artifacts --out $OUT

Writes ``$OUT/gpu_pipeline_probe_<tag>.json``. ``--dry-run`` runs a 2-layer step on MLX's CPU back-end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernsearch.artifacts._artifacts import ArtifactStore
from kernsearch.bench._decode import Paired, pipelined_ms
from kernsearch.bench._run import fused_families, import_package
from kernsearch.bench._step import StepShape, bind_layer, build_layers, package_step, plain_step


def include_factory(mx: Any, folder: Path, make: Callable[..., Any]) -> Callable[[dict[str, Any], int], Any]:
    """The dispatcher's kernel factory, its CUDA header and source handed over as ``#include "<file>"``."""
    from kernsearch._rules_targets import kernel_text

    def one(text: str) -> str:
        body = kernel_text("cuda", text)
        path = folder / f"{hashlib.sha256(body.encode()).hexdigest()}.cuh"
        if not path.exists():
            path.write_text(body, encoding="utf-8")
        # MLX passes an input's shape/strides/ndim only when the source names them: keep the names in view.
        names = sorted(set(re.findall(r"\b\w+_(?:shape|strides|ndim)\b", body)))
        return f'#include "{path}"\n' + (f"// {' '.join(names)}\n" if names else "")

    def factory(source: dict[str, Any], shared_memory: int) -> Any:
        if source["target"] != "cuda":
            return make(source, shared_memory)
        return mx.fast.cuda_kernel(name=source["name"] + "_inc", input_names=list(source["input_names"]),
                                   output_names=list(source["output_names"]), source=one(source["source"]),
                                   header=one(source["header"]), shared_memory=shared_memory)

    return factory


def layer_step(step_layers: Callable[[Any, Callable[[Any], None]], list[Any]], mx: Any,
               mode: str) -> Callable[[Any], list[Any]]:
    hook = (lambda x: mx.async_eval(x)) if mode == "layer" else (lambda x: None)
    return lambda x: step_layers(x, hook)


def plain_layers(mx: Any, layers: list[Any]) -> Callable[[Any, Callable[[Any], None]], list[Any]]:
    """Plain MLX's concatenated form, one layer at a time (``bench``'s ``plain_step``), with a hook per layer."""
    one = [plain_step(mx, [lay], True) for lay in layers]

    def run(x: Any, hook: Callable[[Any], None]) -> list[Any]:
        kept: list[Any] = []
        for f in one:
            out = f(x)
            x = out[0]
            kept.extend(out[1:])
            hook(x)
        return [x, *kept]

    return run


def package_layers(bound: list[dict[str, Any]], hidden: int) -> Callable[[Any, Callable[[Any], None]], list[Any]]:
    return lambda x, hook: package_step(bound, hidden, 4, hook)(x)


def timed(mx: Any, step: Callable[[Any], list[Any]], x0: Any, pipe: bool, tokens: int) -> float:
    """ms per token over ``tokens`` dependent tokens (each token's input is the previous token's output)."""
    if pipe:
        return pipelined_ms(mx, step, x0, tokens)
    mx.synchronize()
    t0 = time.perf_counter()
    x = x0
    for _ in range(tokens):
        y = step(x)
        mx.eval(y)
        x = y[0]
    mx.synchronize()
    return (time.perf_counter() - t0) * 1e3 / tokens


def compiled_side(mx: Any, fn: Callable[[Any, Callable[[Any], None]], list[Any]]
                  ) -> Callable[[Any, Callable[[Any], None]], list[Any]]:
    """The step under ``mx.compile`` (traced once per input shape, then replayed: no Python per call)."""
    step = mx.compile(lambda x: fn(x, lambda y: None))
    return lambda x, hook: step(x)


def host_split(mx: Any, step: Callable[[Any], list[Any]], x0: Any, tokens: int) -> dict[str, float]:
    """The pipelined loop's host time per token split three ways: building the graph (Python and MLX's array
    objects), ``mx.async_eval`` (MLX encodes the launches and sends the commits) and waiting for the previous token;
    a loop whose wait is ~0 is host-bound."""
    build = send = wait = 0.0
    mx.synchronize()
    y = step(x0)
    mx.async_eval(y)
    for _ in range(tokens):
        t0 = time.perf_counter()
        nxt = step(y[0])
        t1 = time.perf_counter()
        mx.async_eval(nxt)
        t2 = time.perf_counter()
        mx.eval(y)
        t3 = time.perf_counter()
        build, send, wait = build + t1 - t0, send + t2 - t1, wait + t3 - t2
        y = nxt
    mx.eval(y)
    mx.synchronize()
    return {"build_ms": build * 1e3 / tokens, "send_ms": send * 1e3 / tokens, "wait_ms": wait * 1e3 / tokens}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default="artifacts")
    ap.add_argument("--out", default="/tmp/pipeline_probe")
    ap.add_argument("--tag", default=os.environ.get("PROBE_TAG", "default"))
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--compiled", action="store_true", help="also each side's whole step under mx.compile")
    a = ap.parse_args()
    import mlx.core as mx

    shape = (StepShape(hidden=256, ffn=512, layers=2) if a.dry_run else StepShape(layers=a.layers)).check()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    families = fused_families(shape)
    calls = shape.calls()
    with tempfile.TemporaryDirectory(prefix="ks-probe-") as tmp:
        pkg = import_package(ArtifactStore(Path(a.store)), list(families), Path(tmp))
        layers = build_layers(mx, shape, 0, lambda s: print(s, flush=True))
        bound = [bind_layer(pkg, families, lay, calls) for lay in layers]
        inc_dir = Path(tmp) / "inc"
        inc_dir.mkdir(mode=0o700)
        pkg_inc = import_package(ArtifactStore(Path(a.store)), list(families), Path(tmp) / "inc_pkg")
        disp = pkg_inc._dispatcher
        disp.kernel_factory = include_factory(mx, inc_dir, disp.kernel_factory)
        bound_inc = [bind_layer(pkg_inc, families, lay, calls) for lay in layers]
        dt = getattr(mx, shape.dtype)
        x0 = (0.5 * mx.random.normal((a.m, shape.hidden), key=mx.random.key(7))).astype(dt)
        mx.eval(x0)
        sides = {"plain": plain_layers(mx, layers), "pkg": package_layers(bound, shape.hidden),
                 "pkg_inc": package_layers(bound_inc, shape.hidden)}
        if a.compiled:  # the whole step under mx.compile, both sides (a consumer may compile its step)
            del sides["pkg_inc"]
            for name in ("plain", "pkg"):
                sides[f"{name}_c"] = compiled_side(mx, sides[name])
        want = sides["plain"](x0, lambda x: None)[0]
        errs = {}
        for name in (n for n in sides if n != "plain"):
            got = sides[name](x0, lambda x: None)[0]
            errs[name] = float(mx.max(mx.abs(got - want)).item() / (mx.max(mx.abs(want)).item() + 1e-12))
        print("rel err vs plain:", errs, flush=True)
        forms: dict[str, tuple[Callable[[Any], list[Any]], bool]] = {}
        for side, fn in sides.items():
            for mode in ("sync", "pipe") if side.endswith("_c") else ("sync", "layer", "pipe", "layerpipe"):
                forms[f"{side}/{mode}"] = (layer_step(fn, mx, "layer" if mode.startswith("layer") else "sync"),
                                           mode.endswith("pipe"))
        for step, pipe in forms.values():
            timed(mx, step, x0, pipe, 2)
        times: dict[str, list[float]] = {n: [] for n in forms}
        names = list(forms)
        for r in range(a.rounds):
            for n in names if r % 2 == 0 else names[::-1]:
                step, pipe = forms[n]
                times[n].append(timed(mx, step, x0, pipe, a.tokens))
        split = {}
        for side, fn in sides.items():
            parts = [host_split(mx, layer_step(fn, mx, "sync"), x0, a.tokens) for _ in range(5)]
            split[side] = {k: statistics.median(p[k] for p in parts) for k in parts[0]}
            print(f"{side:8s} pipelined host per token: " + ", ".join(f"{k} {v:.3f}" for k, v in split[side].items()),
                  flush=True)
    ref = times["plain/sync"]
    rows = {}
    for n, t in times.items():
        p = Paired.of(ref, t)
        rows[n] = {"ms": statistics.median(t), "vs_plain_sync": p.speedup, "low": p.low, "high": p.high}
        best_plain = min(statistics.median(t) for k, t in times.items() if k.startswith("plain"))
        rows[n]["vs_best_plain"] = best_plain / statistics.median(t)
        print(f"{n:14s} {rows[n]['ms']:7.3f} ms/token  vs plain/sync {p.speedup:.2f}x ({p.low:.2f}-{p.high:.2f})"
              f"  vs best plain {rows[n]['vs_best_plain']:.2f}x", flush=True)
    env = {k: v for k, v in os.environ.items() if k.startswith("MLX_")}
    (out / f"gpu_pipeline_probe_{a.tag}.json").write_text(json.dumps(
        {"env": env, "M": a.m, "layers": shape.layers, "tokens": a.tokens, "rounds": a.rounds, "rel_err": errs,
         "rows": rows, "times": times, "host_split": split}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

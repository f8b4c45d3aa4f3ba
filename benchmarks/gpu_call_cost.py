"""Issue 35 on the GPU: what one fused call costs the host, and where. In mlx-lm's pipelined loop the package's step
is host-bound at M = 1 (``gpu_pipeline_probe.py``'s host split: ~1.2 ms a token building the graph, ~1.2 ms sending
it, ~0.1 ms waiting for the GPU), so each call's host cost is the step's cost. Here one call of the layer (the O
projection + residual, the h2 config of the store's winner unless ``--config``) in a chain of 128 dependent calls:

- ``package``: the exported package's bound call (``qmatvec_residual.bind(W, S, Bq)(X, R)``);
- ``compiled``: the kernel's launch under ``mx.compile`` (what the package's plan runs: ``kernel_call``);
- ``direct``: the kernel object called directly (no ``mx.compile``);
- ``direct_noparams``: the same without the family's parameter arrays (compiled in as literals since the sixth
  session; the arrays still travel as inputs);
- ``op``: ``R + quantized_matmul(X, W, S, Bq)``, what a user writes;

each timed as µs per call building the graph, sending it (``mx.async_eval``: MLX encodes the launches) and waiting::

    PYTHONPATH=/tmp/site:/tmp/site3 python3 benchmarks/gpu_call_cost.py --store artifacts --out $OUT

Writes ``$OUT/gpu_call_cost.json``. ``--dry-run``: MLX's CPU back-end, the op and the package only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernsearch import Space, get_backend, load_family, make_problem, render
from kernsearch.artifacts._artifacts import ArtifactStore
from kernsearch.bench._run import fused_families, import_package
from kernsearch.bench._step import Call, StepShape, bind_layer, build_layers
from kernsearch.exporting.runtime._runtime import kernel_call
from kernsearch.family._render import geometry
from kernsearch.hardware._chips import detect_chip

H2 = "PATH=h2,QBITS=4,TW=1,KS=1,RT=1,UNROLL=4,MB=1"


def split(mx: Any, fn: Callable[[Any, Any], Any], x: Any, r0: Any, calls: int, rounds: int) -> dict[str, float]:
    """Median µs per call: building a chain of ``calls`` dependent calls, sending it, waiting for it."""
    build, send, wait = [], [], []
    for i in range(rounds + 2):
        mx.synchronize()
        t0 = time.perf_counter()
        r = r0
        for _ in range(calls):
            r = fn(x, r)
        t1 = time.perf_counter()
        mx.async_eval(r)
        t2 = time.perf_counter()
        mx.eval(r)
        mx.synchronize()
        t3 = time.perf_counter()
        if i >= 2:
            build.append((t1 - t0) * 1e6 / calls)
            send.append((t2 - t1) * 1e6 / calls)
            wait.append((t3 - t2) * 1e6 / calls)
    return {"build_us": statistics.median(build), "send_us": statistics.median(send),
            "wait_us": statistics.median(wait)}


def direct_forms(mx: Any, shape: StepShape, call: Call, config: str, lay: Any) -> dict[str, Callable[[Any, Any], Any]]:
    fam = load_family(call.family)
    chip = detect_chip()
    space = Space(make_problem(fam, ",".join(str(v) for v in shape.dims(1, call).values()), shape.dtype, chip), chip)
    cfg = space.parse_config(config)
    source, geo = render(fam, cfg, shape.dtype, "cuda"), geometry(space, cfg)
    kern = get_backend("cuda").kernel(source, geo)
    template = [(k, getattr(mx, v) if isinstance(v, str) else v) for k, v in source.template]
    params = [mx.array([p.number], dtype=getattr(mx, p.dtype or "float32")) for p in fam.params.values()]
    outs = [getattr(mx, d) for d in geo.output_dtypes]
    w, s, b = lay.o
    compiled = kernel_call(kern, template, geo.grid, geo.threadgroup, geo.output_shapes, outs, params)
    names = [t.name for t in fam.inputs]

    def order(x: Any, r: Any) -> list[Any]:
        return [{"X": x, "W": w, "S": s, "Bq": b, "R": r}[n] for n in names]

    def direct(x: Any, r: Any, extra: list[Any] = params) -> Any:
        return kern(inputs=order(x, r) + extra, template=template, grid=geo.grid, threadgroup=geo.threadgroup,
                    output_shapes=list(geo.output_shapes), output_dtypes=outs)[0]

    return {"compiled": lambda x, r: compiled(*order(x, r)), "direct": direct,
            "direct_noparams": lambda x, r: direct(x, r, [])}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default="artifacts")
    ap.add_argument("--out", default="/tmp/call_cost")
    ap.add_argument("--config", default=H2)
    ap.add_argument("--calls", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    import mlx.core as mx

    shape = StepShape(hidden=256, ffn=512, layers=1) if a.dry_run else StepShape(layers=1)
    call = shape.calls()[1]  # O + residual
    families = fused_families(shape)
    with tempfile.TemporaryDirectory(prefix="ks-cost-") as tmp:
        pkg = import_package(ArtifactStore(Path(a.store)), list(families), Path(tmp))
        [lay] = build_layers(mx, shape, 0, lambda s: None)
        bound = bind_layer(pkg, families, lay, shape.calls())["o"].fn
        w, s, b = lay.o
        forms: dict[str, Callable[[Any, Any], Any]] = {
            "package": bound,
            "op": lambda x, r: r + mx.quantized_matmul(x, w, s, b, transpose=True, group_size=shape.group,
                                                       bits=shape.bits)}
        if not a.dry_run:
            forms.update(direct_forms(mx, shape, call, a.config, lay))
        dt = getattr(mx, shape.dtype)
        x = (0.5 * mx.random.normal((1, call.k), key=mx.random.key(1))).astype(dt)
        r0 = (0.5 * mx.random.normal((1, call.n), key=mx.random.key(2))).astype(dt)
        mx.eval(x, r0)
        out = {}
        for name, fn in forms.items():
            out[name] = split(mx, fn, x, r0, a.calls, a.rounds)
            print(f"{name:16s} " + ", ".join(f"{k} {v:.2f}" for k, v in out[name].items()), flush=True)
        print("decision:", pkg.qmatvec_residual.explain(x, w, s, b, r0) if hasattr(pkg, "qmatvec_residual") else "",
              flush=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "gpu_call_cost.json").write_text(json.dumps({"config": a.config, "calls": a.calls, "forms": out},
                                                               indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

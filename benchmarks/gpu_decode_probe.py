"""Issue 35 on the GPU: each fused decode call of a Llama-7B-shaped layer, given configs, in a chain of dependent
calls over the layers' weights (cold: every layer's weights are distinct memory), against the op a user writes and
a streaming read of the same bytes in the same chain. No search, no publish: a design probe that costs a compile per config, not a tune.

On the GPU machine, after the wheel install of ``../shared/device/README.md``::

    PYTHONPATH=/tmp/site:/tmp/site3 python3 benchmarks/gpu_decode_probe.py --out $OUT --layers 16 --rounds 25

Writes ``$OUT/gpu_decode_probe_<chip>.json`` (per role: µs per call of the op, the stream and every config, with
the paired speedup against the op). ``--dry-run`` (no GPU) renders every config and builds every chain on MLX's CPU
back-end without launching a kernel: it checks the script, not the kernels.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from kernsearch import Space, get_backend, load_family, make_problem, render
from kernsearch.bench._decode import Paired, derive, device_kind, interleaved, median, stream_reader
from kernsearch.bench._step import Call, StepShape, build_layers, call_inputs, qmm
from kernsearch.exporting.runtime._runtime import kernel_call
from kernsearch.family._render import geometry
from kernsearch.hardware._chips import detect_chip, get_chip

#: The configs the last H200 tune chose (benchmarks/gpu_results.md, third session; .gpustore manifests).
TUNED = {
    "qkv": {"PATH": "mma", "QBITS": 4, "TW": 1, "KS": 4, "RT": 2, "UNROLL": 2, "MB": 8},
    "o": {"PATH": "mma", "QBITS": 4, "TW": 1, "KS": 4, "RT": 2, "UNROLL": 4, "MB": 8},
    "gate_up": {"PATH": "mma", "QBITS": 4, "TW": 2, "KS": 4, "RT": 1, "UNROLL": 2, "MB": 8},
    "down": {"PATH": "mma", "QBITS": 4, "TW": 1, "KS": 4, "RT": 1, "UNROLL": 2, "MB": 8},
    "mlp": {"PATH": "mma", "QBITS": 4, "TW": 1, "KS": 4, "RT": 2, "UNROLL": 2, "MB": 8, "BPS": 2},
}
#: Variations tried around each tuned config. (Run at 3b3b024 each also with L2PF=1, a bulk L2 prefetch of the
#: tile that the templates had then: no gain, so the knob was taken out; benchmarks/gpu_results.md.)
H2: dict[str, Any] = {"PATH": "h2", "KS": 1, "MB": 1, "TW": 1}
VARIANTS: dict[str, list[dict[str, Any]]] = {
    role: [{}, *({**H2, "RT": rt, "UNROLL": u} for rt, u in ((1, 2), (1, 4), (2, 2), (2, 4)))]
    for role in ("qkv", "o", "gate_up", "down")}
VARIANTS["mlp"] = [{}, *({**H2, "RT": rt, "UNROLL": u, "BPS": b} for rt, u, b in ((1, 4, 3), (1, 2, 4), (2, 2, 2)))]


def candidates(role: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for v in VARIANTS[role]:
        cfg = {**TUNED[role], **v}
        if cfg not in out:
            out.append(cfg)
    return out


def build_call(mx: Any, backend: Any, call: Call, shape: StepShape, m: int, cfg: dict[str, Any], chip: Any,
               dry: bool) -> tuple[Any, list[str]] | str:
    """``fn(*arrays)`` of one config on the family's inputs (in the family's order), or why the config is out."""
    fam = load_family(call.family)
    dims = shape.dims(m, call)
    problem = make_problem(fam, ",".join(str(v) for v in dims.values()), shape.dtype, chip)
    space = Space(problem, chip)
    config = space.parse_config(cfg)
    bad = space.violations(config)
    if bad:
        return "; ".join(str(b) for b in bad)
    source = render(fam, config, shape.dtype, "cuda")
    geo = geometry(space, config)
    names = [t.name for t in fam.inputs]
    if dry:
        return (lambda *a: a[0]), names
    params = [mx.array([p.number], dtype=getattr(mx, p.dtype or "float32")) for p in fam.params.values()]
    kern = backend.kernel(source, geo)
    fn = kernel_call(kern, [(k, getattr(mx, v) if isinstance(v, str) else v) for k, v in source.template],
                     geo.grid, geo.threadgroup, geo.output_shapes, [getattr(mx, d) for d in geo.output_dtypes],
                     params, [t.name in geo.transposed_inputs for t in fam.inputs], geo.init_value)
    return fn, names


def op_call(mx: Any, shape: StepShape, call: Call, lay: Any, x: Any, r: Any) -> Any:
    """The op a user writes for one call of the layer (plain MLX)."""
    mm = qmm(mx, shape)
    if call.role == "qkv":
        return mm(mx.fast.rms_norm(x, lay.n1, 1e-5), lay.qkv)
    if call.role == "gate_up":
        n = mx.fast.rms_norm(x, lay.n2, 1e-5)
        g = mm(n, lay.gate)
        return g * mx.sigmoid(g) * mm(n, lay.up)
    if call.role == "mlp":
        x1 = r + mm(x, lay.o)
        n = mx.fast.rms_norm(x1, lay.n2, 1e-5)
        g = mm(n, lay.gate)
        return x1 + mm(g * mx.sigmoid(g) * mm(n, lay.up), lay.down)
    return r + mm(x, lay.o if call.role == "o" else lay.down)


def first_layer_errors(mx: Any, shape: StepShape, lay: Any, call: Call, m: int,
                       built: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each config's output on the first layer against the op's (max abs difference, and the op's max abs)."""
    dt = getattr(mx, shape.dtype)
    x = (0.5 * mx.random.normal((m, call.k), key=mx.random.key(7))).astype(dt)
    r = (0.5 * mx.random.normal((m, call.n), key=mx.random.key(8))).astype(dt)
    ref = op_call(mx, shape, call, lay, x, r).astype(mx.float32)
    out = {}
    for label, (fn, names) in built.items():
        y = fn(*[{**call_inputs(lay, call.role), "X": x, "R": r}[n] for n in names])
        y = (y[0] if isinstance(y, tuple) else y).astype(mx.float32)
        out[label] = {"max_abs_err": float(mx.max(mx.abs(y - ref)).item()),
                      "max_abs_ref": float(mx.max(mx.abs(ref)).item())}
    return out


def role_forms(mx: Any, shape: StepShape, layers: list[Any], call: Call, m: int, built: dict[str, Any],
               read: Any, flats: list[Any] | None) -> dict[str, Any]:
    dt = getattr(mx, shape.dtype)
    x0 = (0.5 * mx.random.normal((m, call.k), key=mx.random.key(m))).astype(dt)
    r0 = (0.5 * mx.random.normal((m, call.n), key=mx.random.key(m + 1))).astype(dt)
    mx.eval(x0, r0)
    residual = call.role in ("o", "down", "mlp")
    named = [call_inputs(lay, call.role) for lay in layers]

    def op_of(lay: Any, x: Any, r: Any) -> Any:
        return op_call(mx, shape, call, lay, x, r)

    def chain(step: Any) -> Any:
        def run() -> Any:
            x, r = x0, r0
            for i, lay in enumerate(layers):
                y = step(i, lay, x, r)
                y = y[0] if isinstance(y, tuple) else y
                x, r = (x, y) if residual else (derive(mx, y, call.k), r)
            return r if residual else x
        return run

    forms = {"op": chain(lambda i, lay, x, r: op_of(lay, x, r))}
    for label, (fn, names) in built.items():
        def step(i: int, lay: Any, x: Any, r: Any, fn: Any = fn, names: list[str] = names) -> Any:
            arrays = {**named[i], "X": x, "R": r}
            return fn(*[arrays[n] for n in names])
        forms[label] = chain(step)
    if read is not None and flats is not None:
        def stream() -> Any:
            d = mx.zeros((1,), dtype=mx.uint32)
            for f in flats:
                d = read(f, d)
            return d
        forms["stream"] = stream
    return forms


def say(text: str) -> None:
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--roles", default="mlp,qkv,o,gate_up,down")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    import mlx.core as mx

    a.out.mkdir(parents=True, exist_ok=True)
    kind = device_kind(mx)
    dry = a.dry_run or kind is None
    chip = get_chip("H200") if dry else detect_chip()
    shape = StepShape(layers=a.layers) if not dry else StepShape(hidden=256, ffn=512, layers=2)
    backend = None if dry else get_backend("cuda")
    layers = build_layers(mx, shape, 0, say)
    read = None if dry else stream_reader(mx, kind)
    result: dict[str, Any] = {"chip": chip.name, "mlx": mx.__version__, "layers": shape.layers, "M": a.m,
                              "rounds": a.rounds, "roles": {}}
    by_role = {c.role: c for c in shape.all_calls()}
    for role in a.roles.split(","):
        call = by_role[role]
        built: dict[str, Any] = {}
        skipped: dict[str, str] = {}
        for cfg in candidates(role):
            label = ",".join(f"{k}={v}" for k, v in cfg.items())
            t0 = time.perf_counter()
            got = build_call(mx, backend, call, shape, a.m, cfg, chip, dry)
            if isinstance(got, str):
                skipped[label] = got
                continue
            built[label] = got
            say(f"{role}: {label} built in {time.perf_counter() - t0:.1f} s")
        flats = None if dry else [mx.zeros((shape.matrix_bytes(call) // 4,), dtype=mx.uint32) + i
                                  for i in range(shape.layers)]
        if flats is not None:
            mx.eval(flats)
        forms = role_forms(mx, shape, layers, call, a.m, built, read, flats)
        errs = {} if dry else first_layer_errors(mx, shape, layers[0], call, a.m, built)
        if dry:
            for name, fn in forms.items():
                if name == "op":
                    mx.eval(fn())
            result["roles"][role] = {"configs": list(built), "skipped": skipped}
            continue
        try:
            t = interleaved(mx, forms, a.rounds)
        except Exception as exc:  # a config that faults: say which role, keep the others
            say(f"{role}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
            result["roles"][role] = {"error": str(exc)[:500]}
            continue
        per = 1e3 / shape.layers
        row: dict[str, Any] = {"op_us": median(t["op"]) * per, "skipped": skipped, "configs": {}}
        if "stream" in t:
            row["stream_us"] = median(t["stream"]) * per
        for label in built:
            p = Paired.of(t["op"], t[label])
            us = p.new_ms * per
            row["configs"][label] = {"us": us, "speedup": p.speedup, "low": p.low, "high": p.high,
                                     "pct_of_stream": 100 * row.get("stream_us", 0) / us, **errs.get(label, {})}
        result["roles"][role] = row
        best = min(row["configs"].items(), key=lambda kv: kv[1]["us"]) if row["configs"] else None
        say(f"{role}: op {row['op_us']:.1f} us, stream {row.get('stream_us', 0):.1f} us")
        for label, c in sorted(row["configs"].items(), key=lambda kv: kv[1]["us"]):
            say(f"   {c['us']:7.1f} us  {c['speedup']:.2f}x ({c['low']:.2f}-{c['high']:.2f})  "
                f"{c['pct_of_stream']:.0f}% of stream  err {c.get('max_abs_err', -1):.3g} "
                f"(|ref| {c.get('max_abs_ref', -1):.3g})  {label}")
        if best:
            say(f"{role}: best {best[0]}")
        (a.out / f"gpu_decode_probe_{chip.name.replace(' ', '-')}.json").write_text(json.dumps(result, indent=1))
    (a.out / f"gpu_decode_probe_{chip.name.replace(' ', '-')}.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

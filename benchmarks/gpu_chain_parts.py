"""Issue 35: what a fused call's time in the bench's chain is made of. `bench decode` puts each fused kernel at
40-58 % of a streaming read of its bytes (each a chain of 32 dependent calls, one eval), while Nsight Compute puts
the kernels alone at 55-65 % of the stream's GPU time. The rest is the call's own cost in a chain (host work,
launch, the link between calls), which the kernel's speed cannot remove. This times, per call of the step, in
interleaved rounds of one process:

- ``kernel``: the tuned config's kernel, called as `bench decode`'s chain calls it (the next X derived from the
  output);
- ``null``: a kernel with the same inputs, outputs, grid, threadgroup and shared memory whose body only copies one
  value from X (what the call costs without its work), chained the same way;
- ``stream`` and ``stream_null``: the streaming read of the same bytes, and the same launch with an empty body;

each eager and compiled (``mx.compile`` of the chain). ``kernel - null`` is the kernel's GPU time in the chain,
``stream - stream_null`` the stream's; their ratio is the kernel's speed against the stream free of the calls' cost::

    PYTHONPATH=... python3 benchmarks/gpu_chain_parts.py --out $OUT --m 1 --rounds 20

Writes ``$OUT/gpu_chain_parts_<chip>_m<M>.json``. ``--dry-run`` (no GPU) renders the configs and checks the script.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from kernsearch import Space, get_backend, load_family, make_problem, render
from kernsearch._rules import factory_texts
from kernsearch.bench._decode import derive, device_kind, interleaved, median, stream_grid, stream_reader
from kernsearch.bench._step import Call, StepShape, build_layers, call_inputs
from kernsearch.exporting.runtime._runtime import kernel_call
from kernsearch.family._render import geometry
from kernsearch.hardware._chips import detect_chip, get_chip
from kernsearch.hardware._targets import get_target, kernel_factory

#: The configs this session's tunes published on the H200 (benchmarks/gpu_tune_step_h200_s11.log).
H2 = {"PATH": "h2", "QBITS": 4, "TW": 1, "KS": 1, "MB": 1}
MMA = {"PATH": "mma", "QBITS": 4, "MB": 8}
PUBLISHED: dict[int, dict[str, dict[str, Any]]] = {
    1: {"qkv": {**H2, "RT": 2, "UNROLL": 2}, "o": {**H2, "RT": 1, "UNROLL": 4},
        "gate_up": {**H2, "RT": 1, "UNROLL": 2}, "down": {**H2, "RT": 1, "UNROLL": 4}},
    4: {"qkv": {**MMA, "TW": 1, "KS": 4, "RT": 1, "UNROLL": 2}, "o": {**MMA, "TW": 4, "KS": 4, "RT": 1, "UNROLL": 2},
        "gate_up": {**MMA, "TW": 1, "KS": 2, "RT": 1, "UNROLL": 2},
        "down": {**MMA, "TW": 2, "KS": 4, "RT": 1, "UNROLL": 4}},
}
FORMS = ("kernel", "null", "null_direct", "null_x", "null_xk", "null_packed", "null_cat")
#: The quantized matrices' arrays, which ``null_packed`` takes as one array (``P``).
MATS = ("W", "S", "Bq", "Wu", "Su", "Bu")
#: ``null_cat``'s inputs for the gate/up call: each of W, S, Bq with the up matrix's rows after the gate's.
CAT = {"W": "Wcat", "S": "Scat", "Bq": "Bcat"}
STREAM_NULL = "if (blockIdx.x == 0 && threadIdx.x == 0) { Y[0] = D[0]; }"


def built(mx: Any, backend: Any, call: Call, shape: StepShape, m: int, cfg: dict[str, Any], chip: Any,
          form: str) -> tuple[Any, list[str]]:
    """``fn(*arrays)`` of the config and the input names it takes. ``form``: ``kernel``; ``null``: its twin with
    the same launch whose body copies one value; ``null_direct``: that twin called without ``kernel_call``'s
    ``mx.compile`` wrapper; ``null_x``: the twin taking X alone; ``null_xk``: the twin whose output is X's shape
    (chained without the link's view ops); ``null_packed``: the twin taking the quantized matrices' arrays as one
    (what a packed weight layout would pass); ``null_cat``: for the gate/up call, the twin taking gate and up as
    one matrix of 2N rows (three arrays, not six)."""
    null = form != "kernel"
    fam = load_family(call.family)
    dims = shape.dims(m, call)
    space = Space(make_problem(fam, ",".join(str(v) for v in dims.values()), shape.dtype, chip), chip)
    config = space.parse_config(cfg)
    bad = space.violations(config)
    if bad:
        raise SystemExit(f"{call.role}: {cfg} is out: {bad[0]}")
    source = render(fam, config, shape.dtype, "cuda")
    geo = geometry(space, config)
    names = [t.name for t in fam.inputs]
    if backend is None:
        return (lambda *a: a[0]), names
    if null:
        if form == "null_x":
            names = ["X"]
            source = replace(source, input_names=("X",))
        elif form == "null_packed":
            names = [n for n in names if n not in MATS] + ["P"]
            source = replace(source, input_names=(*names, *source.input_names[len(fam.inputs):]))
        elif form == "null_cat":  # gate and up as one matrix of 2N rows (as Q/K/V are): three arrays, not six
            names = [CAT.get(n, n) for n in names if n not in ("Wu", "Su", "Bu")]
            source = replace(source, input_names=(*names, *source.input_names[len(fam.inputs):]))
        body = f"if (blockIdx.x == 0 && threadIdx.x == 0) {{ {source.output_names[0]}[0] = X[0]; }}"
        # built as the back-end builds the real one (backends/_mlx_base._make_kernel), its body the only change
        texts = factory_texts("cuda", source.header, body, int(geo.shared_memory))
        extra = {"shared_memory": int(geo.shared_memory)} if get_target("cuda").shared_memory_at_build else {}
        kern = kernel_factory("cuda")(
            name=f"{source.name}_{form if form in ('null_x', 'null_packed', 'null_cat') else 'null'}", input_names=list(source.input_names), output_names=list(source.output_names),
            source=texts.source, header=texts.header, ensure_row_contiguous=True, **extra)
    else:
        kern = backend.kernel(source, geo)
    params = [] if form == "null_x" else [mx.array([p.number], dtype=getattr(mx, p.dtype or "float32"))
                                          for p in fam.params.values()]
    outs = [(m, call.k)] + list(geo.output_shapes[1:]) if form == "null_xk" else geo.output_shapes
    if form == "null_direct":
        tmpl = [(k, getattr(mx, v) if isinstance(v, str) else v) for k, v in source.template]

        def direct(*arrays: Any) -> Any:
            return kern(inputs=[*arrays, *params], template=tmpl, grid=geo.grid, threadgroup=geo.threadgroup,
                        output_shapes=outs, output_dtypes=[getattr(mx, d) for d in geo.output_dtypes])[0]
        return direct, names
    fn = kernel_call(kern, [(k, getattr(mx, v) if isinstance(v, str) else v) for k, v in source.template],
                     geo.grid, geo.threadgroup, outs, [getattr(mx, d) for d in geo.output_dtypes],
                     params, [] if form in ("null_x", "null_packed", "null_cat") else [t.name in geo.transposed_inputs for t in fam.inputs],
                     geo.init_value)
    return fn, names


def chains(mx: Any, shape: StepShape, layers: list[Any], call: Call, m: int, fns: dict[str, Any],
           flats: list[Any] | None, reads: dict[str, Any]) -> dict[str, Any]:
    dt = getattr(mx, shape.dtype)
    x0 = (0.5 * mx.random.normal((m, call.k), key=mx.random.key(m))).astype(dt)
    r0 = (0.5 * mx.random.normal((m, call.n), key=mx.random.key(m + 1))).astype(dt)
    mx.eval(x0, r0)
    residual = call.role in ("o", "down")
    named = [packed(mx, call_inputs(lay, call.role)) for lay in layers]
    forms: dict[str, Any] = {}
    for label, (fn, names) in fns.items():
        def run(fn: Any = fn, names: list[str] = names) -> Any:
            x, r = x0, r0
            for i in range(len(layers)):
                y = fn(*[{**named[i], "X": x, "R": r}[n] for n in names])
                y = y[0] if isinstance(y, tuple) else y
                x, r = (y, r) if y.shape == x.shape and not residual else (derive(mx, y, call.k), y if residual else r)
            return x
        forms[label] = run
    for label, read in reads.items():
        def stream(read: Any = read) -> Any:
            d = mx.zeros((1,), dtype=mx.uint32)
            for f in flats or []:
                d = read(f, d)
            return d
        forms[label] = stream
    for label in list(forms):
        forms[label + " compiled"] = mx.compile(forms[label])
    return forms


def packed(mx: Any, named: dict[str, Any]) -> dict[str, Any]:
    """The call's arrays and ``P``: its quantized matrices' arrays as one byte array (made once, before timing)."""
    pk = mx.concatenate([mx.view(named[n].reshape(-1), mx.uint8) for n in MATS if n in named])
    cat = {CAT[a]: mx.concatenate([named[a], named[b]]) for a, b in (("W", "Wu"), ("S", "Su"), ("Bq", "Bu"))
           if b in named}
    mx.eval(pk, *cat.values())
    return {**named, "P": pk, **cat}


def null_reader(mx: Any) -> Any:
    kernel = mx.fast.cuda_kernel(name="ks_bench_stream_null", input_names=["A", "D"], output_names=["Y"],
                                 source=STREAM_NULL)
    grid = stream_grid(mx)

    def read(a: Any, d: Any) -> Any:
        return kernel(inputs=[a, d], template=[], grid=grid, threadgroup=(512, 1, 1), output_shapes=[(1,)],
                      output_dtypes=[mx.uint32])[0]
    return read


def summary(t: dict[str, list[float]], layers: int) -> dict[str, Any]:
    us = {k: median(v) * 1e3 / layers for k, v in t.items()}
    row: dict[str, Any] = {"us": us}
    for tail in ("", " compiled"):
        k, n, s, sn = (us.get(f + tail) for f in ("kernel", "null", "stream", "stream_null"))
        if None in (k, n, s, sn):
            continue
        assert k is not None and n is not None and s is not None and sn is not None
        row["gpu" + tail.replace(" ", "_")] = {
            "kernel_us": k - n, "stream_us": s - sn, "pct_free_of_call_cost": 100 * (s - sn) / max(k - n, 1e-9),
            "pct_as_bench": 100 * s / k, "call_cost_us": n, "stream_call_cost_us": sn}
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--m", type=int, default=1, choices=sorted(PUBLISHED))
    ap.add_argument("--roles", default="qkv,o,gate_up,down")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    import mlx.core as mx

    a.out.mkdir(parents=True, exist_ok=True)
    kind = device_kind(mx)
    dry = a.dry_run or kind != "cuda"
    chip = get_chip("H200") if dry else detect_chip()
    shape = StepShape(layers=a.layers) if not dry else StepShape(hidden=256, ffn=512, layers=2)
    backend = None if dry else get_backend("cuda")
    layers = build_layers(mx, shape, 0, lambda s: None)
    result: dict[str, Any] = {"chip": chip.name, "mlx": mx.__version__, "layers": shape.layers, "M": a.m,
                              "rounds": a.rounds, "configs": PUBLISHED[a.m], "roles": {}}
    path = a.out / f"gpu_chain_parts_{chip.name.replace(' ', '-')}_m{a.m}.json"
    by_role = {c.role: c for c in shape.all_calls()}
    for role in a.roles.split(","):
        call, cfg = by_role[role], PUBLISHED[a.m][role]
        fns = {label: built(mx, backend, call, shape, a.m, cfg, chip, label) for label in FORMS
               if label != "null_cat" or role == "gate_up"}
        if dry:
            mx.eval(chains(mx, shape, layers, call, a.m, {"kernel": fns["kernel"]}, None, {})["kernel"]())
            print(f"{role}: {cfg} renders; dry run", flush=True)
            continue
        flats = [mx.zeros((shape.matrix_bytes(call) // 4,), dtype=mx.uint32) + i for i in range(shape.layers)]
        mx.eval(flats)
        reads = {"stream": stream_reader(mx, kind), "stream_null": null_reader(mx)}
        t = interleaved(mx, chains(mx, shape, layers, call, a.m, fns, flats, reads), a.rounds)
        row = result["roles"][role] = summary(t, shape.layers)
        print(f"{role} M={a.m}: " + ", ".join(f"{k} {v:.1f}" for k, v in row["us"].items()), flush=True)
        for g in ("gpu", "gpu_compiled"):
            if g in row:
                r = row[g]
                print(f"   {g}: kernel {r['kernel_us']:.1f} us vs stream {r['stream_us']:.1f} us "
                      f"({r['pct_free_of_call_cost']:.0f} % free of the calls' cost; {r['pct_as_bench']:.0f} % as the "
                      f"bench counts); a call costs {r['call_cost_us']:.1f} us (stream's {r['stream_call_cost_us']:.1f})",
                      flush=True)
        path.write_text(json.dumps(result, indent=1))
    path.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every family of the exported package as a consumer calls it (issue 26), against the MLX op it replaces.

One command on the GPU machine (MLX CUDA in /tmp/site, kernsearch in /tmp/site3), from the repository root::

    PYTHONPATH=/tmp/site:/tmp/site3 python3 benchmarks/gpu_consumer.py --out $OUT

exports ``artifacts/`` (every family), installs the wheel into a fresh folder, imports it, and for each family at
its tuned shapes (the store's artifacts for this chip) and shapes near them (and its default shape where nothing
is tuned): checks the package's result against the op's, then times the package call and the op, interleaved
round by round by the final round's own method (:func:`kernsearch.evaluation._consumer.consumer_samples`), in the
three consumer modes: ``graph`` (a chain of 8 dependent calls, each call's activation derived from the previous
call's output by the chain's link, then one ``mx.eval``: how a decode step runs), ``batch`` (8 independent calls,
then one ``mx.eval``: their launches overlap) and ``eager`` (an eval after every call), with cold weights for
families with weight inputs (the weights rotate among copies that total more than twice the L2). Also: the copy
bandwidth of this GPU (a streaming read), each family's host cost per call (graph building only): the op, the
package's plain call and, for weight families, its bound form; and the drop-in decode step: every
``quantized_matmul`` of a 32-layer Llama-7B decode step (hidden 4096, FFN 11008, 4-bit, group 64, M = 1) through
the package's ``qmatvec``, nothing tuned (``--store`` empty for it), against plain MLX, interleaved step by step.

Writes ``$OUT/gpu_consumer_<chip>.json`` = ``{"rows": [{"family", "shape", "mode", "chose", "speedup", "low",
"high", "interval_low", "interval_high", "rounds"}, ...], "host_us": {family: {"package", "bound", "op"}},
"drop_in_decode": {"speedup", "low", "high", ...}}`` (low/high: p10/p90 over rounds, the spread; interval_low/high:
the 99 % interval of the median per-round ratio, ``_rules.ratio_interval``, the statistic the gate decides on;
copy it to ``benchmarks/data/``) and prints a table; exits 1 when a row is slower than the op beyond its
interval (its upper end below 1).

``--cpu`` (no GPU: MLX's CPU back-end): a dry run, the same steps at small shapes and 3 rounds, a 2-layer decode
step at hidden 256 (``$OUT/gpu_consumer_cpu.json``); the package runs the op there.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_package import PACKAGE, import_installed, install  # noqa: E402

#: Default shapes where nothing is tuned (the families' own defaults are used otherwise).
FAMILIES = ("qmatvec", "swiglu_qmatvec", "gemv", "gemm", "rmsnorm", "layernorm", "softmax", "swiglu")
#: The fused decode families (exported too; swept with ``--families``).
FUSED = ("rmsnorm_qmatvec", "qmatvec_residual", "rmsnorm_swiglu_qmatvec")
CPU_SHAPES = {"qmatvec": (1, 256, 256, 32, 4), "swiglu_qmatvec": (1, 256, 256, 32, 4), "gemv": (1, 256, 256),
              "gemm": (32, 64, 64), "rmsnorm": (4, 256), "layernorm": (4, 256), "softmax": (4, 256),
              "swiglu": (4, 256), "rmsnorm_qmatvec": (1, 256, 256, 32, 4), "qmatvec_residual": (1, 256, 256, 32, 4),
              "rmsnorm_swiglu_qmatvec": (1, 256, 256, 32, 4)}
#: Built-in families this benchmark does not call one op at a time, and where they are measured instead.
ELSEWHERE = {"mlp_block": "benchmarks/gpu_tune_decode.py (the whole MLP block of a decode step)"}


def unplaced_families() -> list[str]:
    """Built-in families (found in the family folders) with neither a shape here nor a place named in ELSEWHERE: a
    new family folder stops the benchmark until it is given one (it is never silently left out)."""
    from kernsearch.family._spec import builtin_family_names

    return [f for f in builtin_family_names() if f not in CPU_SHAPES and f not in ELSEWHERE]


#: The norms' epsilon (the families' ``eps`` parameter).
EPS = 1e-5


def log(*parts: Any) -> None:
    print(*parts, flush=True)


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q))


def export_all(store: Path, work: Path) -> Path:
    from kernsearch import ArtifactStore, export

    result = export([*FAMILIES, *FUSED], work / "export", ArtifactStore(store), package=PACKAGE, version="0.0.1")
    log(f"exported {Path(result.wheel).name}: {len(result.artifacts)} artifact(s) ({', '.join(result.artifacts)})")
    return Path(result.wheel)


def consumer_op(family: str, mx: Any, dims: dict[str, int]) -> Any:
    """What a consumer writes without kernsearch (the family's baseline, by hand): plain MLX calls, never
    ``mx.compile``d, each value computed once (the exported package's op path runs exactly these ops)."""
    if "NG" in dims:  # the quantized families: group size and bits read off the shapes
        gs, bits = dims["K"] // dims["NG"], 32 * dims["KW"] // dims["K"]

        def qmm(x: Any, w: Any, s: Any, b: Any) -> Any:
            return mx.quantized_matmul(x, w, s, b, transpose=True, group_size=gs, bits=bits)

        def swiglu_qmatvec(x: Any, w: Any, s: Any, b: Any, wu: Any, su: Any, bu: Any) -> Any:
            g = qmm(x, w, s, b)
            return g * mx.sigmoid(g) * qmm(x, wu, su, bu)

        def rmsnorm_swiglu_qmatvec(x: Any, w: Any, s: Any, b: Any, wu: Any, su: Any, bu: Any, gamma: Any) -> Any:
            return swiglu_qmatvec(mx.fast.rms_norm(x, gamma, EPS), w, s, b, wu, su, bu)

        return {"qmatvec": qmm, "swiglu_qmatvec": swiglu_qmatvec, "rmsnorm_swiglu_qmatvec": rmsnorm_swiglu_qmatvec,
                "rmsnorm_qmatvec": lambda x, w, s, b, gamma: qmm(mx.fast.rms_norm(x, gamma, EPS), w, s, b),
                "qmatvec_residual": lambda x, w, s, b, r: r + qmm(x, w, s, b)}[family]
    if family in ("gemm", "gemv"):
        return mx.matmul
    if family == "rmsnorm":
        return lambda x, w: mx.fast.rms_norm(x, w, EPS)
    if family == "layernorm":
        return lambda x, w, b: mx.fast.layer_norm(x, w, b, EPS)
    if family == "softmax":
        return lambda x: mx.softmax(x, axis=-1, precise=True)
    if family == "swiglu":
        return lambda a, b: a * mx.sigmoid(a) * b
    raise KeyError(family)


def problem_arrays(family: str, shape: tuple[int, ...], dtype: str, sets: int, seed: int = 0) -> tuple[Any, ...]:
    """``sets`` input sets (MLX arrays): the activations shared, the weights drawn per set."""
    import mlx.core as mx

    from kernsearch.evaluation._verify import make_inputs
    from kernsearch.family._space import make_problem
    from kernsearch.family._spec import load_family

    fam = load_family(family)
    problem = make_problem(fam, shape, dtype)
    first = make_inputs(problem, seed)
    weights = [t.name for t in fam.inputs if t.weight]
    out = []
    for k in range(sets):
        more = make_inputs(problem, seed + k) if k else first
        row = []
        for t in fam.inputs:
            x = (more if t.name in weights else first)[t.name]
            arr = mx.array(x) if t.resolved_dtype(dtype) in ("uint32", "int32") else mx.array(x.astype(np.float32))
            row.append(arr.astype(getattr(mx, t.resolved_dtype(dtype))))
        out.append(row)
    mx.eval(out)
    return tuple(out), dict(problem.dims), bool(weights), sum(first[n].nbytes for n in weights)


def timed(fns: dict[str, Any], sets: Any, mode: str, rounds: int, calls: int = 8) -> dict[str, list[float]]:
    """Per-call ms of ``fns`` (functions of one input set) in one mode, by the final round's method."""
    import mlx.core as mx

    from kernsearch.evaluation._consumer import ConsumerPlan, consumer_samples

    calls_of = {n: (lambda i, prev=None, f=f: f(*sets[i % len(sets)])) for n, f in fns.items()}
    return consumer_samples(calls_of, mx.eval, mx.synchronize,
                            ConsumerPlan(calls=calls, rounds=rounds, modes=(mode,)))[mode]


def host_us(fn: Any, args: Any, calls: int = 2000) -> float:
    """Microseconds of host time per call building the graph (nothing evaluated), one batch of ``calls``."""
    import mlx.core as mx

    outs = []
    t0 = time.perf_counter()
    for _ in range(calls):
        outs.append(fn(*args))
    spent = (time.perf_counter() - t0) / calls * 1e6
    del outs
    mx.eval([])
    return spent


def interleaved_host_us(forms: dict[str, tuple[Any, Any]], batches: int = 15) -> dict[str, float]:
    """Each form's host µs per call, the best of ``batches`` batches taken in turn (form after form, the order
    rotating): a slow spell of the machine, a warm-up or the memory a batch leaves behind then weighs on every form
    alike, not on whichever was timed third."""
    for fn, args in forms.values():
        fn(*args)
    best = {name: math.inf for name in forms}
    names = list(forms)
    for b in range(batches):
        for name in names[b % len(names):] + names[:b % len(names)]:
            fn, args = forms[name]
            best[name] = min(best[name], host_us(fn, args))
    return best


def host_costs(pkg: Any, family: str, sets: Any, dims: dict[str, int], weighted: bool) -> dict[str, float]:
    """Host µs per call of the op, the package's plain call and (weighted families) its bound call, interleaved."""
    import mlx.core as mx

    args = sets[0]
    fn = getattr(pkg, family)
    forms = {"op": (consumer_op(family, mx, dims), args), "package": (fn, args)}
    if weighted:
        from kernsearch.family._spec import load_family

        fam = load_family(family)
        slots = [i for i, t in enumerate(fam.inputs) if t.weight]
        bound = fn.bind(*[args[i] for i in slots])
        forms["bound"] = (bound, [args[i] for i in range(len(args)) if i not in slots])
    return interleaved_host_us(forms)


def copy_bandwidth() -> float:
    """GB/s of a streaming read (uint4 loads, 4 in flight per thread) of 1 GiB, graph mode."""
    import mlx.core as mx

    src = """
    const size_t n = A_shape[0] / 4;
    const uint4* p = reinterpret_cast<const uint4*>(A);
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    uint4 a = make_uint4(0u, 0u, 0u, 0u);
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 v0 = __ldg(p + i), v1 = __ldg(p + i + stride), v2 = __ldg(p + i + 2 * stride), v3 = __ldg(p + i + 3 * stride);
        a.x ^= v0.x ^ v1.x ^ v2.x ^ v3.x; a.y ^= v0.y ^ v1.y ^ v2.y ^ v3.y;
        a.z ^= v0.z ^ v1.z ^ v2.z ^ v3.z; a.w ^= v0.w ^ v1.w ^ v2.w ^ v3.w;
    }
    for (; i < n; i += stride) { const uint4 v = __ldg(p + i); a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w; }
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x9E3779B9u) Y[0] = a.x;
"""
    kernel = mx.fast.cuda_kernel(name="ks_consumer_stream", input_names=["A"], output_names=["Y"], source=src)
    sms = int(mx.device_info().get("multi_processor_count", 132) or 132)
    n = 1 << 28  # uint32 words: 1 GiB
    bufs = [(mx.zeros((n,), dtype=mx.uint32) + i,) for i in range(2)]
    mx.eval(bufs)

    def read(a: Any) -> Any:
        return kernel(inputs=[a], template=[], grid=(sms * 4 * 512, 1, 1), threadgroup=(512, 1, 1),
                      output_shapes=[(1,)], output_dtypes=[mx.uint32])[0]

    ms = pct(timed({"r": read}, bufs, "batch", 5, calls=2)["r"], 50)
    return 4 * n / (ms * 1e-3) / 1e9


def shapes_for(family: str, store: Any, chip: str) -> list[tuple[tuple[int, ...], str]]:
    """(shape, why) rows: each tuned shape on this chip, and its neighbours within 2x (first dimension halved and
    doubled, where the family's shape stays valid); the default shape where nothing is tuned."""
    from kernsearch.family._spec import load_family

    tuned = sorted({tuple(a.manifest.problem.shape) for a in store.current_artifacts(family)
                    if a.manifest.chip.name == chip and a.manifest.problem.dtype == "float16"})
    rows = [(s, "tuned") for s in tuned]
    for s in tuned:
        for m in (max(1, s[0] // 2), s[0] * 2):
            near = (m, *s[1:])
            if near != s and (near, "near") not in rows and (near, "tuned") not in rows and (family not in (
                    "qmatvec", "swiglu_qmatvec", "gemv") or m <= 16):
                rows.append((near, "near"))
    if not rows:
        rows = [(tuple(load_family(family).problem.default_shape), "default")]
    return rows


def measure_family(pkg: Any, family: str, shape: tuple[int, ...], why: str, rounds: int, l2: float) -> list[dict]:
    import mlx.core as mx

    from kernsearch._rules import ratio_interval
    from kernsearch.evaluation._consumer import weight_sets

    sets, dims, weighted, wbytes = problem_arrays(family, shape, "float16", 1)
    n = weight_sets(wbytes, l2) if weighted else 1
    if n > 1:
        sets, dims, weighted, wbytes = problem_arrays(family, shape, "float16", n)
    op = consumer_op(family, mx, dims)
    fn = getattr(pkg, family)
    decision = fn.explain(*sets[0])
    got, want = fn(*sets[0]), op(*sets[0])
    got = got if isinstance(got, (list, tuple)) else [got]
    want = want if isinstance(want, (list, tuple)) else [want]
    err = max(float(mx.max(mx.abs(g.astype(mx.float32) - w.astype(mx.float32))).item()) for g, w in zip(got, want))
    scale = max(float(mx.max(mx.abs(w.astype(mx.float32))).item()) for w in want) or 1.0
    rows = []
    samples = consumer_timing(family, {"package": fn, "op": op}, sets, rounds)
    for mode, t in samples.items():
        pk, o = t["package"], t["op"]
        interval = ratio_interval([b / k for k, b in zip(pk, o)])  # the rounds are paired: one ratio per round
        rows.append({"family": family, "shape": "x".join(map(str, shape)), "why": why, "mode": mode,
                     "chose": decision.artifact or ("default config" if decision.entry else "op"),
                     "speedup": pct(o, 50) / pct(pk, 50), "low": pct(o, 10) / pct(pk, 90),
                     "high": pct(o, 90) / pct(pk, 10), "interval_low": interval.low, "interval_high": interval.high,
                     "median_ratio": interval.median, "rounds": interval.rounds, "package_ms": pct(pk, 50),
                     "op_ms": pct(o, 50), "weight_sets": n, "max_rel_err": err / scale})
    return rows


#: The modes every row is timed in: the chain (how kernsearch judges decode families), then the others.
MODES = ("graph", "batch", "eager")


def consumer_timing(family: str, fns: dict[str, Any], sets: Any, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Per-call ms by mode, then candidate: the package and the op interleaved round by round, called through one
    chain link (:mod:`kernsearch.evaluation._chain`: the same derivation for both)."""
    import mlx.core as mx

    from kernsearch.evaluation._chain import chained, mlx_link
    from kernsearch.evaluation._consumer import ConsumerPlan, consumer_samples
    from kernsearch.family._spec import load_family

    fam = load_family(family)
    link = mlx_link(fam.inputs, fam.chain_inputs)
    calls = {name: chained(f, [list(row) for row in sets], link) for name, f in fns.items()}
    return consumer_samples(calls, mx.eval, mx.synchronize, ConsumerPlan(rounds=rounds, modes=MODES))


#: Llama-7B: hidden, FFN, layers; 4-bit weights in groups of 64.
LLAMA = (4096, 11008, 32)


def decode_weights(hidden: int, ffn: int, layers: int, mx: Any) -> list[list[tuple[Any, Any, Any]]]:
    """Per layer the 7 quantized projections (q, k, v, o: hidden x hidden; gate, up: ffn x hidden; down:
    hidden x ffn) as (words, scales, biases), 4 bits, group 64."""
    out = []
    for layer in range(layers):
        mats = []
        for n, k in [(hidden, hidden)] * 4 + [(ffn, hidden)] * 2 + [(hidden, ffn)]:
            w = mx.random.normal((n, k), key=mx.random.key(layer * 7 + len(mats))).astype(mx.float16) * 0.02
            mats.append(tuple(mx.quantize(w, group_size=64, bits=4)))
        mx.eval(mats)
        out.append(mats)
    return out


def decode_step(qmm: Any, x: Any, weights: list[list[tuple[Any, Any, Any]]], mx: Any) -> Any:
    """One decode step of the layers' projections, every one through ``qmm(x, w, s, b)``; the rest (the RMS norms,
    a stand-in for attention, the residual adds, SwiGLU) is the same MLX ops for both sides."""
    ones = mx.ones((x.shape[-1],), dtype=x.dtype)
    for q, k, v, o, gate, up, down in weights:
        n = mx.fast.rms_norm(x, ones, 1e-5)
        a = qmm(n, *q) + qmm(n, *k) + qmm(n, *v)
        h = x + qmm(a, *o)
        n = mx.fast.rms_norm(h, ones, 1e-5)
        g = qmm(n, *gate)
        x = h + qmm(g * mx.sigmoid(g) * qmm(n, *up), *down)
    return x


def drop_in_decode(pkg: Any, rounds: int, hidden: int, ffn: int, layers: int) -> dict[str, Any]:
    """The decode step with every quantized_matmul through the package's qmatvec against plain MLX, one eval per
    step, interleaved step by step (order alternating)."""
    import mlx.core as mx

    from kernsearch._rules import ratio_interval

    weights = decode_weights(hidden, ffn, layers, mx)
    x = mx.random.normal((1, hidden)).astype(mx.float16)
    mx.eval(x)

    def plain(x: Any, w: Any, s: Any, b: Any) -> Any:
        return mx.quantized_matmul(x, w, s, b, transpose=True, group_size=64, bits=4)

    sides = {"package": pkg.qmatvec, "mlx": plain}
    chose = sorted({str(pkg.qmatvec.explain(xx, *m).level) for xx in (x,) for m in weights[0][:1] + weights[0][4:]})
    got, want = decode_step(sides["package"], x, weights[:1], mx), decode_step(plain, x, weights[:1], mx)
    err = float(mx.max(mx.abs(got.astype(mx.float32) - want.astype(mx.float32))).item())
    times: dict[str, list[float]] = {n: [] for n in sides}
    for side in sides.values():  # warm: plan, compile, load
        mx.eval(decode_step(side, x, weights, mx))
    for r in range(rounds):
        for name in (list(sides) if r % 2 == 0 else list(reversed(list(sides)))):
            mx.synchronize()
            t0 = time.perf_counter()
            mx.eval(decode_step(sides[name], x, weights, mx))
            mx.synchronize()
            times[name].append((time.perf_counter() - t0) * 1e3)
    pk, op = times["package"], times["mlx"]
    interval = ratio_interval([o / k for k, o in zip(pk, op)])  # paired: one ratio per round
    return {"hidden": hidden, "ffn": ffn, "layers": layers, "calls": 7 * layers, "bits": 4, "group": 64,
            "chose": chose, "package_ms": pct(pk, 50), "mlx_ms": pct(op, 50), "speedup": pct(op, 50) / pct(pk, 50),
            "low": pct(op, 10) / pct(pk, 90), "high": pct(op, 90) / pct(pk, 10), "median_ratio": interval.median,
            "interval_low": interval.low, "interval_high": interval.high, "rounds": rounds,
            "max_abs_err_one_layer": err}


def row_text(row: dict[str, Any]) -> str:
    flag = "SLOWER" if row["interval_high"] < 1.0 else ""
    return (f"{row['family']:15s} {row['shape']:22s} {row['why']:7s} {row['mode']:5s} {row['chose'][:48]:48s} "
            f"{row['speedup']:.2f}x ({row['low']:.2f}-{row['high']:.2f}; 99% interval of the median ratio "
            f"{row['interval_low']:.2f}-{row['interval_high']:.2f}) err {row['max_rel_err']:.1e} {flag}")


def untuned_package(work: Path) -> Any:
    """The package exported from an empty store (nothing tuned: every call may only run the op), imported from
    its source tree under its own name."""
    import importlib.util

    from kernsearch import ArtifactStore, export

    name = "kernsearch_untuned"
    result = export(["qmatvec"], work / "untuned", ArtifactStore(work / "empty_store"), package=name,
                    version="0.0.1")
    pkg_dir = result.source_dir / name
    spec = importlib.util.spec_from_file_location(name, pkg_dir / "__init__.py", submodule_search_locations=[str(pkg_dir)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--store", type=Path, default=ROOT / "artifacts")
    ap.add_argument("--rounds", type=int, default=33, help="paired rounds per row and mode (a look of _rules.looks)")
    ap.add_argument("--cpu", action="store_true", help="no GPU: host cost per call on MLX's CPU back-end only")
    ap.add_argument("--families", default=",".join(FAMILIES))
    a = ap.parse_args(argv)
    if unplaced_families():
        ap.error(f"built-in families with no shape in CPU_SHAPES nor a place in ELSEWHERE: {unplaced_families()}")
    a.out.mkdir(parents=True, exist_ok=True)
    import mlx.core as mx

    from kernsearch import ArtifactStore
    from kernsearch._errors import KernsearchError
    from kernsearch.hardware._chips import detect_chip

    work = Path(tempfile.mkdtemp(prefix="gpu_consumer_"))
    how = install(export_all(a.store, work), work / "site")
    pkg = import_installed(work / "site")
    families = [f for f in a.families.split(",") if f]
    report: dict[str, Any] = {"installed": how, "mlx": mx.__version__, "python": platform.python_version()}
    untuned = untuned_package(work)
    if a.cpu:  # a dry run on MLX's CPU back-end: every step at small shapes
        report.update(device="cpu", chip="cpu", rows=[], host_us={})
        for family in families:
            for row in measure_family(pkg, family, CPU_SHAPES[family], "cpu", 3, 0.0):
                report["rows"].append(row)
                log(row_text(row))
            sets, dims, weighted, _ = problem_arrays(family, CPU_SHAPES[family], "float32", 1)
            report["host_us"][family] = host_costs(pkg, family, sets, dims, weighted)
            log(f"{family}: host us per call {report['host_us'][family]}")
        report["drop_in_decode"] = drop_in_decode(untuned, 3, 256, 512, 2)
        log(f"drop-in decode (cpu, 2 layers at hidden 256): {report['drop_in_decode']}")
        (a.out / "gpu_consumer_cpu.json").write_text(json.dumps(report, indent=1))
        return 0
    chip = detect_chip()
    info = dict(mx.device_info())
    report.update(device=info.get("device_name"), chip=chip.name, rows=[], host_us={})
    report["copy_GBps"] = copy_bandwidth()
    log(f"device {report['device']} ({chip.name}); streaming read {report['copy_GBps']:.0f} GB/s")
    store = ArtifactStore(a.store)
    l2 = float(chip.system_cache_mb) * 2**20
    for family in families:
        shapes = shapes_for(family, store, chip.name)
        for shape, why in shapes:
            try:
                rows = measure_family(pkg, family, shape, why, a.rounds, l2)
            except KernsearchError as exc:  # e.g. too big to check against NumPy here: said, not measured
                log(f"{family} {shape}: skipped ({exc})")
                continue
            for row in rows:
                report["rows"].append(row)
                log(row_text(row))
        # host cost of the package's dispatch where it runs the op (a small untuned shape) and, where a kernel is
        # tuned, of the kernel path (the compiled launch) at its shape
        sets, dims, weighted, _ = problem_arrays(family, CPU_SHAPES[family], "float16", 1)
        report["host_us"][family] = host_costs(pkg, family, sets, dims, weighted)
        if shapes[0][1] == "tuned":
            sets, dims, weighted, _ = problem_arrays(family, shapes[0][0], "float16", 1)
            report["host_us"][family]["kernel_path"] = host_costs(pkg, family, sets, dims, weighted)
        log(f"{family}: host us per call {report['host_us'][family]}")
    report["drop_in_decode"] = drop_in_decode(untuned, a.rounds, *LLAMA)
    log(f"drop-in decode (32 layers, 224 quantized_matmul, nothing tuned): {report['drop_in_decode']}")
    (a.out / f"gpu_consumer_{chip.name.lower()}.json").write_text(json.dumps(report, indent=1))
    slower = [r for r in report["rows"] if r["interval_high"] < 1.0]
    log(f"{len(report['rows'])} rows; slower than the op beyond the interval: {len(slower)}")
    return 1 if slower else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The row families on an NVIDIA GPU (issue 13): rmsnorm, layernorm, softmax, swiglu against the MLX ops.

One command on the GPU machine (MLX with its CUDA back-end; run from the repository root)::

    PYTHONPATH=/tmp/site:/tmp/site3 python3 benchmarks/gpu_families.py --out $OUT [--budget 420]

In one run, within ``--budget`` seconds of wall time (each family gets a share and says what it left out):

1. copy bandwidth of this GPU in the same run: a 16-byte-vector copy kernel and ``x + 0`` (an MLX array
   copy), 1 GiB each way; the faster one is "copy";
2. per family, float16: a landscape at the first large shape (4096x4096; swiglu 4096x11008): the model's top
   configs plus a seeded sample of the rest, compiled by worker processes (NVRTC, in parallel), verified on a
   ragged problem and at full size against the float64 reference, timed one at a time under a GPU lock, saved
   in KernelTuner cache format under ``$OUT/landscapes`` (with the model's Spearman correlation);
3. per family and problem (large: 4096x4096, 16384x4096, swiglu 4096x11008 and 4096x14336; small: 32x8192,
   1x4096): candidates (the landscape's best valid there and the model's top) verified and timed briefly, the
   best timed interleaved with the MLX op on the same inputs (median, p10-p90 spread), GB/s of the problem's
   bytes and % of the copy bandwidth; swiglu against both the ``mx.compile``d composition (the gate's
   baseline) and the eager one; at the small shapes also per call with a sync after each, so the launch
   overhead is reported apart from the kernel; the best published into ``$OUT/store`` through the gate
   (which refuses what does not beat the op by more than the margin at the lower bound of its speedup);
4. which of the issue's goals are met, printed and in ``$OUT/families.json``.

``--dry-run`` runs every step on this machine without a GPU: times come from the performance model (marked
``dry-run, modeled``, never measured), verification runs the Metal twin on the CPU interpreter at a small
ragged shape, CUDA sources are rendered but not compiled; the store records modeled evidence, never dispatched.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_decode import Device, DryDevice, log, spearman, stats  # noqa: E402 - same folder

DTYPE = "float16"


def row_families() -> list[str]:
    """The built-in row families found (a row count and a row length), not listed: a new one is measured once
    its shapes and goals below are written (the run refuses to start without them)."""
    from kernsearch.family._spec import builtin_family_names, load_family

    return [name for name in builtin_family_names() if len(load_family(name).problem.dims) == 2]


LARGE = {"rmsnorm": ("4096,4096", "16384,4096"), "layernorm": ("4096,4096", "16384,4096"),
         "softmax": ("4096,4096", "16384,4096"), "swiglu": ("4096,11008", "4096,14336")}
SMALL_SHAPES = ("32,8192", "1,4096")
#: Ragged problems each variant is first checked on (VEC = 1 configs at the odd one; aligned ones at 256).
RAGGED = {"rmsnorm": "7,264", "layernorm": "7,264", "softmax": "7,264", "swiglu": "7,264"}
#: What the issue asks of each family at the large shapes: % of copy bandwidth, speedup over the op(s).
GOALS = {"rmsnorm": {"op": 1.0}, "layernorm": {"op": 1.5}, "softmax": {"op": 1.2},
         "swiglu": {"op": 1.0, "eager": 1.5}}
PCT_COPY_GOAL = 85.0
LANDSCAPE_PLAN = dict(warmup=2, min_batch_ms=3.0, min_samples=7, max_samples=7, max_seconds=1.0)
CANDIDATE_PLAN = dict(warmup=2, min_batch_ms=5.0, min_samples=10, max_samples=10, max_seconds=1.5)


class FamilyDryDevice(DryDevice):
    """The dry device of gpu_decode, checking the Metal twin of these families at their ragged shape."""

    def verify(self, fam, space, cfg: dict, seed: int):  # noqa: ANN001, ANN201
        from kernsearch import Space, geometry, get_chip, make_problem, render
        from kernsearch.evaluation._verify import Check, verify_kernel

        render(fam, cfg, space.problem.dtype, "cuda")
        m2 = get_chip("M2 Max")
        small = Space(make_problem(fam, RAGGED[fam.name], space.problem.dtype, m2), m2)
        if not small.is_valid(cfg):
            return Check(True, "", detail="dry run: config not valid at the ragged shape (not checked)")
        check, _ = verify_kernel(self.cpu, render(fam, cfg, space.problem.dtype, "metal"), geometry(small, cfg),
                                 small.problem, seed=seed, chip=m2)
        return check


def _quick(dev: Any, fam: Any, space: Any, cfg: dict, logical: dict, plan: dict) -> list[float]:
    if dev.dry:
        return dev.time_one(fam, space, cfg, logical)
    from kernsearch import geometry, render
    from kernsearch.evaluation._measure import TimingPlan, measure
    from kernsearch.evaluation._verify import kernel_inputs

    kernel, geo = render(fam, cfg, space.problem.dtype, "cuda"), geometry(space, cfg)
    launch, sync = dev.cuda.launcher(kernel, geo, kernel_inputs(space.problem, logical, geo), space.problem.dtype)
    return measure(launch, sync, plan=TimingPlan(**plan))


# -- landscape workers (real device only) ------------------------------------------------------------------

_W: dict = {}


def _worker_init(lock: Any, family: str, shape: str) -> None:
    _W.update(lock=lock, family=family, shape=shape)


def _worker_eval(cfg: dict) -> tuple[dict, dict]:
    """Compile + ragged check (parallel), then timing under the GPU lock (the full-size check, costly on the
    CPU side, is left to the candidates each problem times and to publishing)."""
    from kernsearch import render
    from kernsearch._errors import VariantFailure

    if "device" not in _W:
        from kernsearch import Space, load_family, make_problem
        from kernsearch.evaluation._verify import make_inputs

        fam = load_family(_W["family"])
        dev = Device()
        full = Space(make_problem(fam, _W["shape"], DTYPE, dev.chip), dev.chip)
        small = Space(make_problem(fam, RAGGED[fam.name], DTYPE, dev.chip), dev.chip)
        _W.update(device=dev, fam=fam, full=full, small=small, logical=make_inputs(full.problem, 0))
    dev, fam, full, small = _W["device"], _W["fam"], _W["full"], _W["small"]
    kernel = render(fam, cfg, DTYPE, "cuda")
    try:
        if small.is_valid(cfg):
            check = dev.verify(fam, small, cfg, seed=5)
            if not check.ok:
                return cfg, {"failure": "WrongResultConfig", "failure_detail": f"ragged: {check.summary()}"[:500]}
    except VariantFailure as exc:
        kind = "CompileFailedConfig" if exc.reason == "compile" else "RuntimeFailedConfig"
        return cfg, {"failure": kind, "failure_detail": f"{exc.reason}: {exc.detail}"[:500]}
    extra = {"compile_time": dev.cuda.compile_seconds.get(kernel.sha256, 0.0) * 1e3}
    with _W["lock"]:
        try:
            times = _quick(dev, fam, full, cfg, _W["logical"], LANDSCAPE_PLAN)
        except Exception as exc:  # noqa: BLE001 - one variant's failure is recorded, never fatal
            return cfg, {"failure": "RuntimeFailedConfig", "failure_detail": str(exc)[:500], **extra}
    return cfg, {"times": times, **extra}


def pick_configs(fam: Any, space: Any, count: int) -> list[dict]:
    """Wide configs first (the widest vector, the row held in registers, 256+ threads, simd reductions:
    what memory-bound row kernels win with), then the model's top, then a seeded sample of the rest."""
    from kernsearch import get_backend

    valid = space.enumerate().valid
    model = get_backend("model")
    ranked = sorted(valid, key=lambda c: model.predict_ms(space, c))
    widest = max(c["VEC"] for c in valid)
    wide = [c for c in ranked if c["VEC"] == widest and c["TG"] >= 256 and c.get("HOLD", "registers") == "registers"
            and c.get("REDUCE", "simd") == "simd" and c.get("ACC", "float32") == "float32"]
    chosen: list[dict] = []
    for c in wide[: count // 3] + ranked[: count // 4]:
        if c not in chosen:
            chosen.append(c)
    rest = [c for c in valid if c not in chosen]
    return chosen + random.Random(0).sample(rest, min(len(rest), count - len(chosen)))


def landscape(dev: Any, fam: Any, shape: str, count: int, out: Path, deadline: float, jobs: int,
              mlx_version: str) -> dict:
    """Measure a sample of configs at ``shape``; KernelTuner cache file; model-vs-measured Spearman."""
    from kernsearch import Space, get_backend, make_problem
    from kernsearch.evaluation._verify import make_inputs
    from kernsearch.studies._landscape import NOT_MEASURED, LandscapeWriter

    space = Space(make_problem(fam, shape, DTYPE, dev.chip), dev.chip)
    configs = pick_configs(fam, space, count)
    knobs = {k: v.values for k, v in fam.knobs.items()}
    name = f"{fam.name}_{dev.chip.name}_{DTYPE}_{space.problem.shape_text}.json".replace(" ", "")
    writer = LandscapeWriter(out / "landscapes" / name, knobs, device_name=str(dev.info.get("device_name")),
                             kernel_name=f"kernsearch {fam.name} (cuda)", problem_size=list(space.problem.shape),
                             chip=dev.chip.name, dtype=DTYPE, mlx_version=mlx_version,
                             evidence="dry-run, modeled (not measured)" if dev.dry else "measured",
                             method="benchmarks/gpu_families.py (docstring)",
                             date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    pending = {json.dumps(c, sort_keys=True): c for c in configs}
    if dev.dry:
        logical = make_inputs(space.problem, 0) if space.problem.bytes() < 5e7 else {}
        for i, cfg in enumerate(configs):
            if time.monotonic() > deadline:
                break
            if i < 3:  # the interpreter is slow: a few real checks, the rest modeled only
                check = dev.verify(fam, space, cfg, seed=i)
                if not check.ok:
                    writer.add(cfg, failure="WrongResultConfig", failure_detail=check.summary()[:500])
                    pending.pop(json.dumps(cfg, sort_keys=True))
                    continue
            writer.add(cfg, times=dev.time_one(fam, space, cfg, logical))
            pending.pop(json.dumps(cfg, sort_keys=True))
    else:
        ctx = mp.get_context("spawn")
        with ctx.Pool(jobs, initializer=_worker_init, initargs=(ctx.Lock(), fam.name, shape)) as pool:
            results = pool.imap_unordered(_worker_eval, configs, chunksize=1)
            while pending:
                try:
                    cfg, res = results.next(timeout=max(1.0, deadline - time.monotonic()))
                except (mp.TimeoutError, StopIteration):
                    break
                pending.pop(json.dumps(cfg, sort_keys=True), None)
                if "times" in res:
                    writer.add(cfg, times=res.pop("times"), **res)
                else:
                    writer.add(cfg, failure=res.pop("failure"), **res)
            pool.terminate()
    for cfg in pending.values():
        writer.add(cfg, failure=NOT_MEASURED, failure_detail="time share of this landscape used up")
    path = writer.save()
    ok = [e for e in writer.cache.values() if not isinstance(e["time"], str)]
    failed: dict[str, int] = {}
    for e in writer.cache.values():
        if isinstance(e["time"], str):
            failed[e["time"]] = failed.get(e["time"], 0) + 1
    model = get_backend("model")
    full_cfgs = [{k: e[k] for k in knobs} for e in ok]
    predicted = [model.predict_ms(space, c) for c in full_cfgs]
    medians = [float(np.median(e["times"])) for e in ok]
    rho = spearman(predicted, medians)
    best = int(np.argmin(medians)) if medians else None
    summary = {"file": str(path.relative_to(out)), "problem": space.problem.shape_text, "configs": len(configs),
               "valid": len(space.enumerate().valid), "measured": len(ok), "failed": failed,
               "spearman_model_vs_measured": rho, "best_ms": medians[best] if best is not None else None,
               "best_config": full_cfgs[best] if best is not None else None,
               "ranked": [c for _, c in sorted(zip(medians, full_cfgs), key=lambda t: t[0])]}
    log(f"  landscape {fam.name} {space.problem.shape_text}: {len(ok)} measured of {len(configs)} "
        f"({failed or 'no failures'}); best {summary['best_ms']} ms; Spearman(model, measured) = "
        f"{'n/a' if rho is None else f'{rho:.3f}'}")
    return summary


# -- one problem -------------------------------------------------------------------------------------------

def baselines(dev: Any, fam: Any, space: Any, logical: dict, sets: int) -> dict[str, Any]:
    """``op``: the family's baseline (what the gate compares with); swiglu adds ``eager``."""
    cands = {"op": dev.cuda.baseline_launcher(fam, space.problem, logical, sets=sets)}
    if fam.compile_baseline:
        eager = fam.model_copy(update={"compile_baseline": False})
        cands["eager"] = dev.cuda.baseline_launcher(eager, space.problem, logical, sets=sets)
    return cands


def interleaved(dev: Any, fam: Any, space: Any, cfg: dict, logical: dict, rounds: int) -> dict[str, list[float]]:
    if dev.dry:
        out = dev.interleaved(fam, space, {"tuned": cfg}, logical, rounds)
        if fam.compile_baseline:
            out["eager"] = [v * 1.6 for v in out["op"]]  # a stand-in, as the dry op is
        return out
    from kernsearch import geometry, render
    from kernsearch.evaluation._measure import TimingPlan
    from kernsearch.evaluation._measure import interleaved as run
    from kernsearch.evaluation._verify import kernel_inputs

    p = space.problem
    sets = dev.cuda.input_sets(list(logical.values()), p.dtype)
    kernel, geo = render(fam, cfg, p.dtype, "cuda"), geometry(space, cfg)
    cands = {"tuned": dev.cuda.launcher(kernel, geo, kernel_inputs(p, logical, geo), p.dtype, sets=sets)}
    cands.update(baselines(dev, fam, space, logical, sets))
    return run(cands, rounds=rounds, plan=TimingPlan(min_batch_ms=10.0))


def per_call(dev: Any, fam: Any, space: Any, cfg: dict, logical: dict) -> dict[str, float]:
    """Median milliseconds of one call followed by a sync (launch overhead included), kernel and op(s)."""
    if dev.dry:
        ms = dev.model.predict_ms(space, cfg)
        return {"tuned": ms + 0.02, "op": ms * 1.1 + 0.02}
    from kernsearch import geometry, render
    from kernsearch.evaluation._measure import TimingPlan, measure
    from kernsearch.evaluation._verify import kernel_inputs

    p = space.problem
    kernel, geo = render(fam, cfg, p.dtype, "cuda"), geometry(space, cfg)
    cands = {"tuned": dev.cuda.launcher(kernel, geo, kernel_inputs(p, logical, geo), p.dtype, sets=1)}
    cands.update(baselines(dev, fam, space, logical, 1))
    plan = TimingPlan(warmup=5, min_batch_ms=0.0, max_batch=1, min_samples=50, max_samples=200, max_seconds=1.0)
    return {label: float(np.median(measure(launch, sync, plan=plan))) for label, (launch, sync) in cands.items()}


def bench_problem(dev: Any, fam: Any, shape: str, ranked: list[dict], copy_gbps: float, store: Any, rounds: int,
                  small: bool) -> dict:
    from kernsearch import Space, get_backend, make_problem
    from kernsearch.evaluation._measure import speedup
    from kernsearch.evaluation._verify import make_inputs
    from kernsearch.family._space import format_config

    space = Space(make_problem(fam, shape, DTYPE, dev.chip), dev.chip)
    model = get_backend("model")
    by_model = sorted(space.enumerate().valid, key=lambda c: model.predict_ms(space, c))[:2]
    cands: list[dict] = []
    for c in [c for c in ranked if space.is_valid(c)][:3] + by_model:
        if c not in cands:
            cands.append(c)
    logical = make_inputs(space.problem, 1) if not dev.dry or space.problem.bytes() < 5e7 else {}
    timed = []
    for cfg in cands:
        try:
            check = dev.verify(fam, space, cfg, seed=2)
            if not check.ok:
                log(f"    candidate {format_config(cfg)} wrong: {check.summary()[:200]}")
                continue
            timed.append((float(np.median(_quick(dev, fam, space, cfg, logical, CANDIDATE_PLAN))), cfg))
        except Exception as exc:  # noqa: BLE001 - a failing candidate is skipped, reported
            log(f"    candidate {format_config(cfg)} failed: {str(exc)[:200]}")
    if not timed:
        return {"problem": space.problem.shape_text, "error": "no candidate passed verification"}
    best = min(timed, key=lambda t: t[0])[1]
    samples = interleaved(dev, fam, space, best, logical, rounds)
    nbytes = space.problem.bytes()
    row = {"problem": space.problem.shape_text, "config": format_config(best), "candidates": len(cands),
           "timed": len(timed), "bytes": nbytes, "small": small,
           "evidence": "dry-run, modeled (not measured)" if dev.dry else "measured"}
    for label, s in samples.items():
        st = stats(s)
        gbps = nbytes / (st["median_ms"] * 1e-3) / 1e9
        row[label] = {**st, "GBps": gbps, "pct_copy": 100 * gbps / copy_gbps}
        if label != "tuned":
            sp = speedup(samples["tuned"], s)
            row[label].update(speedup=sp.median, speedup_low=sp.low, speedup_high=sp.high)
    if small:
        calls = per_call(dev, fam, space, best, logical)
        row["per_call_ms"] = calls
        row["launch_overhead_ms"] = {k: calls[k] - row[k]["median_ms"] for k in calls if k in row}
    row["publish"] = publish(dev, fam, space, best, samples, store)
    return row


def publish(dev: Any, fam: Any, space: Any, cfg: dict, samples: dict, store: Any) -> dict:
    """Offer the winner to the store: the gate publishes it only if it beats the op beyond the margin."""
    from kernsearch import Candidate
    from kernsearch.artifacts._manifest import Correctness, Measurements
    from kernsearch.evaluation._measure import speedup

    checks = [(space.problem.shape_text, dev.verify(fam, space, cfg, seed=s)) for s in (21, 22)]
    row, op = stats(samples["tuned"]), stats(samples["op"])
    sp = speedup(samples["tuned"], samples["op"])
    measurements = Measurements(median_ms=row["median_ms"], spread=row["spread"], samples_ms=samples["tuned"],
                                baseline_median_ms=op["median_ms"], baseline_spread=op["spread"],
                                speedup=sp.median, speedup_low=sp.low, speedup_high=sp.high)
    try:
        cand = Candidate.for_config(space, cfg, target="cuda", evidence=dev.evidence, measurements=measurements,
                                    correctness=Correctness.from_checks("interpreter" if dev.dry else "device", checks),
                                    study="benchmarks/gpu_families.py")
        outcome = store.publish(cand)
    except Exception as exc:  # noqa: BLE001 - the gate's refusal or a store error is reported, not fatal
        return {"published": False, "reason": str(exc)[:300]}
    return {"published": outcome.published, "version": outcome.version, "reason": outcome.reason}


def print_rows(fam: str, rows: list[dict]) -> None:
    ops = ["op", "eager"] if fam == "swiglu" else ["op"]
    log(f"\n{fam} (float16): tuned vs the MLX op, interleaved (median ms, p10-p90 spread, GB/s, % of copy)")
    for r in rows:
        if "error" in r:
            log(f"  {r['problem']:<12} {r['error']}")
            continue
        t = r["tuned"]
        line = f"  {r['problem']:<12} tuned {t['median_ms']:.4f} ms ±{100 * t['spread']:.0f}% {t['GBps']:6.0f} GB/s {t['pct_copy']:5.1f}%"
        for op in ops:
            o = r[op]
            name = "compiled" if op == "op" and fam == "swiglu" else op
            line += (f" | {name} {o['median_ms']:.4f} ms {o['GBps']:6.0f} GB/s {o['pct_copy']:5.1f}%"
                     f" -> {o['speedup']:.2f}x ({o['speedup_low']:.2f}-{o['speedup_high']:.2f})")
        line += f" | published: {'yes' if r['publish'].get('published') else 'no'}  {r['config']}"
        log(line)
        if r.get("per_call_ms"):
            calls = ", ".join(f"{k} {v * 1e3:.1f} us (launch overhead {r['launch_overhead_ms'][k] * 1e3:.1f} us)"
                              for k, v in r["per_call_ms"].items())
            log(f"  {'':<12} per call with a sync after each: {calls}")
        if not r["publish"].get("published"):
            log(f"  {'':<12} gate: {r['publish'].get('reason', '')[:200]}")


def goals(report: dict) -> list[dict]:
    out = []
    for fam, want in GOALS.items():
        rows = [r for r in report["families"].get(fam, {}).get("rows", []) if not r.get("small") and "error" not in r]
        measured = bool(rows) and len(rows) == len(LARGE[fam])
        pct = [r["tuned"]["pct_copy"] for r in rows]
        out.append({"goal": f"{fam} >= {PCT_COPY_GOAL:.0f}% of copy bandwidth at the large shapes",
                    "met": (min(pct) >= PCT_COPY_GOAL) if measured else None,
                    "evidence": ", ".join(f"{r['problem']}: {r['tuned']['pct_copy']:.1f}%" for r in rows) or "not measured"})
        for op, factor in want.items():
            name = {"op": {"swiglu": "mx.compile'd silu(a) * b"}.get(fam, report["op_names"].get(fam, "the op")),
                    "eager": "the eager silu(a) * b"}[op]
            out.append({"goal": f"{fam} >= {factor}x {name} at the large shapes",
                        "met": all(r[op]["speedup"] >= factor for r in rows) if measured else None,
                        "evidence": ", ".join(f"{r['problem']}: {r[op]['speedup']:.2f}x (range {r[op]['speedup_low']:.2f}"
                                              f"-{r[op]['speedup_high']:.2f})" for r in rows) or "not measured"})
    return out


def main(argv: list[str] | None = None) -> dict:
    from kernsearch import KernsearchError

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget", type=float, default=420.0, help="seconds of wall time for the whole run")
    parser.add_argument("--landscape", type=int, default=48, help="configs per landscape (model's top + sample)")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds against the op")
    parser.add_argument("--families", default=",".join(row_families()))
    parser.add_argument("--dry-run", action="store_true", help="no GPU: modeled times, interpreter checks")
    args = parser.parse_args(argv)
    lacking = [f for f in args.families.split(",") if f and not (f in LARGE and f in RAGGED and f in GOALS)]
    if lacking:
        parser.error(f"no shapes or goals for {', '.join(lacking)}: add them to LARGE, RAGGED and GOALS")
    started = time.monotonic()
    out = Path(args.out)
    (out / "landscapes").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
    os.environ.setdefault("OMP_NUM_THREADS", "2")

    from kernsearch import ArtifactStore, load_family

    dev: Any = FamilyDryDevice() if args.dry_run else Device()
    mlx_version = "none"
    if not args.dry_run:
        import mlx.core as mx

        mlx_version = mx.__version__
    store = ArtifactStore(out / "store")
    families = [load_family(f) for f in args.families.split(",") if f]
    report: dict = {"device": dev.info, "chip": dev.chip.name, "mlx": mlx_version, "dry_run": args.dry_run,
                    "budget_s": args.budget, "families": {}, "left_out": [],
                    "op_names": {f.name: f.baseline_name for f in families}}
    log(f"device {dev.info.get('device_name')} ({dev.chip.name}); MLX {mlx_version}; budget {args.budget:.0f} s"
        + ("; DRY RUN: modeled times, nothing here is measured" if args.dry_run else ""))

    def left() -> float:
        return args.budget - (time.monotonic() - started)

    report["copy"] = dev.copy_bandwidth()
    copy_gbps = report["copy"]["copy_GBps"]
    log(f"copy bandwidth: {copy_gbps:.0f} GB/s  {report['copy']}")
    for i, fam in enumerate(families):
        share = (left() - 10) / (len(families) - i)
        t0 = time.monotonic()
        land_shape = LARGE[fam.name][0]
        log(f"\n{fam.name}: landscape at {land_shape}")
        land = landscape(dev, fam, land_shape, args.landscape, out, t0 + 0.4 * share, args.jobs, mlx_version)
        ranked = land.pop("ranked")
        rows = []
        for shape, small in [(s, False) for s in LARGE[fam.name]] + [(s, True) for s in SMALL_SHAPES]:
            if time.monotonic() - t0 > share and rows:
                report["left_out"].append(f"{fam.name} {shape}: out of time")
                continue
            try:
                rows.append(bench_problem(dev, fam, shape, ranked, copy_gbps, store, args.rounds, small))
            except KernsearchError as exc:  # e.g. too large to check against the reference: say so, go on
                report["left_out"].append(f"{fam.name} {shape}: {exc}")
                log(f"  {shape}: left out: {exc}")
        report["families"][fam.name] = {"landscape": land, "rows": rows}
        print_rows(fam.name, rows)
        (out / "families.json").write_text(json.dumps(report, indent=1, default=str))

    report["goals"] = goals(report)
    report["elapsed_s"] = time.monotonic() - started
    log("\ngoals (issue 13), measured at the large shapes:" + ("  [DRY RUN: modeled, says nothing about a GPU]"
                                                               if args.dry_run else ""))
    for g in report["goals"]:
        log(f"  [{'met' if g['met'] else 'NOT met' if g['met'] is False else 'n/a'}] {g['goal']}: {g['evidence']}")
    published = [f"{r['problem']} {f}" for f, v in report["families"].items() for r in v["rows"]
                 if r.get("publish", {}).get("published")]
    log(f"published through the gate: {', '.join(published) or 'nothing (no kernel beat its op beyond the noise)'}")
    if report["left_out"]:
        log("left out: " + "; ".join(report["left_out"]))
    log(f"elapsed {report['elapsed_s']:.0f} s; results in {out / 'families.json'}, landscapes in "
        f"{out / 'landscapes'}, store in {out / 'store'}")
    (out / "families.json").write_text(json.dumps(report, indent=1, default=str))
    return report


if __name__ == "__main__":
    main()

"""Brute-force a GEMM sub-space on an NVIDIA GPU and save it as a landscape (KernelTuner cache format).

    python benchmarks/gpu_landscape.py --out OUTDIR [--shape 2048,2048,2048] [--jobs 14] [--deadline 540]

Every valid config of the sub-space below (float16) is handled by one of ``--jobs`` worker processes:
1. compiled (NVRTC through ``mx.fast.cuda_kernel``) and verified on a small ragged problem (100x136x72)
   against the float64 reference; the compile time is the wall time of the variant's first launch
   (compile + module load + one tiny run) while ``--jobs`` processes compile at once;
2. then, holding a GPU lock (one process at a time), verified at the full size against the float64
   reference (outputs pre-filled with NaN) and timed (``kernsearch.evaluation._measure.measure``: warm-up, batches
   of at least 5 ms, 10 samples, input sets rotated so the operands are not L2-hot), every repetition
   kept in ``times``. Compiles of other processes go on meanwhile (CPU work; their tiny verification
   launches are the only other GPU work).
Configs that fail a step are recorded as failed (``time`` names the failure kind, ``failure_detail``
says why); configs left when ``--deadline`` seconds have passed are recorded as ``NotMeasured``; configs
the constraints reject are absent, as in KernelTuner. Written with :class:`LandscapeWriter`
(atomically, every 25 configs).
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: The swept sub-space (knob -> values); every valid combination is measured.
SUBSPACE = {"BM": [32, 64, 128], "BN": [64, 128], "BK": [16, 32], "WM": [1, 2, 4], "WN": [1, 2, 4],
            "MMA": ["simdgroup", "scalar"], "STAGE": ["AB"], "VEC": [4], "DOUBLE_BUFFER": [False, True],
            "LAYOUT_B": ["n"], "PAD": [0, 4]}
SMALL = (100, 136, 72)
DTYPE = "float16"

_STATE: dict = {}


def _init(lock, chip_name: str, shape: tuple[int, ...]) -> None:  # noqa: ANN001
    _STATE.update(lock=lock, chip_name=chip_name, shape=shape)


def _setup() -> dict:
    if "fam" not in _STATE:
        from kernsearch import Space, get_backend, get_chip, load_family, make_problem
        from kernsearch.evaluation._verify import make_inputs, reference

        fam = load_family("gemm")
        chip = get_chip(_STATE["chip_name"])
        full = Space(make_problem(fam, _STATE["shape"], DTYPE, chip), chip)
        logical = make_inputs(full.problem, 0)
        _STATE.update(fam=fam, small=Space(make_problem(fam, SMALL, DTYPE, chip), chip), full=full,
                      cuda=get_backend("cuda"), logical=logical, refs=reference(full.problem, logical), copies={})
    return _STATE


def _evaluate(config: dict) -> tuple[dict, dict]:
    """In a worker: compile + small check, then (GPU lock held) full-size check and timing."""
    import mlx.core as mx

    from kernsearch import geometry, render
    from kernsearch._errors import VariantFailure
    from kernsearch.backends._mlx_base import separate_launches, to_mx, to_numpy
    from kernsearch.evaluation._measure import TimingPlan, measure
    from kernsearch.evaluation._verify import SENTINEL, compare, kernel_inputs, verify_kernel

    st = _setup()
    fam, cuda, small, full = st["fam"], st["cuda"], st["small"], st["full"]
    kernel = render(fam, config, DTYPE, "cuda")
    try:
        check, _ = verify_kernel(cuda, kernel, geometry(small, config), small.problem, seed=5)
    except VariantFailure as exc:
        kind = "CompileFailedConfig" if exc.reason == "compile" else "RuntimeFailedConfig"
        return config, {"failure": kind, "failure_detail": f"{exc.reason}: {exc.detail}"[:500]}
    extra = {"compile_time": cuda.compile_seconds.get(kernel.sha256, 0.0) * 1e3}
    if not check.ok:
        return config, {"failure": "WrongResultConfig", "failure_detail": f"{SMALL}: {check.summary()}"[:500], **extra}
    geo = geometry(full, config)
    with st["lock"]:
        try:
            if geo.transposed_inputs not in st["copies"]:
                arrays = kernel_inputs(full.problem, st["logical"], geo)
                st["copies"][geo.transposed_inputs] = [[to_mx(x, DTYPE) for x in arrays]
                                                       for _ in range(cuda.input_sets(arrays, DTYPE, geo))]
            sets = st["copies"][geo.transposed_inputs]
            t0 = time.perf_counter()

            def run(init: float) -> list:
                outs = cuda._call(kernel, geo, sets[0], init)
                mx.eval(outs)
                return [to_numpy(o) for o in outs]

            outputs = run(float("nan"))
            check = compare(full.problem, outputs, st["refs"])
            if check.reason == "nan":
                check = compare(full.problem, outputs, st["refs"], sentinel_outputs=run(SENTINEL))
            extra["verification_time"] = (time.perf_counter() - t0) * 1e3
            if not check.ok:
                return config, {"failure": "WrongResultConfig", "failure_detail": check.summary()[:500], **extra}
            t0 = time.perf_counter()
            launch, sync = separate_launches(lambda a: cuda._call(kernel, geo, a, None), sets)
            samples = measure(launch, sync, plan=TimingPlan(warmup=2, min_batch_ms=5.0, min_samples=10,
                                                            max_samples=10, max_seconds=3.0))
            extra["benchmark_time"] = (time.perf_counter() - t0) * 1e3
        except Exception as exc:  # noqa: BLE001 - one variant's failure is recorded, never fatal
            return config, {"failure": "RuntimeFailedConfig", "failure_detail": str(exc)[:500], **extra}
    flops = full.problem.flops()
    return config, {"times": samples, "GFLOP/s": flops / (float(np.median(samples)) * 1e-3) / 1e9,
                    "max_abs_err": check.max_abs_err, **extra}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", default="2048,2048,2048")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--deadline", type=float, default=540.0, help="seconds; configs left are NotMeasured")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")  # workers' float64 references share the cores
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    started = time.monotonic()

    import mlx.core as mx
    from gpu_gemm import device_chip  # noqa: E402 - same folder

    from kernsearch import Space, load_family, make_problem
    from kernsearch.studies._landscape import NOT_MEASURED, LandscapeWriter

    fam = load_family("gemm")
    chip, info = device_chip()
    problem = make_problem(fam, args.shape, DTYPE, chip)
    space = Space(problem, chip)
    names = list(fam.knobs)
    sub = [dict(zip(names, values)) for values in itertools.product(*(SUBSPACE[n] for n in names))]
    valid = [c for c in sub if space.is_valid(c)]
    print(f"device {info.get('device_name')} ({chip.name}); {problem.shape_text} {DTYPE}; sub-space "
          f"{len(sub)} configs, {len(valid)} valid; {args.jobs} worker processes", flush=True)
    name = f"gemm_{chip.name}_{DTYPE}_{problem.shape_text}.json".replace(" ", "")
    writer = LandscapeWriter(out / name, SUBSPACE, device_name=str(info.get("device_name")),
                             kernel_name="kernsearch gemm (gemm.cu.j2)", problem_size=list(problem.shape),
                             chip=chip.name, dtype=DTYPE, mlx_version=mx.__version__, evidence="measured",
                             device_info=info, method="benchmarks/gpu_landscape.py (docstring)",
                             date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    ctx = mp.get_context("spawn")
    pending = {json.dumps(c, sort_keys=True): c for c in valid}
    with ctx.Pool(args.jobs, initializer=_init, initargs=(ctx.Lock(), chip.name, problem.shape)) as pool:
        results = pool.imap_unordered(_evaluate, valid, chunksize=1)
        while pending:
            left = args.deadline - (time.monotonic() - started)
            try:
                cfg, res = results.next(timeout=max(1.0, left))
            except (mp.TimeoutError, StopIteration):
                break
            pending.pop(json.dumps(cfg, sort_keys=True), None)
            if "times" in res:
                writer.add(cfg, times=res.pop("times"), **res)
            else:
                writer.add(cfg, failure=res.pop("failure"), **res)
            if len(writer.cache) % 25 == 0:
                writer.save()
                print(f"  {len(writer.cache)}/{len(valid)} done at {time.monotonic() - started:.0f} s", flush=True)
        pool.terminate()
    for cfg in pending.values():
        writer.add(cfg, failure=NOT_MEASURED, failure_detail=f"sweep deadline ({args.deadline:.0f} s) reached")
    path = writer.save()
    _summarise(writer, path, out, len(sub), len(valid), problem.flops(), args, time.monotonic() - started)


def _summarise(writer, path, out, n_sub, n_valid, flops, args, total_s) -> None:  # noqa: ANN001
    entries = list(writer.cache.values())
    ok = [e for e in entries if not isinstance(e["time"], str)]
    failed: dict[str, int] = {}
    for e in entries:
        if isinstance(e["time"], str):
            failed[e["time"]] = failed.get(e["time"], 0) + 1
    medians = np.array([float(np.median(e["times"])) for e in ok])
    own = [float((np.percentile(e["times"], 90) - np.percentile(e["times"], 10)) / np.median(e["times"])) for e in ok]
    compile_ms = np.array([e["compile_time"] for e in entries if e.get("compile_time")])
    best = ok[int(np.argmin(medians))]
    summary = {
        "file": path.name, "subspace_configs": n_sub, "valid": n_valid, "measured": len(ok), "failed": failed,
        "best_ms": float(medians.min()), "best_config": {k: best[k] for k in SUBSPACE},
        "best_gflops": flops / (medians.min() * 1e-3) / 1e9, "median_ms": float(np.median(medians)),
        "worst_ms": float(medians.max()), "worst_over_best": float(medians.max() / medians.min()),
        "p10_p90_ms": [float(np.percentile(medians, 10)), float(np.percentile(medians, 90))],
        "per_config_spread_median": float(np.median(own)),
        "compile_ms_median": float(np.median(compile_ms)),
        "compile_ms_p10_p90": [float(np.percentile(compile_ms, 10)), float(np.percentile(compile_ms, 90))],
        "jobs": args.jobs, "total_s": total_s,
    }
    (out / "landscape_summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1), flush=True)


if __name__ == "__main__":
    main()

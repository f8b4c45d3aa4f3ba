"""Brute-force a GEMM sub-space on an NVIDIA GPU and save it as a landscape (KernelTuner cache format).

    python benchmarks/gpu_landscape.py --out OUTDIR [--shape 2048,2048,2048] [--jobs 14]

Every valid config of the sub-space below (float16) is, in order:
1. compiled in parallel worker processes (NVRTC through ``mx.fast.cuda_kernel``; the compiled module
   lands in MLX's on-disk cache, which the measuring process then loads) and verified there on a small
   ragged problem (100x136x72) against the float64 reference; the compile time is the wall time of the
   first launch of a fresh kernel (compile + module load + one tiny run) with ``--jobs`` compiles at once;
2. verified at the full size against the float64 reference (outputs pre-filled with NaN);
3. timed (``kernsearch._measure.measure``: warm-up, batches of at least 5 ms, 10 samples, input sets
   rotated so the operands are not L2-hot) and recorded with every repetition in ``times``.
Configs that fail any step are recorded as failed (``time`` is a string naming the failure kind, the
detail in ``failure_detail``); configs the constraints reject are absent, as in KernelTuner.
The file is written with :class:`kernsearch._landscape.LandscapeWriter` (atomically, every 25 configs).
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import sys
import tempfile
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


def _precompile(args: tuple[str, dict]) -> dict:
    """In a worker: build and verify one config on the small problem; report compile time."""
    chip_name, config = args
    from kernsearch._chips import get_chip
    from kernsearch._errors import VariantFailure
    from kernsearch._render import geometry, render
    from kernsearch._space import Space, make_problem
    from kernsearch._spec import load_family
    from kernsearch._verify import verify_kernel
    from kernsearch.backends import get_backend

    if not _STATE:
        fam = load_family("gemm")
        chip = get_chip(chip_name)
        _STATE.update(fam=fam, space=Space(make_problem(fam, SMALL, DTYPE, chip), chip), cuda=get_backend("cuda"))
    fam, space, cuda = _STATE["fam"], _STATE["space"], _STATE["cuda"]
    kernel = render(fam, config, DTYPE, "cuda")
    try:
        check, _ = verify_kernel(cuda, kernel, geometry(space, config), space.problem, seed=5)
    except VariantFailure as exc:
        return {"ok": False, "kind": "CompileFailedConfig" if exc.reason == "compile" else "RuntimeFailedConfig",
                "detail": f"{exc.reason}: {exc.detail}"[:500]}
    return {"ok": check.ok, "compile_s": cuda.compile_seconds.get(kernel.sha256),
            "kind": None if check.ok else "WrongResultConfig",
            "detail": "" if check.ok else f"small {SMALL}: {check.summary()}"[:500]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", default="2048,2048,2048")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # A fresh compile cache: every compile time below is a real compile, shared with the workers.
    os.environ["MLX_PTX_CACHE_DIR"] = tempfile.mkdtemp(prefix="ks-ptx-")

    import mlx.core as mx

    from kernsearch._landscape import LandscapeWriter
    from kernsearch._measure import TimingPlan, measure
    from kernsearch._render import geometry, render
    from kernsearch._space import Space, format_config, make_problem
    from kernsearch._spec import load_family
    from kernsearch._verify import SENTINEL, compare, kernel_inputs, make_inputs, reference
    from kernsearch.backends import get_backend
    from kernsearch.backends._mlx_cuda import to_mx, to_numpy
    from gpu_gemm import device_chip  # noqa: E402 - same folder

    fam = load_family("gemm")
    chip, info = device_chip()
    problem = make_problem(fam, args.shape, DTYPE, chip)
    space = Space(problem, chip)
    names = list(fam.knobs)
    sub = [dict(zip(names, values)) for values in itertools.product(*(SUBSPACE[n] for n in names))]
    valid = [c for c in sub if space.is_valid(c)]
    print(f"device {info.get('device_name')} ({chip.name}); {problem.shape_text} {DTYPE}; sub-space "
          f"{len(sub)} configs, {len(valid)} valid; compiling with {args.jobs} processes", flush=True)
    name = f"gemm_{chip.name}_{DTYPE}_{problem.shape_text}.json".replace(" ", "")
    writer = LandscapeWriter(out / name, SUBSPACE, device_name=str(info.get("device_name")),
                             kernel_name="kernsearch gemm (gemm.cu.j2)", problem_size=list(problem.shape),
                             chip=chip.name, dtype=DTYPE, mlx_version=mx.__version__, evidence="measured",
                             device_info=info, method="see benchmarks/gpu_landscape.py",
                             date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    started = time.monotonic()
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        pre = pool.map(_precompile, [(chip.name, c) for c in valid], chunksize=2)
    compile_wall = time.monotonic() - started
    print(f"compiled + small-verified {len(valid)} configs in {compile_wall:.0f} s", flush=True)

    cuda = get_backend("cuda")
    logical = make_inputs(problem, 0)
    refs = reference(problem, logical)
    flops = problem.flops()
    plan = TimingPlan(warmup=2, min_batch_ms=5.0, min_samples=10, max_samples=10, max_seconds=3.0)
    copies: dict[tuple, list] = {}
    done = 0
    for cfg, p in zip(valid, pre):
        extra = {"compile_time": (p.get("compile_s") or 0.0) * 1e3}
        if not p["ok"]:
            writer.add(cfg, failure=p["kind"], failure_detail=p["detail"], **extra)
            continue
        kernel, geo = render(fam, cfg, DTYPE, "cuda"), geometry(space, cfg)
        layout = geo.transposed_inputs
        if layout not in copies:
            arrays = kernel_inputs(problem, logical, geo)
            sets = cuda.input_sets(arrays, DTYPE, geo)
            copies[layout] = [[to_mx(x, DTYPE) for x in arrays] for _ in range(sets)]
        sets_ = copies[layout]
        try:
            t0 = time.perf_counter()

            def run(init: float) -> list:
                outs = cuda._call(kernel, geo, sets_[0], DTYPE, init)
                mx.eval(outs)
                return [to_numpy(o) for o in outs]

            outputs = run(float("nan"))
            check = compare(problem, outputs, refs)
            if check.reason == "nan":
                check = compare(problem, outputs, refs, sentinel_outputs=run(SENTINEL))
            verify_s = time.perf_counter() - t0
            if not check.ok:
                writer.add(cfg, failure="WrongResultConfig", failure_detail=check.summary()[:500], **extra)
                continue
            from kernsearch.backends._mlx_cuda import _lazy_launcher

            t0 = time.perf_counter()
            launch, sync = _lazy_launcher(lambda a: cuda._call(kernel, geo, a, DTYPE, None), sets_)
            samples = measure(launch, sync, plan=plan)
            bench_s = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - one variant's failure is recorded, never fatal
            writer.add(cfg, failure="RuntimeFailedConfig", failure_detail=str(exc)[:500], **extra)
            continue
        med = float(np.median(samples))
        writer.add(cfg, times=samples, **extra, verification_time=verify_s * 1e3, benchmark_time=bench_s * 1e3,
                   **{"GFLOP/s": flops / (med * 1e-3) / 1e9}, max_abs_err=check.max_abs_err)
        done += 1
        if done % 25 == 0:
            writer.save()
            print(f"  {done} measured, {format_config(cfg)}: {med:.4f} ms", flush=True)
    path = writer.save()

    entries = writer.cache.values()
    ok = [e for e in entries if not isinstance(e["time"], str)]
    failed: dict[str, int] = {}
    for e in entries:
        if isinstance(e["time"], str):
            failed[e["time"]] = failed.get(e["time"], 0) + 1
    medians = np.array([float(np.median(e["times"])) for e in ok])
    own_spread = [float((np.percentile(e["times"], 90) - np.percentile(e["times"], 10)) / np.median(e["times"]))
                  for e in ok]
    compile_ms = np.array([e["compile_time"] for e in entries if e.get("compile_time")])
    best = min(ok, key=lambda e: float(np.median(e["times"])))
    summary = {
        "file": path.name, "subspace_configs": len(sub), "valid": len(valid), "measured": len(ok), "failed": failed,
        "best_ms": float(medians.min()), "best_config": {k: best[k] for k in SUBSPACE},
        "best_gflops": flops / (medians.min() * 1e-3) / 1e9,
        "median_ms": float(np.median(medians)), "worst_ms": float(medians.max()),
        "worst_over_best": float(medians.max() / medians.min()),
        "p10_p90_ms": [float(np.percentile(medians, 10)), float(np.percentile(medians, 90))],
        "per_config_spread_median": float(np.median(own_spread)),
        "compile_ms_median": float(np.median(compile_ms)), "compile_ms_p10_p90":
            [float(np.percentile(compile_ms, 10)), float(np.percentile(compile_ms, 90))],
        "compile_wall_s": compile_wall, "compile_jobs": args.jobs, "total_s": time.monotonic() - started,
    }
    (out / "landscape_summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

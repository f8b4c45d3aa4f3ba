"""Where MLX keeps a compiled custom kernel: what a fresh process pays for a kernel another process compiled.

On the GPU machine (MLX with its CUDA back-end; from the repository root)::

    python benchmarks/gpu_compile_cache.py --out $OUT     # ~1 minute on an H200
    python benchmarks/gpu_compile_cache.py --dry-run      # here, on the simulated GPU: checks the script

With its own ``MLX_PTX_CACHE_DIR`` (empty at the start), for ``--configs`` (3) GEMM float16 2048^3 configs
(``gpu_throughput.py``'s first ones, seed 0), each in fresh worker processes:

* ``compile_s``       process A compiles the config as a search's worker does (``precompile``: one threadgroup);
* ``same_process_s``  process A's first real launch of it after that (what the search's timing now costs);
* ``fresh_process_s`` process B's first launch of the same config, started after A compiled it (what the
  timing process paid before issue 40: a load if MLX shared its compile across processes, a compile if not);
* ``cache_dir``       the files in ``MLX_PTX_CACHE_DIR`` afterwards (``custom_kernel_*`` ones would be a kernel
  written for other processes; MLX 0.32 writes none: ``docs/timing.md``);
* ``threads``         one process compiling ``--configs`` other configs one after another, then as many again in
  that many threads at once (whether NVRTC compiles run concurrently inside one process; a crash is reported).

Written to ``--out`` (``benchmarks/data``) as ``gpu_compile_cache_<chip>.json`` (``gpu_compile_cache_dry-run.json``
for a dry run, where nothing is measured). What must hold for the search's design (a config timed by the worker
that compiled it): ``same_process_s`` <= 0.1 s for every config.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

FAMILY = "gemm"
DTYPE = "float16"


def compile_then_launch(task: Any) -> tuple[float, float]:
    """In a worker: (seconds of the compile as a search's worker does it, seconds of the first real launch after)."""
    from kernsearch.variants._tasks import PROCESS, _variant

    s, kernel, geo = _variant(task)
    inputs = PROCESS.timing_inputs(s.problem, task.seed + 1, geo)
    start = time.perf_counter()
    s.backend.precompile(kernel, geo, [tuple(x.shape) for x in inputs], s.problem.dtype)
    compiled = time.perf_counter() - start
    return compiled, first_launch(task)


def first_launch(task: Any) -> float:
    """In a worker: seconds of the first launch of the task's config here (compile or lookup, and one run)."""
    from kernsearch.variants._tasks import PROCESS, _variant

    s, kernel, geo = _variant(task)
    inputs = PROCESS.timing_inputs(s.problem, task.seed + 1, geo)
    start = time.perf_counter()
    s.backend.run(kernel, geo, inputs, s.problem.dtype)
    return time.perf_counter() - start


def compile_in_threads(warm: Any, serial: list[Any], tasks: list[Any]) -> dict[str, Any]:
    """In a worker, once ``warm`` ran (MLX, CUDA and the inputs set up): ``serial`` compiled one after another,
    then ``tasks`` in as many threads at once."""
    from concurrent.futures import ThreadPoolExecutor

    from kernsearch.variants._tasks import PROCESS, _variant

    def one(task: Any) -> float:
        s, kernel, geo = _variant(task)
        shapes = [tuple(x.shape) for x in PROCESS.timing_inputs(s.problem, task.seed + 1, geo)]
        start = time.perf_counter()
        s.backend.precompile(kernel, geo, shapes, s.problem.dtype)
        return time.perf_counter() - start

    first_launch(warm)  # the worker's setup (CUDA, inputs, MLX's own kernels) outside the clock
    start = time.perf_counter()
    each_serial = [one(t) for t in serial]
    serial_s = time.perf_counter() - start
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(tasks)) as pool:
        each_threaded = list(pool.map(one, tasks))
    threaded_s = time.perf_counter() - start
    return {"serial_s": round(serial_s, 3), "serial_each_s": [round(x, 3) for x in each_serial],
            "threads_s": round(threaded_s, 3), "threads_each_s": [round(x, 3) for x in each_threaded],
            "concurrent": threaded_s < 0.6 * serial_s}


def cache_listing(folder: Path) -> dict[str, Any]:
    files = sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    names = [str(p.relative_to(folder)) for p in files]
    return {"folder": str(folder), "files": len(files), "bytes": sum(p.stat().st_size for p in files),
            "custom_kernel_files": [n for n in names if "custom_kernel" in n], "first_files": names[:20]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "data"), help="folder of the JSON")
    ap.add_argument("--shape", default=None, help="M,N,K (default 2048,2048,2048; dry run 128,128,128)")
    ap.add_argument("--configs", type=int, default=3, help="configs compiled across processes (default 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true", help="simulated GPU on this machine (tests the script)")
    ap.add_argument("--compile-s", type=float, default=1.0, help="dry run: simulated compile seconds")
    args = ap.parse_args(argv)
    args.shape = args.shape or ("128,128,128" if args.dry_run else "2048,2048,2048")
    cache = Path(tempfile.mkdtemp(prefix="ptx-probe-"))
    os.environ["MLX_PTX_CACHE_DIR"] = str(cache)  # read by each worker process when it starts (spawn)
    from gpu_throughput import pick_configs
    from toolchain import device, toolchain

    from kernsearch import load_family, make_problem
    from kernsearch.evaluation._worker import Worker
    from kernsearch.studies._objective import KernelObjective

    chip, info = device(args.dry_run)
    problem = make_problem(load_family(FAMILY), args.shape, DTYPE, chip)
    configs = pick_configs(problem, chip, 3 * args.configs + 1, args.seed)
    backend, options = "cuda", {}
    if args.dry_run:
        backend = "simulated_gpu:SimulatedGPU"
        options = {"compile_s": args.compile_s, "family": FAMILY, "shape": args.shape, "dtype": DTYPE}
    objective = KernelObjective(problem, chip, backend, seed=args.seed, compile_workers=0, backend_options=options)
    tasks = [objective._task(c, objective.backend) for c in configs]
    objective.close()
    rows = []
    for task in tasks[:args.configs]:
        with Worker(timeout=600) as a, Worker(timeout=600) as b:
            for w in (a, b):  # both set up (CUDA, MLX, the inputs) on another config before A compiles this one
                w.call(first_launch, tasks[-1])
            compiled, same = a.call(compile_then_launch, task)
            fresh = b.call(first_launch, task)
        rows.append({"config": task.config, "compile_s": round(compiled, 3), "same_process_s": round(same, 4),
                     "fresh_process_s": round(fresh, 3)})
        print(json.dumps(rows[-1]), flush=True)
    with Worker(timeout=60) as w:  # threads in MLX may hang: a hang is a finding too
        try:
            k = args.configs
            threads: dict[str, Any] = w.call(compile_in_threads, tasks[-1], tasks[2 * k:3 * k], tasks[k:2 * k])
        except Exception as exc:  # noqa: BLE001 - a crash or an MLX error is the finding
            threads = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    print(json.dumps({"threads": threads}), flush=True)
    report = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "device": info, "chip": chip.name,
              "family": FAMILY, "shape": args.shape, "dtype": DTYPE, "toolchain": toolchain(args.dry_run),
              "dry_run": args.dry_run,
              "evidence": "dry run: simulated GPU, nothing measured" if args.dry_run else "measured",
              "configs": rows, "cache_dir": cache_listing(cache), "threads": threads,
              "same_process_s_max": max(r["same_process_s"] for r in rows),
              "fresh_process_s_mean": round(sum(r["fresh_process_s"] for r in rows) / len(rows), 3),
              "goal": "same_process_s <= 0.1 s for every config (a config timed by the worker that compiled it)",
              "met": all(r["same_process_s"] <= 0.1 for r in rows)}
    name = "gpu_compile_cache_dry-run.json" if args.dry_run else \
        f"gpu_compile_cache_{chip.name.replace(' ', '_')}.json"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / name).write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"cache folder: {json.dumps(report['cache_dir'])}\nwrote {Path(args.out) / name}", flush=True)
    return report


if __name__ == "__main__":
    main()

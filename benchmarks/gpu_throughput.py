"""Measured tuning throughput: today's serial loop against compile-ahead + racing, same shape, seed and configs.

On the GPU machine (MLX with its CUDA back-end; from the repository root)::

    python benchmarks/gpu_throughput.py                  # ~5 minutes on an H100 (at most ~7)
    python benchmarks/gpu_throughput.py --dry-run        # here, on a simulated GPU: checks the script, ~3 min

Both arms evaluate the same configs in the same order: ``--configs`` (48) valid configs of GEMM float16
2048x2048x2048 drawn with ``--seed`` (0), each arm with its own empty ``MLX_PTX_CACHE_DIR`` (MLX keeps only its
own kernels there, never a custom kernel: ``docs/timing.md``) and its own study:

* ``serial``    today's loop: no compile workers (the timing worker compiles each variant at its first
  launch, NVRTC), no racing, every config timed to the full plan (``TimingPlan()``: batches of 20 ms,
  samples until a 2 % spread or 5 s);
* ``pipeline``  workers (cores - 2) each compile a proposal and then verify and time it themselves (MLX keeps
  a compiled kernel in the process that compiled it), one timing at a time while the others compile, the loop
  proposing meanwhile; racing on (a config stops once it cannot beat the incumbent) and the
  search plan (``SEARCH_PLAN``), as ``kernsearch tune`` does now.

Each arm ends with its final round, unchanged (finalists re-timed fully, interleaved with ``mx.matmul``). When
the two winners differ, they are then re-timed head to head in one process (``final_round``), which says
whether the pipeline's winner is the serial one's or within the measured noise of it.

Written to ``--out`` (``benchmarks/data``) as ``gpu_throughput_<chip>.json`` (``gpu_throughput_dry-run.json``
for a dry run): ``serial_configs_per_min``, ``configs_per_min`` (the pipeline's), ``ratio``, both winners
with their final-round times, the head-to-head, and per arm the configs evaluated, stopped early (not
winning), failed, the timing worker's mean first-launch time (NVRTC in the serial arm; in the pipeline a
lookup in the worker that compiled the config, <= 0.1 s) and how long the timer waited for a compile (racing makes timing so short that compiles can
become the bottleneck: then more cores, not a faster GPU, raise the figure). A configs-per-minute figure counts configs with a verdict (timed, stopped early, or failed)
over the search's wall time, before the final round.

``--dry-run`` runs everything here on ``benchmarks/simulated_gpu.py``: compiles of ``--compile-s`` (2.5 s, NVRTC's
median on the H100) kept per process as MLX keeps them, kernels that take real time, verification by construction; ``--workers`` defaults to
14 (the H100 machine's 16 cores less two) so the schedule is the GPU machine's. Nothing it prints is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

FAMILY = "gemm"
DTYPE = "float16"


@dataclass(frozen=True)
class Arm:
    name: str
    compile_workers: int
    racing: bool
    full_plan: bool  # every config timed to TimingPlan() (today's loop); else SEARCH_PLAN


def pick_configs(problem: Any, chip: Any, n: int, seed: int) -> list[dict]:
    """``n`` distinct valid configs drawn uniformly with ``seed`` (rejection sampling over the knobs: GEMM's space
    is too big to enumerate in a moment); the same list, in the same order, for both arms."""
    from kernsearch import Space
    from kernsearch.family._space import format_config

    space, rng = Space(problem, chip), random.Random(seed)
    out: dict[str, dict] = {}
    for _ in range(200000):
        if len(out) >= n:
            break
        config = {k: rng.choice(v) for k, v in space.knobs.items()}
        if space.is_valid(config):
            out.setdefault(format_config(config), config)
    return list(out.values())


def make_objective(arm: Arm, problem: Any, chip: Any, configs: list[dict], args: argparse.Namespace) -> Any:
    from kernsearch.evaluation._measure import TimingPlan
    from kernsearch.studies._objective import KernelObjective

    options: dict[str, Any] = {}
    backend = "cuda"
    if args.dry_run:
        backend = "simulated_gpu:SimulatedGPU"
        options = {"compile_s": args.compile_s, "family": FAMILY, "shape": args.shape, "dtype": DTYPE,
                   "seed": args.seed, "noise": args.noise}
    objective = KernelObjective(problem, chip, backend, seed=args.seed, compile_workers=arm.compile_workers,
                                racing=arm.racing, search_plan=TimingPlan() if arm.full_plan else None,
                                backend_options=options)
    objective.default = lambda: None  # type: ignore[method-assign]  # the list decides what is evaluated
    objective.warm_start = lambda: list(configs)  # type: ignore[method-assign]  # asked for first, in order
    return objective


def run_arm(arm: Arm, problem: Any, chip: Any, configs: list[dict], args: argparse.Namespace) -> dict[str, Any]:
    import optuna

    from kernsearch import run_study
    from kernsearch.family._space import format_config

    cache = tempfile.mkdtemp(prefix=f"ptx-{arm.name}-")
    os.environ["MLX_PTX_CACHE_DIR"] = cache  # read by each worker process when it starts (spawn)
    storage = f"sqlite:///{cache}/study.db"
    started = time.monotonic()
    objective = make_objective(arm, problem, chip, configs, args)
    budget = args.serial_seconds if arm.name == "serial" else None
    result = run_study(objective, trials=len(configs), time_budget=budget, seed=args.seed, storage=storage,
                       sampler="random", finalists=3)
    total = time.monotonic() - started
    trials = optuna.load_study(study_name=result.study_name, storage=storage).trials
    status = [t.user_attrs.get("status") for t in trials]
    first_launch = [t.user_attrs.get("record", {}).get("compile_seconds") for t in trials
                    if t.user_attrs.get("status") in ("ok", "not_winning")]
    first_launch = [x for x in first_launch if x is not None]
    per_min = result.evaluated / result.elapsed_s * 60 if result.elapsed_s else 0.0
    best, final = result.best, result.final
    timed = final.finalists.get(best.number) if best and final else None
    row = {"arm": arm.name, "compile_workers": arm.compile_workers, "racing": arm.racing,
           "plan": "TimingPlan() (full)" if arm.full_plan else "SEARCH_PLAN", "evaluated": result.evaluated,
           "timed_to_the_end": status.count("ok"), "not_winning": status.count("not_winning"),
           "failures": dict(result.failures), "stop_reason": result.stop_reason,
           "search_seconds": round(result.elapsed_s, 1), "with_final_round_seconds": round(total, 1),
           "configs_per_min": round(per_min, 2),
           "loop_ms_per_trial_gpu_idle": round(result.overhead_s_per_trial * 1e3, 1),
           "timer_waited_for_compilers_s": round(objective.compile_wait_s, 1),
           "timer_first_launch_s_mean": round(sum(first_launch) / len(first_launch), 3) if first_launch else None,
           "winner": format_config(best.config) if best else None, "winner_config": best.config if best else None,
           "winner_search_ms": best.time_ms if best else None,
           "winner_final_ms": timed.median_ms if timed else None,
           "winner_final_spread": timed.spread if timed else None,
           "speedup_vs_baseline": final.figures.speedup if final and final.figures else None,
           "baseline_median_ms": final.figures.baseline_median_ms if final and final.figures else None}
    print(f"{arm.name:>9}: {result.evaluated} configs in {result.elapsed_s:.0f} s = {per_min:.1f}/min "
          f"({row['not_winning']} stopped early, failures {dict(result.failures)}); winner {row['winner']} "
          f"{row['winner_final_ms'] or float('nan'):.4f} ms (final round); timing worker's mean first launch "
          f"{row['timer_first_launch_s_mean']} s", flush=True)
    return row


def head_to_head(rows: list[dict], problem: Any, chip: Any, args: argparse.Namespace) -> dict[str, Any] | None:
    """The two winners re-timed interleaved in one fresh process (with the baseline op), when they differ."""
    import numpy as np

    from kernsearch.evaluation._measure import spread
    from kernsearch.evaluation._worker import Worker
    from kernsearch.variants._tasks import final_round

    a, b = rows[0]["winner_config"], rows[1]["winner_config"]
    if a is None or b is None:
        return None
    if a == b:
        return {"same_config": True, "within_noise": True}
    objective = make_objective(Arm("h2h", 0, False, True), problem, chip, [], args)
    task = objective._task(a, objective.backend, finalists=[a, b])
    objective.close()
    with Worker(timeout=600) as worker:
        out = worker.call(final_round, task)
    sa, sb = out.finalists
    ma, mb = float(np.median(sa)), float(np.median(sb))
    gap = mb / ma - 1
    noise = max(spread(sa), spread(sb))
    return {"same_config": False, "serial_winner_ms": ma, "pipeline_winner_ms": mb, "serial_spread": spread(sa),
            "pipeline_spread": spread(sb), "pipeline_over_serial": gap, "within_noise": gap <= noise}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "data"), help="folder of the JSON")
    ap.add_argument("--shape", default=None, help="M,N,K (default 2048,2048,2048; dry run 128,128,128)")
    ap.add_argument("--configs", type=int, default=48, help="configs both arms evaluate (default 48)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=None, help="workers of the pipeline, each compiling and timing "
                    "(cores - 2; dry run 14)")
    ap.add_argument("--serial-seconds", type=float, default=280.0, help="cap on the serial arm's search (s)")
    ap.add_argument("--dry-run", action="store_true", help="simulated GPU on this machine (tests the script)")
    ap.add_argument("--compile-s", type=float, default=2.5, help="dry run: simulated compile seconds")
    ap.add_argument("--noise", type=float, default=0.02, help="dry run: relative noise of a simulated batch")
    args = ap.parse_args(argv)
    args.shape = args.shape or ("128,128,128" if args.dry_run else "2048,2048,2048")
    workers = args.workers or (14 if args.dry_run else max(1, (os.cpu_count() or 3) - 2))
    from toolchain import device, toolchain

    from kernsearch import load_family, make_problem

    chip, info = device(args.dry_run)
    problem = make_problem(load_family(FAMILY), args.shape, DTYPE, chip)
    configs = pick_configs(problem, chip, args.configs, args.seed)
    header = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "device": info, "chip": chip.name,
              "family": FAMILY, "shape": args.shape, "dtype": DTYPE, "seed": args.seed, "configs": len(configs),
              "cpu_count": os.cpu_count(), "toolchain": toolchain(args.dry_run), "dry_run": args.dry_run,
              "evidence": "dry run: simulated GPU, nothing measured" if args.dry_run else "measured"}
    print(json.dumps(header), flush=True)
    rows = [run_arm(Arm("serial", 0, False, True), problem, chip, configs, args),
            run_arm(Arm("pipeline", workers, True, False), problem, chip, configs, args)]
    serial, pipe = rows[0]["configs_per_min"], rows[1]["configs_per_min"]
    ratio = pipe / serial if serial else None
    h2h = head_to_head(rows, problem, chip, args)
    report = {**header, "serial_configs_per_min": serial, "configs_per_min": pipe, "ratio": ratio,
              "serial_winner": rows[0]["winner"], "serial_winner_ms": rows[0]["winner_final_ms"],
              "winner": rows[1]["winner"], "winner_ms": rows[1]["winner_final_ms"], "head_to_head": h2h,
              "arms": rows, "goal": "configs_per_min >= 4 x serial_configs_per_min, same winner or within noise",
              "met": bool(ratio and ratio >= 4 and h2h and h2h["within_noise"])}
    print(f"pipeline / serial configs per minute: {ratio:.2f}x; winners: "
          + ("the same config" if h2h and h2h["same_config"] else f"head to head {json.dumps(h2h)}"), flush=True)
    name = "gpu_throughput_dry-run.json" if args.dry_run else f"gpu_throughput_{chip.name.replace(' ', '_')}.json"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / name).write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"wrote {Path(args.out) / name}", flush=True)
    return report


if __name__ == "__main__":
    main()

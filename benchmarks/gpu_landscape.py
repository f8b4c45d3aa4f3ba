"""Record full landscapes on NVIDIA GPUs: every valid config of a family at a shape, in KernelTuner cache format.

On the GPU machine (MLX with its CUDA back-end; from the repository root)::

    python benchmarks/gpu_landscape.py --out OUTDIR [--pairs gemv:4,4096,4096 swiglu:4096,11008 ...]
        [--time-limit 540] [--gpus N] [--workers W] [--limit N]
    python benchmarks/gpu_landscape.py --dry-run --out /tmp/land     # here, on a simulated GPU (checks the script)

Each ``FAMILY:SHAPE`` pair (float16; default: the decode and row families at their benchmark shapes, see
``DEFAULT_PAIRS``) is swept through the search's own pipeline (``KernelObjective``): workers build the next
configs (NVRTC), and each verifies the config it built on the device against the float64 reference (outputs
pre-filled with NaN) and times it under ``LANDSCAPE_PLAN``, one timing at a time per GPU (warm-up, batches of
>= 5 ms, 10 samples, input sets rotated so operands are not L2-hot), every sample kept in ``times``. No racing: every
config is timed to the end. Configs are swept in a seeded random order, so a sweep cut short is a uniform
sample of the space rather than one corner of it.

A config that fails is recorded as failed (``time`` names the kind: ``CompileFailedConfig``,
``WrongResultConfig``, ``RuntimeFailedConfig``; ``failure_detail`` says why); configs left when the time limit
(``--time-limit`` seconds for the whole run) comes are ``NotMeasured``; configs the constraints reject are
absent, as in KernelTuner. Each landscape is written with :class:`LandscapeWriter` (atomically, every 20
configs and at the end: a run killed from outside leaves the last save) as
``OUTDIR/FAMILY_CHIP_float16_SHAPE.json``, with the device, the toolchain (MLX, driver, nvcc) and the method.
On one GPU the pairs run one after another, each with an equal share of the time left (a pair that finishes
early leaves its time to the rest). A second run with the same ``--out`` resumes: what an earlier run measured
or saw fail is kept, its ``NotMeasured`` configs are swept.

With several GPUs (``--gpus``, default: every GPU ``nvidia-smi -L`` lists), pairs go to GPUs by size (largest
first, each to the least loaded GPU); each GPU runs its pairs one after another in its own process
(``CUDA_VISIBLE_DEVICES``), with ``cores / gpus - 2`` compile workers: one landscape is always timed on one GPU.

``--dry-run`` uses ``benchmarks/simulated_gpu.py`` (compiles of ``--compile-s``, kernels that take real time,
verification by construction) at the shapes given; nothing it writes is measured (``evidence`` says so).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

DTYPE = "float16"
#: The redesigned decode families and the row families at their benchmark shapes (valid configs on the H100:
#: gemv 672, qmatvec 351, rmsnorm 892, layernorm 892, softmax 1784, swiglu 315).
DEFAULT_PAIRS = ("gemv:4,4096,4096", "qmatvec:4,4096,4096,512,64", "rmsnorm:4096,4096", "layernorm:4096,4096",
                 "softmax:4096,4096", "swiglu:4096,11008")
SAVE_EVERY = 20
_FAILURE_KIND = {"compile": "CompileFailedConfig", "render": "CompileFailedConfig", "wrong": "WrongResultConfig",
                 "nan": "WrongResultConfig", "unwritten": "WrongResultConfig"}


def landscape_plan() -> Any:
    """10 samples of >= 5 ms batches after 3 warm-ups: the search's batch length, a fixed count per config."""
    from kernsearch.evaluation._measure import TimingPlan

    return TimingPlan(warmup=3, min_batch_ms=5.0, min_samples=10, max_samples=10, target_spread=0.0, max_seconds=3.0)


def parse_pair(text: str) -> tuple[str, str]:
    family, sep, shape = text.partition(":")
    if not sep or not family or not shape:
        raise SystemExit(f"bad pair {text!r}: use FAMILY:SHAPE, e.g. swiglu:4096,11008")
    return family, shape


def file_name(family: str, chip: str, shape_text: str) -> str:
    return f"{family}_{chip}_{DTYPE}_{shape_text}.json".replace(" ", "")


def sweep(family: str, shape: str, args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    """Every valid config of ``family`` at ``shape`` (or ``--limit`` of them), until ``deadline``."""
    from toolchain import device, toolchain

    from kernsearch import Space, load_family, make_problem, run_study
    from kernsearch._errors import VariantFailure
    from kernsearch.studies._landscape import NOT_MEASURED, LandscapeWriter, config_string
    from kernsearch.studies._objective import KernelObjective

    chip, info = device(args.dry_run)
    fam = load_family(family)
    problem = make_problem(fam, shape, DTYPE, chip)
    space = Space(problem, chip)
    valid = space.enumerate().valid
    random.Random(args.seed).shuffle(valid)
    configs = valid[: args.limit] if args.limit else valid
    backend, options = "cuda", {}
    if args.dry_run:
        backend = "simulated_gpu:SimulatedGPU"
        options = {"compile_s": args.compile_s, "family": family, "shape": shape, "dtype": DTYPE, "noise": 0.03,
                   "kernel_ms": None}
    path = Path(args.out) / file_name(family, chip.name, problem.shape_text)
    writer = LandscapeWriter(path, space.knobs, device_name=str(info.get("device_name")),
                             kernel_name=f"kernsearch {family} ({'simulated' if args.dry_run else 'cuda'})",
                             problem_size=list(problem.shape), chip=chip.name, dtype=DTYPE,
                             evidence="dry run: simulated GPU, nothing measured" if args.dry_run else "measured",
                             toolchain=toolchain(args.dry_run), device_info=info, valid_configs=len(valid),
                             method="benchmarks/gpu_landscape.py (docstring): verified on the device, "
                                    "LANDSCAPE_PLAN, no racing",
                             date=datetime.now(UTC).isoformat(timespec="seconds"))
    kept = resume(writer, path)
    todo = [c for c in configs if config_string(c[k] for k in space.knobs) not in writer.cache]
    objective = KernelObjective(problem, chip, backend, seed=args.seed, compile_workers=args.workers, racing=False,
                                search_plan=landscape_plan(), backend_options=options)
    objective.default = lambda: None  # type: ignore[method-assign]
    objective.warm_start = lambda: list(todo)  # type: ignore[method-assign]  # swept in this order
    evaluate = objective.evaluate_against

    def recording(config: dict, race: Any) -> Any:
        try:
            rec = evaluate(config, race)
        except VariantFailure as exc:
            writer.add(config, failure=_FAILURE_KIND.get(exc.reason, "RuntimeFailedConfig"),
                       failure_detail=f"{exc.reason}: {exc.detail}"[:500])
            raise
        writer.add(config, rec.samples_ms, compile_time=rec.compile_seconds * 1e3, max_abs_err=rec.proof.max_abs_err if rec.proof is not None else None,
                   spread=rec.spread)
        if len(writer.cache) % SAVE_EVERY == 0:
            writer.save()
        return rec

    objective.evaluate_against = recording  # type: ignore[method-assign]
    started = time.monotonic()
    result = run_study(objective, trials=len(todo), time_budget=max(1.0, deadline - time.monotonic()),
                       sampler="random", seed=args.seed, storage=":memory:", finalists=0) if todo else None
    verdicts = len(writer.cache) - kept
    for config in configs:
        if config_string(config[k] for k in space.knobs) not in writer.cache:
            writer.add(config, failure=NOT_MEASURED, failure_detail="the sweep's time limit came first")
    writer.save()
    entries = list(writer.cache.values())
    kinds: dict[str, int] = {}
    for e in entries:
        if isinstance(e["time"], str):
            kinds[e["time"]] = kinds.get(e["time"], 0) + 1
    measured = [e for e in entries if not isinstance(e["time"], str)]
    best = min(measured, key=lambda e: e["time"]) if measured else None
    summary = {"file": path.name, "valid": len(valid), "swept": len(configs), "kept_from_before": kept,
               "measured": len(measured),
               "failed_or_left": kinds, "seconds": round(time.monotonic() - started, 1),
               "configs_per_min": round(verdicts / max(1e-9, time.monotonic() - started) * 60, 1),
               "best_ms": best["time"] if best else None, "stop": result.stop_reason if result else "nothing left"}
    print(json.dumps(summary), flush=True)
    return summary


def resume(writer: Any, path: Path) -> int:
    """Keep what an earlier run of the same sweep wrote to ``path`` (same knobs and device): every config
    measured or failed there is not swept again; NotMeasured ones are. Returns how many were kept."""
    from kernsearch.studies._landscape import Landscape

    if not path.is_file():
        return 0
    try:
        old = Landscape.load(path)  # bounded, checked read: the file is data, never trusted
    except Exception as exc:  # noqa: BLE001 - unreadable: swept afresh (and overwritten)
        print(f"  {path.name}: not resumed ({exc})", flush=True)
        return 0
    if old.knobs != writer.knobs or old.device_name != writer.header["device_name"]:
        print(f"  {path.name}: another space or device: swept afresh (overwritten)", flush=True)
        return 0
    for key, entry in old.entries.items():  # NotMeasured entries were dropped on reading
        writer.cache[key] = entry
    return len(old.entries)


def gpu_count(dry_run: bool) -> int:
    if dry_run:
        return 1
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return 1
    return max(1, sum(1 for line in out.splitlines() if line.startswith("GPU ")))


def assign(pairs: list[tuple[str, str]], gpus: int) -> list[list[tuple[str, str]]]:
    """Pairs to GPUs, largest valid space first, each to the least loaded GPU (by valid configs)."""
    from kernsearch import Space, get_chip, load_family, make_problem

    chip = get_chip("H100")
    size = {}
    for fam, shape in pairs:
        try:
            size[(fam, shape)] = len(Space(make_problem(load_family(fam), shape, DTYPE, chip), chip).enumerate().valid)
        except Exception:  # noqa: BLE001 - a bad pair is refused by its sweep with its own message
            size[(fam, shape)] = 0
    load = [0] * gpus
    out: list[list[tuple[str, str]]] = [[] for _ in range(gpus)]
    for pair in sorted(pairs, key=lambda p: -size[p]):
        i = load.index(min(load))
        out[i].append(pair)
        load[i] += size[pair]
    return [o for o in out if o]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder of the landscapes (then copy them to benchmarks/data)")
    ap.add_argument("--pairs", nargs="*", default=list(DEFAULT_PAIRS), help="FAMILY:SHAPE ... (float16)")
    ap.add_argument("--time-limit", type=float, default=540.0, help="seconds for the whole run; what is left is "
                    "recorded NotMeasured")
    ap.add_argument("--gpus", type=int, default=None, help="GPUs to use in parallel (default: all)")
    ap.add_argument("--workers", type=int, default=None, help="compile workers per GPU (cores / gpus - 2)")
    ap.add_argument("--limit", type=int, default=0, help="sweep only this many configs per pair (a check)")
    ap.add_argument("--seed", type=int, default=0, help="the sweep order")
    ap.add_argument("--dry-run", action="store_true", help="simulated GPU on this machine (tests the script)")
    ap.add_argument("--compile-s", type=float, default=0.3, help="dry run: simulated compile seconds")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    deadline = time.monotonic() + args.time_limit
    Path(args.out).mkdir(parents=True, exist_ok=True)
    pairs = [parse_pair(p) for p in args.pairs]
    gpus = min(args.gpus or gpu_count(args.dry_run), len(pairs))
    args.workers = args.workers or max(1, (os.cpu_count() or 3) // max(1, gpus) - 2)
    if args.child or gpus <= 1:  # one GPU: the pairs one after another, each with its share of the time left
        out = []
        for i, (fam, shape) in enumerate(pairs):
            share = (deadline - time.monotonic()) / (len(pairs) - i)
            out.append(sweep(fam, shape, args, time.monotonic() + share))
        return out
    procs = []
    for i, group in enumerate(assign(pairs, gpus)):
        cmd = [sys.executable, __file__, "--child", "--out", args.out, "--time-limit", str(args.time_limit - 5),
               "--workers", str(args.workers), "--seed", str(args.seed), "--limit", str(args.limit),
               "--pairs", *[f"{f}:{s}" for f, s in group]]
        print(f"GPU {i}: {', '.join(f'{f}:{s}' for f, s in group)}", flush=True)
        procs.append(subprocess.Popen(cmd, env={**os.environ, "CUDA_VISIBLE_DEVICES": str(i)}))
    for p in procs:
        p.wait()
    return []


if __name__ == "__main__":
    main()

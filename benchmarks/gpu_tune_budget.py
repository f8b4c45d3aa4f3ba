"""How many configs a user's timed tune evaluates: ``kernsearch tune qmatvec --backend cuda --time-budget 120s``.

On the GPU machine (MLX with its CUDA back-end; from the repository root)::

    python benchmarks/gpu_tune_budget.py --out $OUT      # ~2.5 minutes per shape on an H200
    python benchmarks/gpu_tune_budget.py --dry-run       # here, on the simulated GPU: checks the script

For each ``--shapes`` entry (default the decode shape 1,12288,4096,512,64) it runs the command a user runs, as a
subprocess, with ``--json`` and a fresh study storage (nothing known beforehand), and reads back the configs
evaluated, the search's seconds and why it stopped. Before issue 40 an H200 evaluated 50-68 configs in 120 s
(``../shared/measurements/2026-11-28-h200/tunes_1.log``: 55 in 121 s for this shape, 27 a minute). Its space holds
70 valid configs, so "3x the configs in the same budget" is read as configs per minute of search: >= 3 x 27 = 82
a minute, i.e. the 70 evaluated (``every valid config evaluated``) within about 51 s. The default ``--patience``
(60 trials without a new best) may end the search earlier: the rate still says it.

``--dry-run`` runs the same search through the API on ``benchmarks/simulated_gpu.py`` (the CLI cannot pass the
simulation its options), a small shape, compiles of ``--compile-s``: nothing it prints is measured. Written to
``--out`` as ``gpu_tune_budget_<chip>.json`` (``gpu_tune_budget_dry-run.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing
sys.path.insert(0, str(REPO / "benchmarks"))

FAMILY = "qmatvec"
BEFORE_PER_MIN = 55 / 121.1 * 60  # tunes_1.log, qmatvec 1,12288,4096,512,64 on an H200 before issue 40


def tune_cli(shape: str, budget: str, storage: str) -> dict[str, Any]:
    """The user's command, its JSON result read back."""
    cmd = [sys.executable, "-m", "kernsearch", "tune", FAMILY, "--shape", shape, "--backend", "cuda",
           "--time-budget", budget, "--storage", storage, "--json"]
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")])}, check=False)
    wall = time.monotonic() - started
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-600:]}", "wall_s": round(wall, 1)}
    data = json.loads(done.stdout)
    return {"evaluated": data["evaluated"], "elapsed_s": data["elapsed_s"], "stop_reason": data["stop_reason"],
            "failures": data["failures"], "winner": (data.get("winner") or {}).get("config"),
            "wall_s": round(wall, 1), "stderr_tail": done.stderr.strip().splitlines()[-3:]}


def tune_simulated(shape: str, budget: str, storage: str, compile_s: float, workers: int) -> dict[str, Any]:
    """The same search through the API, on the simulated GPU (a dry run)."""
    from kernsearch import get_chip, load_family, make_problem, run_study
    from kernsearch.studies._objective import KernelObjective

    chip = get_chip("H100")
    problem = make_problem(load_family(FAMILY), shape, "float16", chip)
    options = {"compile_s": compile_s, "family": FAMILY, "shape": shape, "dtype": "float16"}
    objective = KernelObjective(problem, chip, "simulated_gpu:SimulatedGPU", seed=0, timeout=120.0,
                                compile_workers=workers, backend_options=options)
    started = time.monotonic()
    try:
        result = run_study(objective, trials=None, time_budget=budget, patience=60, storage=storage, seed=0)
    finally:
        objective.close()
    return {"evaluated": result.evaluated, "elapsed_s": result.elapsed_s, "stop_reason": result.stop_reason,
            "failures": dict(result.failures), "winner": result.best.config if result.best else None,
            "wall_s": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "data"), help="folder of the JSON")
    ap.add_argument("--shapes", nargs="+", default=None, help="qmatvec shapes (default 1,12288,4096,512,64; "
                    "dry run 1,256,512,64,8)")
    ap.add_argument("--time-budget", default="120s")
    ap.add_argument("--dry-run", action="store_true", help="simulated GPU on this machine (tests the script)")
    ap.add_argument("--compile-s", type=float, default=1.0, help="dry run: simulated compile seconds")
    ap.add_argument("--workers", type=int, default=4, help="dry run: workers (tune's default: cores - 2)")
    args = ap.parse_args(argv)
    shapes = args.shapes or (["1,256,512,64,8"] if args.dry_run else ["1,12288,4096,512,64"])
    from toolchain import device, toolchain

    chip, info = device(args.dry_run)
    rows = []
    for shape in shapes:
        storage = f"sqlite:///{tempfile.mkdtemp(prefix='tune-budget-')}/study.db"
        row = tune_simulated(shape, args.time_budget, storage, args.compile_s, args.workers) if args.dry_run \
            else tune_cli(shape, args.time_budget, storage)
        if "evaluated" in row:
            row["configs_per_min"] = round(row["evaluated"] / row["elapsed_s"] * 60, 1) if row["elapsed_s"] else None
        rows.append({"shape": shape, **row})
        print(json.dumps(rows[-1]), flush=True)
    rates = [r.get("configs_per_min") or 0.0 for r in rows]
    report = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "device": info, "chip": chip.name,
              "family": FAMILY, "time_budget": args.time_budget, "cpu_count": os.cpu_count(),
              "toolchain": toolchain(args.dry_run), "dry_run": args.dry_run,
              "evidence": "dry run: simulated GPU, nothing measured" if args.dry_run else "measured",
              "command": f"kernsearch tune {FAMILY} --shape S --backend cuda --time-budget {args.time_budget} --json",
              "runs": rows, "before_configs_per_min": round(BEFORE_PER_MIN, 1),
              "goal": "configs per minute of search >= 3 x before (or every valid config evaluated that fast)",
              "met": bool(rows) and all(r >= 3 * BEFORE_PER_MIN for r in rates)}
    name = "gpu_tune_budget_dry-run.json" if args.dry_run else f"gpu_tune_budget_{chip.name.replace(' ', '_')}.json"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / name).write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"wrote {Path(args.out) / name}", flush=True)
    return report


if __name__ == "__main__":
    main()

"""How good is the search? Replay the recorded landscapes in ../shared/landscapes and compare strategies.

For each landscape and each budget (1 % and 5 % of the configs in the file), run the default strategy
(``run_study`` with its default sampler) and random search for 20 seeds; score each run by
optimum time / recorded time of the config the search picked (1.0 = found the optimum; the pick is made
on noisy replayed timings, as on a real GPU). Prints the median and 10th percentile over the seeds, and
the framework's own overhead per trial (time not spent evaluating: sampler, storage, loop), in memory
and with the default SQLite storage.

    .venv/bin/python benchmarks/search_landscapes.py [--seeds 20] [--landscapes DIR] [--only pnpoly]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kernsearch._study import run_study
from kernsearch.backends._replay import ReplayBackend

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DIR = Path(os.environ.get("KERNSEARCH_LANDSCAPES", REPO.parent / "shared" / "landscapes"))


def score(path: Path, sampler: str, budget: int, seed: int, storage: str = ":memory:") -> tuple[float, float]:
    backend = ReplayBackend(path, seed=seed)
    _, optimum = backend.landscape.optimum()
    result = run_study(backend.objective(), trials=budget, sampler=sampler, seed=seed, storage=storage,
                       study_name=f"bench-{sampler}-{seed}")
    picked = backend.landscape.entry(result.best.config)
    return optimum / float(picked["time"]), result.overhead_s_per_trial


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--landscapes", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--only", default="", help="comma-separated substrings of the landscape file names to run")
    ap.add_argument("--budgets", default="1,5", help="percent of the space, comma-separated")
    ap.add_argument("--strategies", default="tpe,random", help="samplers; tpe is run_study's default")
    args = ap.parse_args()
    files = sorted(p for p in args.landscapes.glob("*.json*")
                   if any(part in p.name for part in args.only.split(",")))
    if not files:
        sys.exit(f"no landscapes in {args.landscapes}")
    print(f"score = optimum / recorded time of the picked config (1.00 = optimum); {args.seeds} seeds; "
          "median and p10 over seeds\n")
    head = f"{'landscape':<26}{'configs':>8}{'budget':>12}" + "".join(
        f"{s + ' med':>11}{s + ' p10':>11}" for s in args.strategies.split(","))
    print(head)
    print("-" * len(head))
    overheads: dict[str, list[float]] = {}
    for path in files:
        size = len(ReplayBackend(path).landscape)
        for pct in (float(b) for b in args.budgets.split(",")):
            budget = max(1, math.ceil(size * pct / 100))
            row = f"{path.name.split('.')[0]:<26}{size:>8}{f'{pct:g}% ({budget})':>12}"
            for strategy in args.strategies.split(","):
                scores = []
                for seed in range(args.seeds):
                    s, overhead = score(path, strategy, budget, seed)
                    scores.append(s)
                    overheads.setdefault(strategy, []).append(overhead)
                row += f"{statistics.median(scores):>11.3f}{float(np.percentile(scores, 10)):>11.3f}"
            print(row, flush=True)
    print("\nframework overhead per trial (sampler + storage + loop; replay evaluation excluded):")
    for strategy, values in overheads.items():
        print(f"  {strategy:<7} in memory: median {statistics.median(values) * 1e3:.1f} ms/trial")
    with tempfile.TemporaryDirectory() as tmp:
        path = files[0]
        for strategy in args.strategies.split(","):
            t0 = time.perf_counter()
            _, overhead = score(path, strategy, 200, 0, storage=f"sqlite:///{tmp}/bench.db")
            print(f"  {strategy:<7} SQLite ({path.name.split('.')[0]}, 200 trials): {overhead * 1e3:.1f} ms/trial "
                  f"(run {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()

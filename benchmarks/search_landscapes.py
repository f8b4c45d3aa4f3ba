"""How good is the search? Replay recorded landscapes (KernelTuner cache files) and compare strategies.

    .venv/bin/python benchmarks/search_landscapes.py --tuning ../shared/landscapes \\
        --held-out benchmarks/data NEW_FOLDER ... [--strategies auto,tpe,random] [--budgets 1,5] [--seeds 20]

Every ``*.json`` / ``*.json.gz`` KernelTuner cache file in the given folders (or the files themselves) is
replayed: each strategy searches with a budget of 1 % and 5 % of the file's configs for ``--seeds`` seeds
(``run_study`` on a replayed landscape: noisy timings drawn from the recorded repetitions). Two scores per run,
both ``optimum time / recorded time`` (1.0 = the optimum):

* ``visited`` — the best config among those the search evaluated (what the strategy found);
* ``picked``  — the config the search picked on its noisy timings after the final round (what it ships).

Printed per file and budget: the median and 10th percentile over seeds of each, per strategy, and the
difference to random search; then per budget the mean over files of the medians and of the p10s.
Files tuned on (``--tuning``) and held-out files (``--held-out``) are reported in separate sections:
only the held-out section says how the strategy generalises. Last, the framework overhead per trial
(sampler + storage + loop, replay evaluation excluded) in memory and with SQLite.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernsearch import run_study  # noqa: E402
from kernsearch.studies._replay import Replay  # noqa: E402

NO_PRIOR = False  # --no-prior: strategies get no performance-model prediction, even for kernsearch's own files


@dataclass
class Runs:
    visited: list[float] = field(default_factory=list)
    picked: list[float] = field(default_factory=list)
    overhead_s: list[float] = field(default_factory=list)


def one_run(path: Path, strategy: str, budget: int, seed: int, storage: str = ":memory:") -> tuple[float, float, float]:
    backend = Replay(path, seed=seed)
    land = backend.landscape
    _, optimum = land.optimum()
    objective = backend.objective()
    if NO_PRIOR:
        objective.prior = lambda configs: None  # type: ignore[method-assign]
    seen: list[dict] = []
    evaluate = objective.evaluate

    def recording(config: dict) -> object:  # every config the search evaluated: the 'visited' score
        seen.append(config)
        return evaluate(config)

    objective.evaluate = recording  # type: ignore[method-assign]
    result = run_study(objective, trials=budget, sampler=strategy, seed=seed, storage=storage,
                       study_name=f"bench-{strategy}-{seed}")
    times = [land.entry(c).get("time") for c in seen]
    best_visited = min((float(t) for t in times if isinstance(t, (int, float))), default=math.inf)
    picked = float(land.entry(result.best.config)["time"]) if result.best else math.inf
    return optimum / best_visited, optimum / picked, result.overhead_s_per_trial


def files_in(targets: list[Path]) -> list[Path]:
    out: list[Path] = []
    for t in targets:
        if t.is_dir():
            out += sorted(p for p in t.iterdir() if p.name.endswith((".json", ".json.gz"))
                          and not p.name.endswith(".summary.json") and _is_landscape(p))
        elif t.exists():
            out.append(t)
        else:
            sys.exit(f"no such file or folder: {t}")
    return out


def _is_landscape(path: Path) -> bool:
    try:
        return len(Replay(path).landscape) > 0
    except Exception:  # noqa: BLE001 - not a KernelTuner cache file: skipped (said below)
        print(f"  (skipped {path}: not a KernelTuner cache file)", file=sys.stderr)
        return False


def section(title: str, files: list[Path], strategies: list[str], budgets: list[float], seeds: int,
            overheads: dict[str, list[float]]) -> None:
    if not files:
        return
    print(f"\n== {title} ==")
    head = f"{'landscape':<40}{'configs':>8}{'budget':>11}  " + "".join(
        f"{s + ' vis med/p10':>20}{s + ' pick med/p10':>21}" for s in strategies)
    print(head)
    print("-" * len(head))
    means: dict[tuple[float, str], list[tuple[float, float, float, float]]] = {}
    for path in files:
        size = len(Replay(path).landscape)
        for pct in budgets:
            budget = max(1, math.ceil(size * pct / 100))
            row = f"{path.name.split('.json')[0][:39]:<40}{size:>8}{f'{pct:g}% ({budget})':>11}  "
            stats = {}
            for strategy in strategies:
                runs = Runs()
                for seed in range(seeds):
                    v, p, o = one_run(path, strategy, budget, seed)
                    runs.visited.append(v)
                    runs.picked.append(p)
                    overheads.setdefault(strategy, []).append(o)
                s = (statistics.median(runs.visited), float(np.percentile(runs.visited, 10)),
                     statistics.median(runs.picked), float(np.percentile(runs.picked, 10)))
                stats[strategy] = s
                means.setdefault((pct, strategy), []).append(s)
                row += f"{s[0]:>12.3f}/{s[1]:<7.3f}{s[2]:>13.3f}/{s[3]:<7.3f}"
            if "random" in stats:
                row += "  vs random (pick med): " + ", ".join(
                    f"{k} {stats[k][2] - stats['random'][2]:+.3f}" for k in strategies if k != "random")
            print(row, flush=True)
    print(f"mean over {len(files)} file(s) of per-file median / p10:")
    for (pct, strategy), rows in sorted(means.items()):
        m = np.mean(np.array(rows), axis=0)
        print(f"  {pct:g}%  {strategy:<7} visited {m[0]:.3f} / {m[1]:.3f}   picked {m[2]:.3f} / {m[3]:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tuning", type=Path, nargs="*", default=[], help="folders/files the strategy was tuned on")
    ap.add_argument("--held-out", type=Path, nargs="*", default=[], help="folders/files it was NOT tuned on")
    ap.add_argument("--strategies", default="auto,tpe,random", help="samplers (run_study's --sampler names)")
    ap.add_argument("--budgets", default="1,5", help="percent of each file's configs, comma-separated")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--only", default="", help="comma-separated substrings of file names to keep")
    ap.add_argument("--no-prior", action="store_true",
                    help="withhold the performance model's predictions (auto's start) from every file")
    ap.add_argument("--no-sqlite", action="store_true", help="skip the SQLite overhead measurement")
    args = ap.parse_args()
    if not args.tuning and not args.held_out:
        ap.error("give --tuning and/or --held-out folders of KernelTuner cache files")
    keep = [s for s in args.only.split(",") if s]
    global NO_PRIOR
    NO_PRIOR = args.no_prior

    def pick(paths: list[Path]) -> list[Path]:
        return [p for p in files_in(paths) if not keep or any(k in p.name for k in keep)]

    strategies = [s for s in args.strategies.split(",") if s]
    budgets = [float(b) for b in args.budgets.split(",")]
    print(("NO PRIOR: the performance model's predictions are withheld\n" if args.no_prior else "")
          + f"score = optimum / recorded time (1.00 = optimum); {args.seeds} seeds; median/p10 over seeds; "
          "vis = best config visited, pick = config picked on noisy timings after the final round")
    overheads: dict[str, list[float]] = {}
    section("TUNING files (the strategy was tuned on these: not evidence of generalisation)", pick(args.tuning),
            strategies, budgets, args.seeds, overheads)
    section("HELD-OUT files (not tuned on)", pick(args.held_out), strategies, budgets, args.seeds, overheads)
    print("\nframework overhead per trial (sampler + storage + loop; replay evaluation excluded):")
    for strategy, values in overheads.items():
        print(f"  {strategy:<7} in memory: median {statistics.median(values) * 1e3:.1f} ms/trial over all runs above")
    files = pick(args.held_out) or pick(args.tuning)
    # the largest file: on a small one 200 trials exhaust the space and time the loop's no-op ends instead
    first = [max(files, key=lambda p: len(Replay(p).landscape))] if files else []
    if first and not args.no_sqlite:
        with tempfile.TemporaryDirectory() as tmp:
            for strategy in strategies:
                t0 = time.perf_counter()
                _, _, overhead = one_run(first[0], strategy, 200, 0, storage=f"sqlite:///{tmp}/bench.db")
                print(f"  {strategy:<7} SQLite ({first[0].name.split('.json')[0]}, up to 200 trials): "
                      f"{overhead * 1e3:.1f} ms/trial (run {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()

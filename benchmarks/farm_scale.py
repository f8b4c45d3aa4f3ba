"""A farm by simulation: N = 1, 2, 4, 8 worker processes on one PostgreSQL study, replaying a landscape.

Each worker is a separate process running the product's search loop (``run_study``, TPE) on one shared study
in a real PostgreSQL server (started in a temp dir, as tests/pgserver.py does), with the replayed landscape
as the GPU and a fixed simulated evaluation time per config (compile + verify + measure on a real machine).

Two questions:
1. Search efficiency: with the total budget fixed, do N workers find as good a config as one? (TPE
   proposing while N-1 trials are still running may propose the same region N times; "constant liar"
   treats those running trials as bad.) Score at each budget = optimum time / recorded time of the best
   config found so far (1.0 = the optimum), median over seeds, for TPE with and without constant liar.
2. Throughput: configs evaluated per minute for each N, and what the storage sustains: N processes doing
   nothing but the loop (instant evaluations, random sampler) -> trials/s until the storage (or this
   machine's CPUs) saturates.

    .venv/bin/python benchmarks/farm_scale.py [--landscape PATH] [--seeds 3] [--budget 64] [--eval-s 0.25]
        [--out benchmarks/farm_scale.txt]
    .venv/bin/python benchmarks/farm_scale.py --dry-run     # one seed, small budget: checks the script

Figures depend on the machine's cores: the workers, the sampler and the PostgreSQL server share them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LANDSCAPES = Path(os.environ.get("KERNSEARCH_LANDSCAPES", REPO.parent / "shared" / "landscapes"))
sys.path.insert(0, str(REPO / "tests"))  # tests/pgserver.py: a real PostgreSQL server in a temp dir


# -- one worker (a separate process) ------------------------------------------------------------------

def worker(url: str, study: str, budget: int, eval_s: float, sampler: str, liar: bool, seed: int,
           landscape: str) -> None:
    from kernsearch.studies import _samplers, _study
    from kernsearch.studies._replay import Replay

    _samplers.CONSTANT_LIAR = liar  # read by make_sampler
    objective = Replay(landscape, seed=seed).objective()
    evaluate = objective.evaluate_against

    def slow(config: dict[str, Any], race: Any) -> Any:
        time.sleep(eval_s)  # stands in for compile + verify + measure on the machine's GPU
        return evaluate(config, race)

    objective.evaluate_against = slow  # type: ignore[method-assign]
    result = _study.run_study(objective, trials=budget, sampler=sampler, seed=seed, storage=url,
                              study_name=study, finalists=1)
    print(json.dumps({"evaluated": result.evaluated, "overhead_s": result.overhead_s_per_trial}))


def run_workers(url: str, study: str, n: int, budget: int, eval_s: float, sampler: str, liar: bool, seed: int,
                landscape: Path) -> float:
    """Start n workers on one study, wait for all; returns the wall time."""
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", url, study, str(budget), str(eval_s), sampler,
                               str(int(liar)), str(seed * 100 + i), str(landscape)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
    for p in procs:
        _, err = p.communicate(timeout=900)
        if p.returncode != 0:
            raise SystemExit(f"worker failed: {err.strip().splitlines()[-1] if err.strip() else p.returncode}")
    return time.monotonic() - t0


# -- scoring --------------------------------------------------------------------------------------------

def best_curve(url: str, study: str, landscape: Any, checkpoints: list[int]) -> tuple[list[float], int, int]:
    """optimum / recorded time of the best config among the first b configs evaluated (completion order)."""
    import optuna

    from kernsearch.studies._storage import make_storage

    trials = optuna.load_study(study_name=study, storage=make_storage(url)).get_trials(deepcopy=False)
    done = sorted((t for t in trials if t.user_attrs.get("status") in ("ok", "failed")),
                  key=lambda t: t.datetime_complete)
    _, optimum = landscape.optimum()
    best, curve, i = float("inf"), [], 0
    for b in checkpoints:
        while i < min(b, len(done)):
            t = done[i]
            if t.user_attrs.get("status") == "ok":
                best = min(best, float(landscape.entry(t.user_attrs["config"])["time"]))
            i += 1
        curve.append(optimum / best if best < float("inf") else 0.0)
    configs = [json.dumps(t.user_attrs["config"], sort_keys=True) for t in done]
    return curve, len(configs), len(configs) - len(set(configs))


def storage_rate(url: str, n: int, seconds: float, landscape: Path) -> float:
    """Trials/s of n processes running the loop with instant evaluations and the random sampler."""
    import optuna

    from kernsearch.studies._storage import make_storage

    study = f"rate-{n}-{time.time_ns()}"
    storage = make_storage(url)
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", url, study, "100000", "0", "random", "0",
                               str(i), str(landscape)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for i in range(n)]

    def count() -> int:
        try:
            return len(optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False))
        except KeyError:  # not created yet
            return 0

    try:
        deadline = time.monotonic() + 120
        while count() < 20 * n and time.monotonic() < deadline:  # every process started and running
            time.sleep(0.5)
        c0, t0 = count(), time.monotonic()
        time.sleep(seconds)
        c1, t1 = count(), time.monotonic()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return (c1 - c0) / (t1 - t0)


def sampler_only(landscape: Any, n: int, liar: bool, seed: int, budget: int, checkpoints: list[int]) -> list[float]:
    """The same question without processes or a server (many seeds in little time): the product's TPE in
    memory with n trials always running, each finishing in turn (equal evaluation times); a config already
    evaluated is told its value and not counted, as the loop does."""
    import optuna

    from kernsearch.studies import _samplers, _study
    from kernsearch.studies._replay import Replay

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _samplers.CONSTANT_LIAR = liar  # read by make_sampler
    objective = Replay(landscape=landscape, seed=seed).objective()
    knobs = objective.knobs
    study = optuna.create_study(sampler=_study.make_sampler("tpe", seed, knobs), direction="minimize")
    dists = _study.distributions(knobs)
    _, optimum = landscape.optimum()
    running: list[Any] = []
    known: dict[str, float | None] = {}
    order: list[float | None] = []
    asks = 0
    while len(order) < budget and asks < budget * 20:
        while len(running) < n:
            running.append(study.ask(dists))
            asks += 1
        trial = running.pop(0)
        config = {k: trial.params[k] for k in knobs}
        key = json.dumps(config, sort_keys=True)
        entry = landscape.entry(config)
        if entry is None:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        value = None if landscape.failed(entry) else float(entry["time"])
        if key in known:
            study.tell(trial, known[key]) if known[key] is not None else study.tell(
                trial, state=optuna.trial.TrialState.PRUNED)
            continue
        known[key] = value
        order.append(value)
        study.tell(trial, value) if value is not None else study.tell(trial, state=optuna.trial.TrialState.FAIL)
    curve = []
    for b in checkpoints:
        best = min((v for v in order[:b] if v is not None), default=float("inf"))
        curve.append(optimum / best if best < float("inf") else 0.0)
    return curve


# -- the report -------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--landscape", type=Path, default=LANDSCAPES / "gemm_clblast_RTX_3090.json.gz")
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--eval-s", type=float, default=0.25)
    ap.add_argument("--rate-s", type=float, default=20.0, help="seconds of each storage-rate run")
    ap.add_argument("--storage", help="an existing postgresql:// database (default: start one in a temp dir)")
    ap.add_argument("--sim-seeds", type=int, default=10, help="seeds of the in-memory sampler-only simulation")
    ap.add_argument("--only-sim", action="store_true", help="only the in-memory simulation (no server)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="one seed, budget 16, N = 1 and 2")
    args = ap.parse_args()
    if args.dry_run:
        args.seeds, args.budget, args.workers, args.rate_s = 1, 16, "1,2", 3.0
    ns = [int(x) for x in args.workers.split(",")]
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)
        if args.out:  # kept as it grows: a run cut short still leaves what it measured
            args.out.write_text("\n".join(lines) + "\n")

    # SIGTERM (a timeout) unwinds like Ctrl-C, so the PostgreSQL server started here is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from kernsearch.studies._landscape import Landscape

    landscape = Landscape.load(args.landscape)
    checkpoints = sorted({max(4, args.budget // 4), args.budget // 2, 3 * args.budget // 4, args.budget})
    if args.only_sim:
        simulate(args, ns, landscape, checkpoints, say)
        if args.out:
            args.out.write_text("\n".join(lines) + "\n")
        return
    with tempfile.TemporaryDirectory() as tmp:
        server = None
        if args.storage:
            url = args.storage
        else:
            from pgserver import PostgresServer

            server = PostgresServer(Path(tmp) / "pg").__enter__()
            url = server.url
        try:
            say(f"farm_scale: {args.landscape.name} ({len(list(landscape.configs()))} valid configs), one "
                f"PostgreSQL study per run, budget {args.budget} configs in total, {args.eval_s} s simulated "
                f"evaluation, {args.seeds} seeds, {os.cpu_count()} CPUs shared by workers and server")
            say("score = optimum / recorded time of the best config found after b evaluations (1.0 = optimum); "
                "median over seeds")
            say()
            say(f"{'N':>2} {'sampler':<16} " + " ".join(f"b={b:<5}" for b in checkpoints)
                + "  configs/min  duplicates")
            for n in ns:
                for liar in (False, True):
                    curves, rates, dups = [], [], 0
                    for seed in range(args.seeds):
                        study = f"scale-{n}-{int(liar)}-{seed}-{time.time_ns()}"
                        wall = run_workers(url, study, n, args.budget, args.eval_s, "tpe", liar, seed,
                                           args.landscape)
                        curve, evaluated, dup = best_curve(url, study, landscape, checkpoints)
                        curves.append(curve)
                        rates.append(evaluated / wall * 60)
                        dups += dup
                    med = [statistics.median(c[i] for c in curves) for i in range(len(checkpoints))]
                    say(f"{n:>2} {'TPE + liar' if liar else 'TPE':<16} " + " ".join(f"{m:<7.3f}" for m in med)
                        + f"  {statistics.median(rates):>11.1f}  {dups:>10}")
            say()
            say(f"ideal configs/min with N workers and no overhead: N x {60 / args.eval_s:.0f}")
            say()
            say(f"storage: trials/s of N processes running the loop with instant evaluations (random sampler, "
                f"{args.rate_s:.0f} s each)")
            for n in ns:
                say(f"  N={n}: {storage_rate(url, n, args.rate_s, args.landscape):.1f} trials/s")
            say()
            simulate(args, ns, landscape, checkpoints, say)
        finally:
            if server is not None:
                server.stop()
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


def simulate(args: Any, ns: list[int], landscape: Any, checkpoints: list[int], say: Any) -> None:
    say(f"sampler only (in memory, no processes): N trials always running, budget {args.budget}, "
        f"{args.sim_seeds} seeds; score as above, median [10th percentile] over seeds")
    say(f"{'N':>2} {'sampler':<16} " + " ".join(f"b={b:<13}" for b in checkpoints))
    for n in ns:
        for liar in (False, True):
            curves = [sampler_only(landscape, n, liar, seed, args.budget, checkpoints) for seed in range(args.sim_seeds)]
            cells = []
            for i in range(len(checkpoints)):
                col = sorted(c[i] for c in curves)
                cells.append(f"{statistics.median(col):.3f} [{col[len(col) // 10]:.3f}]")
            say(f"{n:>2} {'TPE + liar' if liar else 'TPE':<16} " + " ".join(f"{c:<15}" for c in cells))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        a = sys.argv[2:]
        worker(a[0], a[1], int(a[2]), float(a[3]), a[4], a[5] == "1", int(a[6]), a[7])
    else:
        main()

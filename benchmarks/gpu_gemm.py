"""GEMM on an NVIDIA GPU through MLX's CUDA back-end: the measured tune, against ``mx.matmul``.

One command on a GPU machine (MLX with its CUDA back-end, Optuna; run from the repository root)::

    python benchmarks/gpu_gemm.py tune --out OUTDIR [--trials 60] [--budget 200]

tunes GEMM float16 at 4096x4096x4096 and at a decode-like shape (M=16, N=K=4096) with the default
strategy (``run_study``, TPE, trial 0 = the family default), then measures the tuned kernel, the
family's default config and ``mx.matmul`` on the same inputs, interleaved, and prints the table
(time with spread, GFLOP/s, % of ``mx.matmul``). Every timed variant was first verified on the device
against the float64 reference. ``--publish`` also publishes the winners into ``artifacts/``.

``probe`` times a few hand-picked configs against ``mx.matmul`` (a quick look, no search).
The landscape sweep is ``benchmarks/gpu_landscape.py``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

def _search_timing():  # noqa: ANN202
    from kernsearch.evaluation._measure import TimingPlan

    return TimingPlan(warmup=2, min_batch_ms=10.0, min_samples=5, max_samples=15, target_spread=0.03,
                      max_seconds=1.0)


SEARCH_TIMING = _search_timing()
SHAPES = {"4096x4096x4096": (4096, 4096, 4096), "decode 16x4096x4096": (16, 4096, 4096)}
PROBE = ["", "BM=128,BN=128,BK=32,WM=2,WN=2,VEC=4,DOUBLE_BUFFER=true,PAD=4",
         "BM=128,BN=128,BK=32,WM=2,WN=4,VEC=4,DOUBLE_BUFFER=true,PAD=4",
         "BM=128,BN=64,BK=32,WM=2,WN=2,VEC=4,DOUBLE_BUFFER=true,PAD=4",
         "BM=64,BN=64,BK=32,WM=2,WN=2,VEC=4,DOUBLE_BUFFER=true,PAD=4",
         "BM=128,BN=128,BK=16,WM=2,WN=2,VEC=4,DOUBLE_BUFFER=true,PAD=4",
         "BM=128,BN=128,BK=32,WM=2,WN=2,VEC=4,DOUBLE_BUFFER=true,PAD=4,LAYOUT_B=t"]


def device_chip():  # noqa: ANN201
    """The chip MLX reports, as a registry entry carrying what was detected."""
    import mlx.core as mx

    from kernsearch import detect_chip, get_chip

    info = dict(mx.device_info())
    chip = detect_chip()
    if not chip.known:  # e.g. an architecture string the registry does not spell the same way
        name = "H200" if "H200" in str(info.get("device_name", "")) else "H100"
        chip = get_chip(name).model_copy(update={"detected": info})
    return chip, info


def stats(samples: list[float]) -> dict:
    p10, p50, p90 = np.percentile(samples, [10, 50, 90])
    return {"median_ms": float(p50), "p10_ms": float(p10), "p90_ms": float(p90),
            "spread": float((p90 - p10) / p50), "n": len(samples)}


def interleaved_table(fam, chip, shape, configs: dict[str, dict], rounds: int = 25) -> dict:  # noqa: ANN001
    """Verify each config on fresh inputs, then time configs and mx.matmul round-robin on shared inputs."""
    from kernsearch import Space, geometry, get_backend, make_problem, render
    from kernsearch.evaluation._measure import TimingPlan, interleaved
    from kernsearch.evaluation._verify import kernel_inputs, make_inputs, verify_kernel

    cuda = get_backend("cuda")
    problem = make_problem(fam, shape, "float16", chip)
    space = Space(problem, chip)
    logical = make_inputs(problem, 7)
    sets = cuda.input_sets(list(logical.values()), "float16")
    candidates, checks = {}, {}
    for label, cfg in configs.items():
        kernel, geo = render(fam, cfg, "float16", "cuda"), geometry(space, cfg)
        check, _ = verify_kernel(cuda, kernel, geo, problem, seed=11)
        checks[label] = {"ok": check.ok, "max_abs_err": check.max_abs_err, "detail": check.detail}
        if not check.ok:
            print(f"  {label}: FAILED verification ({check.summary()}); not timed", flush=True)
            continue
        candidates[label] = cuda.launcher(kernel, geo, kernel_inputs(problem, logical, geo), "float16", sets=sets)
    candidates["mx.matmul"] = cuda.baseline_launcher(fam, problem, logical, sets=sets)
    samples = interleaved(candidates, rounds=rounds, plan=TimingPlan(min_batch_ms=25.0))
    flops = problem.flops()
    base = float(np.median(samples["mx.matmul"]))
    rows = {}
    for label, s in samples.items():
        st = stats(s)
        st["gflops"] = flops / (st["median_ms"] * 1e-3) / 1e9
        st["pct_of_matmul"] = 100.0 * base / st["median_ms"]
        st["samples_ms"] = s
        st["config"] = configs.get(label)
        st["verified"] = checks.get(label)
        rows[label] = st
    return {"shape": list(shape), "input_sets": sets, "rows": rows}


def print_table(title: str, table: dict) -> None:
    print(f"\n{title}  (input sets rotated: {table['input_sets']})")
    print(f"  {'variant':<12} {'median ms':>10} {'p10-p90 ms':>19} {'GFLOP/s':>10} {'% of mx.matmul':>15}")
    for label, r in table["rows"].items():
        print(f"  {label:<12} {r['median_ms']:>10.4f} {r['p10_ms']:>9.4f}-{r['p90_ms']:<9.4f} "
              f"{r['gflops']:>10.0f} {r['pct_of_matmul']:>14.1f}%")


def cmd_probe(args: argparse.Namespace) -> None:
    from kernsearch import Space, load_family, make_problem

    fam = load_family("gemm")
    chip, info = device_chip()
    print("device:", info, "-> chip", chip.name, flush=True)
    out = {}
    for title, shape in SHAPES.items():
        space = Space(make_problem(fam, shape, "float16", chip), chip)
        configs = {f"p{i}" if text else "default": space.validate(space.parse_config(text))
                   for i, text in enumerate(PROBE)}
        out[title] = interleaved_table(fam, chip, shape, configs, rounds=8)
        print_table(title, out[title])
        for label in configs:
            print(f"    {label}: {PROBE[int(label[1:])] if label != 'default' else 'default'}")
    _write(args.out, "probe.json", out)


def cmd_tune(args: argparse.Namespace) -> None:
    import mlx.core as mx

    from kernsearch import Space, load_family, make_problem, run_study
    from kernsearch.family._space import format_config
    from kernsearch.studies._objective import KernelObjective

    fam = load_family("gemm")
    chip, info = device_chip()
    header = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "device": info,
              "chip": chip.name, "mlx": mx.__version__, "python": platform.python_version(),
              "strategy": "run_study default (Optuna TPE, trial 0 = family default)", "dtype": "float16"}
    print(json.dumps(header), flush=True)
    report: dict = {"header": header, "shapes": {}}
    for title, shape in SHAPES.items():
        problem = make_problem(fam, shape, "float16", chip)
        space = Space(problem, chip)
        started = time.monotonic()
        storage = f"sqlite:///{Path(args.out) / 'studies.db'}" if args.out else None
        # Search-time timing is shorter than the final round's (which re-measures the finalists
        # interleaved with mx.matmul): more trials fit the lease; the table below is re-measured anyway.
        objective = KernelObjective(problem, chip, "cuda", seed=0, backend_options={"plan": SEARCH_TIMING})
        result = run_study(objective, trials=args.trials, time_budget=args.budget, seed=0, storage=storage,
                           finalists=3)
        elapsed = time.monotonic() - started
        trials = _trials(result)
        best = result.best
        winner_cfg = best.config if best else dict(fam.default)
        final = result.final
        if final is not None and final.winner is not None:
            winner_cfg = next((t["config"] for t in trials if t["number"] == final.winner), winner_cfg)
        reach = _trials_to_best(trials, winner_cfg)
        configs = {"tuned": winner_cfg, "default": space.validate(dict(fam.default))}
        table = interleaved_table(fam, chip, shape, configs)
        print_table(f"{title}: tuned ({format_config(winner_cfg)}) vs default vs mx.matmul", table)
        tuned, default = table["rows"].get("tuned"), table["rows"].get("default")
        summary = {
            "evaluated": result.evaluated, "failures": dict(result.failures), "invalid_proposals": result.invalid,
            "stop_reason": result.stop_reason, "search_seconds": elapsed, "trials_to_best": reach,
            "default_over_tuned": (default["median_ms"] / tuned["median_ms"]) if tuned and default else None,
            "final_round": final.to_dict() if final is not None else {},
        }
        print(f"  search: {result.evaluated} configs evaluated in {elapsed:.0f} s ({dict(result.failures)} failed), "
              f"best found at evaluated trial {reach}; default/tuned = {summary['default_over_tuned']:.2f}x",
              flush=True)
        report["shapes"][title] = {"table": table, "summary": summary, "trials": trials}
        if args.publish and tuned:
            report["shapes"][title]["published"] = _publish(fam, chip, space, winner_cfg, table, result)
        _write(args.out, "tune.json", report)


def _trials(result) -> list[dict]:  # noqa: ANN001
    import optuna

    study = optuna.load_study(study_name=result.study_name, storage=result.storage)
    out = []
    for t in study.trials:
        a = t.user_attrs
        if a.get("status") in ("ok", "failed"):
            record, failure = a.get("record") or {}, a.get("failure") or {}
            out.append({"number": t.number, "status": a.get("status"), "config": a.get("config"),
                        "time_ms": t.value if a.get("status") == "ok" else None, "reason": failure.get("reason"),
                        "detail": failure.get("detail", "")[:300], "compile_seconds": record.get("compile_seconds"),
                        "source": a.get("source")})
    return out


def _trials_to_best(trials: list[dict], best: dict) -> int | None:
    """How many evaluated trials it took until ``best`` was evaluated (1-based)."""
    for i, t in enumerate(trials, 1):
        if t["config"] == best:
            return i
    return None


def _publish(fam, chip, space, config, table, result) -> dict:  # noqa: ANN001
    from kernsearch import ArtifactStore, Candidate, geometry, get_backend, render
    from kernsearch.artifacts._manifest import Correctness, Measurements
    from kernsearch.backends import Evidence
    from kernsearch.evaluation._verify import verify_kernel

    cuda = get_backend("cuda")
    kernel, geo = render(fam, config, space.problem.dtype, "cuda"), geometry(space, config)
    checks = []
    for seed in (21, 22):
        check, _ = verify_kernel(cuda, kernel, geo, space.problem, seed=seed)
        checks.append((space.problem.shape_text, check))
    row, base = table["rows"]["tuned"], table["rows"]["mx.matmul"]
    measurements = Measurements(median_ms=row["median_ms"], spread=row["spread"], samples_ms=row["samples_ms"],
                                baseline_median_ms=base["median_ms"])
    candidate = Candidate.for_config(space, config, target="cuda", evidence=Evidence.MEASURED,
                                     measurements=measurements,
                                     correctness=Correctness.from_checks("device", checks),
                                     study=result.study_name)
    outcome = ArtifactStore(Path("artifacts")).publish(candidate)
    print(f"  publish: {outcome}", flush=True)
    return {"published": outcome.published, "version": outcome.version, "reason": outcome.reason,
            "key": str(outcome.key)}


def _write(out: str | None, name: str, data: dict) -> None:
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text(json.dumps(data, indent=1, default=str))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--out")
    t = sub.add_parser("tune")
    t.add_argument("--out")
    t.add_argument("--trials", type=int, default=60)
    t.add_argument("--budget", default="200", help="seconds of search per shape")
    t.add_argument("--publish", action="store_true")
    args = parser.parse_args()
    {"probe": cmd_probe, "tune": cmd_tune}[args.cmd](args)


if __name__ == "__main__":
    main()

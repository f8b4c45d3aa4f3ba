"""How well does the performance model rank variants? Spearman correlation of modeled vs measured times.

    .venv/bin/python benchmarks/model_vs_measured.py [LANDSCAPE ...] [--chip H100] [--shape M,N,K] [--dtype float16]

A landscape is a KernelTuner cache file of GEMM configs measured on a GPU (default: every
``benchmarks/data/*gemm*.json[.gz]``). For each successful config (median of its repetitions), the model
(``--chip``, default: the landscape's chip, else H100) predicts a time; the script prints the rank
correlation and what picking the model's favourite would have cost. Measured figures are measured; the
model's are modeled. No model constant is fitted to a landscape (docs/model.md says what changed after
the H100 one was seen). Output of the last run: ``benchmarks/model_vs_measured.txt``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing their average rank (as Spearman's rho needs)."""
    order = np.argsort(values, kind="mergesort")
    sorted_vals = values[order]
    r = np.empty(len(values))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        r[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(np.asarray(a, float)), ranks(np.asarray(b, float))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def shape_of(problem_size: object, fallback: str | None) -> str | None:
    if fallback:
        return fallback
    if isinstance(problem_size, (list, tuple)) and len(problem_size) == 3:
        return ",".join(str(int(s)) for s in problem_size)
    if isinstance(problem_size, str) and problem_size.replace("x", ",").count(",") == 2:
        return problem_size
    return None


def compare(path: Path, chip_name: str | None, shape: str | None, dtype: str | None) -> dict[str, object]:
    from kernsearch import KernsearchError, Space, get_chip, load_family, make_problem
    from kernsearch.backends._model import ModelBackend
    from kernsearch.studies._landscape import Landscape

    land = Landscape.load(path)
    family = load_family("gemm")
    chip = get_chip(chip_name or str(land.meta.get("chip") or "H100"))
    dtype = dtype or str(land.meta.get("dtype") or "") or None
    problem = make_problem(family, shape_of(land.problem_size, shape), dtype, chip)
    space = Space(problem, chip)
    model = ModelBackend()
    measured, modeled, configs = [], [], []
    skipped = failed = 0
    for entry in land.entries.values():
        if land.failed(entry):
            failed += 1
            continue
        try:
            config = space.parse_config({k: entry[k] for k in family.knobs if k in entry})
            predicted = model.predict_ms(space, config)
        except KernsearchError:
            skipped += 1  # not a config of this family/chip (or invalid for the model's chip)
            continue
        measured.append(float(np.median(entry.get("times") or [entry["time"]])))
        modeled.append(predicted)
        configs.append(config)
    if len(measured) < 3:
        raise SystemExit(f"{path}: only {len(measured)} comparable configs")
    m, p = np.asarray(measured), np.asarray(modeled)
    best_measured = float(m.min())
    pick = int(p.argmin())
    top = max(1, len(m) // 10)
    overlap = len(set(np.argsort(m)[:top]) & set(np.argsort(p)[:top])) / top
    return {"file": path.name, "device": land.device_name, "problem": f"{problem.shape_text} {problem.dtype}",
            "chip": chip.name, "configs": len(m), "failed": failed, "skipped": skipped,
            "spearman": spearman(measured, modeled),
            "log_pearson": float(np.corrcoef(np.log(m), np.log(p))[0, 1]),
            "pick_vs_best": float(m[pick] / best_measured),
            "pick_measured_rank": int(ranks(m)[pick]),
            "top10pct_overlap": overlap,
            "best_measured_ms": best_measured, "best_modeled_ms": float(p.min()),
            "modeled_over_measured": [float(np.percentile(p / m, q)) for q in (10, 50, 90)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("landscapes", nargs="*", type=Path)
    parser.add_argument("--chip", default=None, help="default: the landscape's chip, else H100")
    parser.add_argument("--shape", default=None, help="M,N,K (default: the landscape's problem_size)")
    parser.add_argument("--dtype", default=None, help="default: the landscape's, else the family's")
    args = parser.parse_args(argv)
    files = args.landscapes or sorted((REPO / "benchmarks" / "data").glob("*gemm*.json*"))
    if not files:
        print("no GEMM landscape given or found in benchmarks/data/", file=sys.stderr)
        return 1
    from kernsearch import KernsearchError

    for path in files:
        try:
            r = compare(path, args.chip, args.shape, args.dtype)
        except KernsearchError as exc:
            print(f"{path.name}: skipped ({exc})")
            continue
        print(f"{r['file']} ({r['device']}, {r['problem']}): {r['configs']} configs measured "
              f"({r['failed']} failed, {r['skipped']} not comparable); model for {r['chip']} (modeled)")
        print(f"  Spearman rank correlation, modeled vs measured: {r['spearman']:.3f}")
        print(f"  Pearson correlation of log times:                {r['log_pearson']:.3f}")
        print(f"  model's favourite, measured: {r['pick_vs_best']:.2f}x the measured best "
              f"(measured rank {r['pick_measured_rank']} of {r['configs']})")
        print(f"  overlap of the top 10 %: {r['top10pct_overlap']:.0%}")
        print(f"  best measured {r['best_measured_ms']:.4f} ms; best modeled {r['best_modeled_ms']:.4f} ms")
        lo, mid, hi = r["modeled_over_measured"]  # type: ignore[misc]
        print(f"  modeled / measured time per config: median {mid:.2f} (p10 {lo:.2f}, p90 {hi:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What structure a recorded landscape has (issue 41, fourth round): where the optimum lies, how many configs are
near it, how smooth the landscape is along each knob, and how many local optima one-knob steps leave.

    .venv/bin/python benchmarks/landscape_structure.py FILE_OR_FOLDER... [--budget-pct 1]

Per file (KernelTuner cache format, ``search/studies/_landscape.py``; a config's time is the median of its recorded
repetitions, as ``benchmarks/search_landscapes.py`` scores it; score = optimum / time):

* configs, failed, the 1 % budget; the optimum's knob values;
* how many configs score >= 0.97 (within 3 %: a "hit"), 0.9, 0.8, and the chance that as many random valid configs
  as the budget hold a hit (``p_random``: what 20 seeds of random search would show as their hit rate);
* the best score at Hamming distance >= 2 from every hit (``second mode``): what a search that misses the needle's
  neighbourhood ends with;
* per knob (values with more than one value): ``eta2``, the share of the variance of log time its main effect
  explains, and ``rough``, the median |change of log time| over one-step moves of that knob alone (ordinal knobs:
  to an adjacent value; others: to any value) divided by the standard deviation of log time (0: the knob alone
  changes nothing; about 1.1: as if the two configs were drawn at random); ``opt@`` the optimum's value and its
  position in the knob's list (edge or inside);
* ``additive R2`` and ``pairs R2``: the share of the variance of log time a least-squares fit explains with each knob's
  value as a term (main effects), and with every pair of knobs' values too (all two-knob interactions), fitted to
  every working config; ``rank`` is where the optimum ranks among the configs by the pairwise fit (0: first): a model
  of two-knob interactions that had seen every config would still not put it first where this is large;
* under one-step moves (each knob to an adjacent value, two-valued and categorical knobs to any value): the number of
  local optima (no neighbour faster), how many score >= 0.97, and the share of configs whose steepest descent ends at
  a hit (``basin``: a hill climber started at a random config reaches a hit with about that chance, at a cost of
  about ``steps`` x neighbours evaluations).

Failed configs count as infinitely slow. NumPy only; a few seconds per file.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HIT = 1 / 1.03


def _arrays(path: Path) -> tuple[str, dict[str, list[object]], np.ndarray, np.ndarray]:
    """(name, varying knobs, codes: configs x knobs value positions, median time: inf when failed)."""
    from kernsearch.studies._landscape import Landscape

    land = Landscape.load(path)
    knobs = {k: list(v) for k, v in land.knobs.items() if len(v) > 1}
    pos = {k: {repr(v): i for i, v in enumerate(values)} for k, values in knobs.items()}
    codes, times = [], []
    for entry in land.entries.values():
        codes.append([pos[k][repr(entry[k])] for k in knobs])
        ok = not land.failed(entry)
        times.append(float(np.median(entry.get("times") or [entry["time"]])) if ok else math.inf)
    return path.name.split(".json")[0], knobs, np.array(codes, dtype=np.int64), np.array(times)


def _ordinal(values: list[object]) -> bool:
    return len(values) > 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def neighbours(knobs: dict[str, list[object]], codes: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Every one-step move as (knob, from rows, to rows), both directions, valid configs only."""
    radix = np.array([len(v) for v in knobs.values()], dtype=np.int64)
    weight = np.concatenate([np.cumprod(radix[::-1])[::-1][1:], [1]])
    ids = codes @ weight
    order = np.argsort(ids)
    sorted_ids = ids[order]
    out = []
    for j, values in enumerate(knobs.values()):
        steps = [-1, 1] if _ordinal(values) else [d for d in range(-len(values) + 1, len(values)) if d]
        for d in steps:
            moved = codes[:, j] + d
            inside = (moved >= 0) & (moved < len(values))
            target = ids + d * weight[j]
            at = np.clip(np.searchsorted(sorted_ids, target), 0, len(ids) - 1)
            hit = inside & (sorted_ids[at] == target)
            out.append((j, np.flatnonzero(hit), order[at[hit]]))
    return out


def p_random_hit(n: int, hits: int, budget: int) -> float:
    """The chance that ``budget`` distinct random configs of ``n`` include at least one of ``hits``."""
    if hits == 0:
        return 0.0
    return 1.0 - math.exp(math.lgamma(n - hits + 1) + math.lgamma(n - budget + 1)
                          - math.lgamma(n - hits - budget + 1) - math.lgamma(n + 1)) if n - hits >= budget else 1.0


def describe(path: Path, pct: float) -> None:
    name, knobs, codes, t = _arrays(path)
    ok = np.isfinite(t)
    score = np.where(ok, t[ok].min() / np.where(ok, t, 1.0), 0.0)
    y = np.log(np.where(ok, t, 1.0))
    n, budget = len(t), max(5, math.ceil(len(t) * pct / 100))
    hits = score >= HIT
    opt = int(np.argmax(score))
    moves = neighbours(knobs, codes)
    far = np.ones(n, dtype=bool)  # Hamming distance >= 2 from every hit
    hit_codes = codes[hits]
    for h in hit_codes:
        far &= (codes != h).sum(axis=1) >= 2
    print(f"\n== {name}: {n} configs ({int((~ok).sum())} failed), {pct:g} % budget {budget} trials")
    print("  optimum: " + ", ".join(f"{k}={v[codes[opt, j]]}" for j, (k, v) in enumerate(knobs.items())))
    print(f"  score >= 0.97: {int(hits.sum())}, >= 0.9: {int((score >= 0.9).sum())}, >= 0.8: "
          f"{int((score >= 0.8).sum())}; p_random {p_random_hit(n, int(hits.sum()), budget):.0%}; second mode "
          f"{score[far].max() if far.any() else 0:.3f}; median score {np.median(score):.3f}")
    sd = float(y[ok].std()) or 1.0
    for j, (k, values) in enumerate(knobs.items()):
        groups = [y[ok & (codes[:, j] == i)] for i in range(len(values))]
        mean = float(y[ok].mean())
        eta2 = sum(len(g) * (g.mean() - mean) ** 2 for g in groups if len(g)) / (len(y[ok]) * sd * sd)
        deltas = [np.abs(y[b] - y[a])[ok[a] & ok[b]] for jj, a, b in moves if jj == j]
        rough = float(np.median(np.concatenate(deltas))) / sd if deltas and len(np.concatenate(deltas)) else 0.0
        i = int(codes[opt, j])
        where = "edge" if i in (0, len(values) - 1) else "inside"
        print(f"    {k:<16} {len(values):>3} values  eta2 {eta2:.2f}  rough {rough:.2f}  opt@ {values[i]} "
              f"({i + 1}/{len(values)}, {where})")
    _interactions(knobs, codes[ok], y[ok], int(np.flatnonzero(ok).tolist().index(opt)))
    _descents(score, moves, hits, n)


def _design(knobs: dict[str, list[object]], codes: np.ndarray, pairs: bool) -> np.ndarray:
    """One-hot columns of every knob's values (the first value dropped), and of every pair's when ``pairs``."""
    sizes = [len(v) for v in knobs.values()]
    main = [(codes[:, j][:, None] == np.arange(1, m)[None, :]).astype(float) for j, m in enumerate(sizes)]
    cols = [np.ones((len(codes), 1)), *main]
    if pairs:
        for a in range(len(main)):
            for b in range(a + 1, len(main)):
                cols.append((main[a][:, :, None] * main[b][:, None, :]).reshape(len(codes), -1))
    return np.concatenate(cols, axis=1)


def _interactions(knobs: dict[str, list[object]], codes: np.ndarray, y: np.ndarray, opt: int) -> None:
    """How much of log time main effects and two-knob interactions explain, and where the pairwise fit ranks the
    optimum."""
    out = []
    for pairs in (False, True):
        A = _design(knobs, codes, pairs)
        coef, *_ = np.linalg.lstsq(A, y, rcond=None)
        pred = A @ coef
        out.append(1 - float(((y - pred) ** 2).mean()) / float(y.var()))
    rank = int((pred < pred[opt]).sum())
    print(f"  additive R2 {out[0]:.2f}, pairs R2 {out[1]:.2f}; rank of the optimum by the pairwise fit {rank}")


def _descents(score: np.ndarray, moves: list[tuple[int, np.ndarray, np.ndarray]], hits: np.ndarray, n: int) -> None:
    """Local optima under one-step moves and the share of configs whose steepest ascent of score ends at a hit."""
    best_next = np.arange(n)
    best_val = score.copy()
    degree = np.zeros(n, dtype=np.int64)
    for _, a, b in moves:
        degree[a] += 1
        better = score[b] > best_val[a]
        best_next[a[better]] = b[better]
        best_val[a[better]] = score[b[better]]
    local = best_next == np.arange(n)
    end = best_next.copy()
    steps = np.zeros(n, dtype=np.int64)
    for _ in range(n):
        nxt = best_next[end]
        moving = nxt != end
        if not moving.any():
            break
        steps += moving
        end = nxt
    print(f"  one-step moves: {degree.mean():.1f} neighbours a config; {int(local.sum())} local optima "
          f"({int((local & hits).sum())} hits); basin of the hits {hits[end].mean():.1%}; mean steps of a descent "
          f"{steps.mean():.1f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", type=Path, nargs="+")
    ap.add_argument("--budget-pct", type=float, default=1.0)
    args = ap.parse_args(argv)
    for target in args.targets:
        files = sorted(p for p in target.iterdir() if p.name.endswith((".json", ".json.gz"))) if target.is_dir() \
            else [target]
        for f in files:
            describe(f, args.budget_pct)


if __name__ == "__main__":
    main()

"""How good is the search? Replay recorded landscapes (KernelTuner cache files) and compare strategies.

    .venv/bin/python benchmarks/search_landscapes.py --tuning ../shared/landscapes \\
        --held-out benchmarks/data [--strategies default,plain-tpe,random] [--budgets 1,5] [--seeds 20] \\
        [--jobs 2] [--results results.json] [--transfer]

Every ``*.json`` / ``*.json.gz`` KernelTuner cache file in the given folders (or the files themselves) is
replayed: each strategy searches with a budget of 1 % and 5 % of the file's configs, **at least 5 trials**
(``MIN_TRIALS``), for ``--seeds`` seeds (``run_study`` on a replayed landscape: noisy timings drawn from the
recorded repetitions, racing on as in a real search). Scores are ``optimum / recorded`` (1.0 = the optimum) of
the config the search *picked* after its final round (what it would ship), both taken as the **median of the
recorded repetitions** (what the search and its final round rank by: several H100 files hold first-launch
outliers that inflate the mean KernelTuner records as ``time``; the summary also gives the score by that mean);
``hit`` is the share of seeds whose pick is within 3 % of the optimum (score >= 1/1.03).

Strategies: ``default`` (what ``kernsearch tune`` uses: ``run_study``'s default sampler), ``plain-tpe``
(Optuna's TPE alone: no local steps), ``tpe`` (kernsearch's TPE, with one-knob local steps), ``random``, ``auto``,
``forest`` (the tree-ensemble surrogate over the valid configs, ``studies/_forest.py``), ``hybrid`` (Optuna's TPE for
the first ``_forest.HYBRID_SWITCH`` trials, then the forest), ``thompson`` (the forest with Thompson sampling in place of
expected improvement: fourth round).

Printed per file and budget: median, p10 and hit rate per strategy; then per budget and strategy the mean over
files of the per-file medians and of the p10s, the smallest p10, and the files where fewer than 90 % of seeds
hit. Files tuned on (``--tuning``) and held-out files (``--held-out``) are reported in separate sections.

``--transfer``: for each file, the other files of the same kernsearch family (another shape or chip) are the
source of a warm start: their best configs (``TRANSFER_LIMIT``), mapped into this space, are evaluated first
(``Objective.warm_start``), then the default strategy goes on; reported against the default without it, and
both again without the performance model's prior (``default-noprior``: the case of a family the model does
not know, where transfer is all a new study has).

**The split** (issue 41; fixed before any strategy was tuned for that issue, see docs/search.md): ``TUNED_ON``
files may be looked at while choosing a strategy, ``HELD_OUT`` files may not; ``--held-out`` refuses a file named
in ``TUNED_ON``. The held-out files are public KernelTuner benchmark-hub landscapes (AutoTuningAssociation/
benchmark_hub, MIT licence, commit 8eeb99e), not kept in this repository; put them in a folder under these names:

    git clone https://github.com/AutoTuningAssociation/benchmark_hub hub && mkdir -p held_out && \
    for k in convolution dedispersion; do for g in A4000 MI250X W7800; do \
      cp hub/cachefiles/${k}_milo/$g.json.gz held_out/${k}_$g.json.gz; done; done

``--transfer-from FOLDERS`` (fourth round): each strategy also warm-started (``strategy+transfer``) from the tuned-on
files (``TUNED_ON``) among FOLDERS of the same kernel (``kernel_name`` and knobs) on other GPUs, as a real tune is from
its family's studies on other chips (``studies/_transfer.py``: the sources' best configs, ``TRANSFER_LIMIT`` of them,
evaluated first); the sources are not scored themselves, and a held-out file never informs another. Not the issue's
figure (a landscape "never seen" has no sources).

``HELD_OUT_2`` (third round) is a second held-out group of other kernels: the hub's older KernelTuner landscapes
(``currently_unused/cachefiles/KernelTuner data/{convolution,gemm,pnpoly}/{RTX_2080_Ti,RTX_Titan}.json.gz`` copied as
``convolution_kt_GPU``, ``gemm_clblast_GPU``, ``pnpoly_GPU``); their RTX_3060_laptop files (and the convolution
kernel's RTX_3090 file) are tuned on.

Files whose 1 % budget is fewer than ``SMALL_BUDGET`` trials (kernsearch's own H100 files in benchmarks/data:
8-664 configs) get their own mean line ("small"): 5 trials out of 8 say little about a strategy.

``--overhead FILE``: the framework's overhead per trial (sampler, storage, loop; the replayed evaluation is
excluded) of each strategy, in memory, on FILE (the 15-knob gemm_clblast_RTX_3090 landscape for issue 41's bound).

``--results FILE`` keeps every run's score (JSON, one entry per file/strategy/budget/seed); a second invocation
with the same file skips the runs it already holds, so a long table can be built in several sittings.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MIN_TRIALS = 5
#: A file whose 1 % budget is fewer trials than this is summarised apart (too few trials to say much).
SMALL_BUDGET = 20
#: The split of issue 41, written down before tuning: files a strategy may be tuned on, and files held out.
TUNED_ON = ("convolution_A100", "dedispersion_A100", "gemm_clblast_RTX_3090", "pnpoly_RTX_3090",  # ../shared
            "convolution_A6000", "convolution_W6600", "dedispersion_A6000", "dedispersion_W6600",  # benchmark hub
            "gemm_H100_float16_16x4096x4096", "gemm_H100_float16_2048x2048x2048", "gemv_H100_float16_4x4096x4096",
            "layernorm_H100_float16_4096x4096", "qmatvec_H100_float16_4x4096x4096x512x64",
            "rmsnorm_H100_float16_4096x4096", "softmax_H100_float16_4096x4096",
            "swiglu_H100_float16_4096x11008",  # benchmarks/data (kernsearch's own, small)
            # third round: the hub's older KernelTuner landscapes (currently_unused/), the RTX 3060 laptop GPU's and
            # the older convolution kernel's RTX 3090 file tuned on (the rule: the 3060 laptop of every kernel, and
            # the RTX 3090 where ../shared has not got that kernel's file already)
            "convolution_kt_RTX_3060_laptop", "convolution_kt_RTX_3090", "gemm_clblast_RTX_3060_laptop",
            "pnpoly_RTX_3060_laptop")
HELD_OUT = ("convolution_A4000", "convolution_MI250X", "convolution_W7800",
            "dedispersion_A4000", "dedispersion_MI250X", "dedispersion_W7800")  # benchmark hub, commit 8eeb99e
#: The third round's second held-out group (other kernels than HELD_OUT's: the RTX 2080 Ti's and TITAN RTX's files of
#: the hub's currently_unused/cachefiles/KernelTuner data/{convolution,gemm,pnpoly}), fixed before any result.
HELD_OUT_2 = ("convolution_kt_RTX_2080_Ti", "convolution_kt_RTX_Titan", "gemm_clblast_RTX_2080_Ti",
              "gemm_clblast_RTX_Titan", "pnpoly_RTX_2080_Ti", "pnpoly_RTX_Titan")
TRANSFER_ARMS = ("default", "default+transfer", "default-noprior", "default-noprior+transfer")
HIT = 1 / 1.03  # a pick within 3 % of the optimum


@dataclass(frozen=True)
class Job:
    path: str
    strategy: str
    pct: float
    seed: int
    transfer: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{Path(self.path).name}|{self.strategy}|{self.pct:g}|{self.seed}"


def budget_for(size: int, pct: float) -> int:
    """Trials for a budget of ``pct`` % of a space of ``size`` configs: at least MIN_TRIALS, at most the space."""
    return min(size, max(MIN_TRIALS, math.ceil(size * pct / 100)))


def _median_times(land: Any) -> dict[str, float]:
    """Per config key, the median of its recorded repetitions (working configs only)."""
    out = {}
    for key, entry in land.entries.items():
        if not land.failed(entry):
            out[key] = float(np.median(entry.get("times") or [entry["time"]]))
    return out


_LOADED: dict[str, Any] = {}


def _landscape(path: str) -> Any:
    """A landscape read once per process (the largest takes seconds to read: every run would pay it)."""
    from kernsearch.studies._landscape import Landscape

    if path not in _LOADED:
        _LOADED.clear()
        _LOADED[path] = Landscape.load(path)
    return _LOADED[path]


def one_run(job: Job) -> tuple[str, float, float]:
    """(key, picked score, picked score by the recorded mean) of one seeded search."""
    from kernsearch import run_study
    from kernsearch.studies import _study
    from kernsearch.studies._replay import Replay
    from kernsearch.studies._transfer import nearest_valid, ranked_landscape, transfer_configs

    backend = Replay(seed=job.seed, landscape=_landscape(job.path))
    land = backend.landscape
    _, optimum = land.optimum()
    objective = backend.objective()
    if job.transfer:
        from kernsearch.studies._landscape import Landscape

        sources = [ranked_landscape(Landscape.load(p)) for p in job.transfer]
        warm = transfer_configs(sources, nearest_valid(land.knobs, objective.valid_configs()))
        objective.warm_start = lambda: warm  # type: ignore[method-assign]
    strategy = job.strategy.removesuffix("+transfer")
    if strategy.endswith("-noprior"):  # a family the performance model does not know
        strategy = strategy.removesuffix("-noprior")
        objective.prior = lambda configs: None  # type: ignore[method-assign]
    local = _study.LOCAL_EVERY
    if strategy == "plain-tpe":
        _study.LOCAL_EVERY = 0
    try:
        result = run_study(objective, trials=budget_for(len(land), job.pct),
                           sampler="tpe" if strategy == "plain-tpe" else strategy, seed=job.seed, storage=":memory:",
                           study_name=f"bench-{job.strategy}-{job.seed}")
    finally:
        _study.LOCAL_EVERY = local
    medians = _median_times(land)
    if result.best is None:
        return job.key, 0.0, 0.0
    key = land.key(result.best.config)
    return job.key, min(medians.values()) / medians[key], optimum / float(land.entries[key]["time"])


def overhead(path: Path, strategies: list[str], trials: int) -> None:
    """Framework overhead per trial (``StudyResult.overhead_s_per_trial``: sampler, storage, loop; the replayed
    evaluation excluded), in memory, seed 0, for each strategy on ``path``."""
    from kernsearch import run_study
    from kernsearch.studies import _study
    from kernsearch.studies._replay import Replay

    land = _landscape(str(path))
    print(f"framework overhead per trial, in memory, {path.name}: {len(land.knobs)} knobs, {len(land)} configs, "
          f"{trials} trials, seed 0")
    for strategy in strategies:
        local = _study.LOCAL_EVERY
        if strategy == "plain-tpe":
            _study.LOCAL_EVERY = 0
        cpu = time.process_time()
        try:
            result = run_study(Replay(seed=0, landscape=land).objective(), trials=trials,
                               sampler="tpe" if strategy == "plain-tpe" else strategy, seed=0, storage=":memory:",
                               study_name=f"overhead-{strategy}")
        finally:
            _study.LOCAL_EVERY = local
        cpu = time.process_time() - cpu
        print(f"  {strategy:<10} {1000 * result.overhead_s_per_trial:7.1f} ms/trial  (run {result.elapsed_s:.1f} s, "
              f"{result.evaluated} configs evaluated; this process's CPU time {1000 * cpu / trials:.1f} ms/trial, "
              "replayed evaluation and set-up included)", flush=True)


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
    from kernsearch.studies._landscape import Landscape

    try:
        land = Landscape.load(path)
        return any(not land.failed(e) for e in land.entries.values())
    except Exception:  # noqa: BLE001 - not a KernelTuner cache file (another benchmark's output): skipped
        return False


def family_of(path: Path) -> str | None:
    """The kernsearch family a landscape was recorded of (``kernel_name`` "kernsearch FAMILY ..."), else None."""
    from kernsearch.studies._landscape import Landscape

    name = Landscape.load(path).kernel_name
    return name.split()[1] if name.startswith("kernsearch ") and len(name.split()) > 1 else None


def sources_for(path: Path, pool: list[Path]) -> tuple[str, ...]:
    """Other recorded landscapes of the same family (another shape or chip): transfer's sources."""
    fam = family_of(path)
    return tuple(str(p) for p in pool if p != path and fam is not None and family_of(p) == fam)


_KERNELS: dict[Path, tuple[str, tuple[str, ...]]] = {}


def kernel_of(path: Path) -> tuple[str, tuple[str, ...]]:
    """A landscape's kernel: its ``kernel_name`` and knob names (the hub's two convolution kernels share a name)."""
    from kernsearch.studies._landscape import Landscape

    if path not in _KERNELS:
        land = Landscape.load(path)
        _KERNELS[path] = (land.kernel_name, tuple(sorted(land.knobs)))
    return _KERNELS[path]


def tuned_sources(path: Path, tuning: list[Path]) -> tuple[str, ...]:
    """``--transfer-from``: the tuned-on files of the same kernel on other GPUs, transfer's sources for ``path`` (a
    held-out file never informs another)."""
    return tuple(str(p) for p in tuning if p != path and p.name.split(".json")[0] in TUNED_ON
                 and kernel_of(p) == kernel_of(path))


def run_all(jobs: list[Job], results: dict[str, list[float]], workers: int, save: Any) -> None:
    todo = [j for j in jobs if j.key not in results]
    if not todo:
        return
    if workers <= 1:
        for j in todo:
            key, picked, by_mean = one_run(j)
            results[key] = [picked, by_mean]
            save()
        return
    with ProcessPoolExecutor(workers) as pool:
        for key, picked, by_mean in pool.map(one_run, todo, chunksize=1):
            results[key] = [picked, by_mean]
            save()


def section(title: str, files: list[Path], strategies: list[str], budgets: list[float], seeds: int,
            results: dict[str, list[float]]) -> None:
    from kernsearch.studies._landscape import Landscape

    if not files:
        return
    print(f"\n== {title} ==")
    head = f"{'landscape':<42}{'configs':>8}{'budget':>12}  " + "".join(f"{s + ' med/p10/hit':>30}" for s in strategies)
    print(head)
    print("-" * len(head))
    rows: dict[tuple[float, str], list[tuple[float, float, float, float, float]]] = {}
    misses: dict[tuple[float, str], list[str]] = {}
    picks: dict[tuple[float, str], list[list[float]]] = {}
    for path in files:
        size = len(Landscape.load(path))
        for pct in budgets:
            line = f"{path.name.split('.json')[0][:41]:<42}{size:>8}{f'{pct:g}% ({budget_for(size, pct)})':>12}  "
            for strategy in strategies:
                runs = [results[Job(str(path), strategy, pct, s).key] for s in range(seeds)]
                picked, by_mean = [r[0] for r in runs], [r[1] for r in runs]
                if budget_for(size, 1) >= SMALL_BUDGET:
                    picks.setdefault((pct, strategy), []).append(picked)
                med, p10 = float(np.median(picked)), float(np.percentile(picked, 10))
                hit = float(np.mean([p >= HIT for p in picked]))
                rows.setdefault((pct, strategy), []).append((med, p10, hit, float(np.median(by_mean)),
                                                             float(np.percentile(by_mean, 10))))
                if hit < 0.9:
                    misses.setdefault((pct, strategy), []).append(f"{path.name.split('.json')[0]} {hit:.0%}")
                line += f"{med:>16.3f}/{p10:.3f}/{hit:>4.0%}"
            print(line, flush=True)
    small = [budget_for(len(Landscape.load(p)), 1) < SMALL_BUDGET for p in files]
    groups = [(f"{sum(not x for x in small)} file(s) where 1 % is >= {SMALL_BUDGET} trials", [not x for x in small]),
              (f"{sum(small)} SMALL file(s) where 1 % is < {SMALL_BUDGET} trials (reported apart)", small)]
    for label, keep in groups:
        if any(keep):
            _summary(label, {k: [r for r, m in zip(v, keep) if m] for k, v in rows.items()}, misses, files, keep)
    _intervals(picks)


def bootstrap_interval(per_file: list[list[float]], reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    """The 5th and 95th percentiles of the mean over files of the per-file median, each file's seeds resampled
    with replacement: how far the group's figure moves with the luck of the seeds (on a needle file a seed hits
    or misses, and the median of 20 flips with one or two seeds)."""
    rng = np.random.default_rng(seed)
    means = np.zeros(reps)
    for runs in per_file:
        a = np.asarray(runs)
        means += np.median(a[rng.integers(0, len(a), size=(reps, len(a)))], axis=1)
    means /= max(1, len(per_file))
    return float(np.percentile(means, 5)), float(np.percentile(means, 95))


def _intervals(picks: dict[tuple[float, str], list[list[float]]]) -> None:
    if picks:
        print("90 % bootstrap interval of the mean of per-file medians (files where 1 % is >= "
              f"{SMALL_BUDGET} trials; seeds resampled per file):")
    for (pct, strategy), per_file in sorted(picks.items()):
        lo, hi = bootstrap_interval(per_file)
        print(f"  {pct:g}%  {strategy:<18} {lo:.3f} - {hi:.3f}")


def _summary(label: str, rows: dict[tuple[float, str], list[tuple[float, float, float, float, float]]],
             misses: dict[tuple[float, str], list[str]], files: list[Path], keep: list[bool]) -> None:
    names = {p.name.split(".json")[0] for p, k in zip(files, keep) if k}
    print(f"mean over {label} of per-file median / p10 (smallest p10; files below 90 % hits):")
    for (pct, strategy), r in sorted(rows.items()):
        a = np.array(r)
        below = [m for m in misses.get((pct, strategy), []) if m.rsplit(" ", 1)[0] in names]
        print(f"  {pct:g}%  {strategy:<18} median {a[:, 0].mean():.3f}  p10 {a[:, 1].mean():.3f}  "
              f"(min p10 {a[:, 1].min():.3f}; by the recorded mean: {a[:, 3].mean():.3f} / {a[:, 4].mean():.3f}; "
              f"hit>=90% in {int((a[:, 2] >= 0.9).sum())}/{len(a)} files"
              + (f"; below: {', '.join(below)}" if below else "") + ")")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tuning", type=Path, nargs="*", default=[], help="folders/files the strategy was tuned on")
    ap.add_argument("--held-out", type=Path, nargs="*", default=[], help="folders/files it was NOT tuned on")
    ap.add_argument("--strategies", default="default,plain-tpe,random")
    ap.add_argument("--budgets", default="1,5", help="percent of each file's configs, comma-separated")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--only", default="", help="comma-separated substrings of file names to keep")
    ap.add_argument("--jobs", type=int, default=1, help="processes")
    ap.add_argument("--results", type=Path, help="JSON file of every run's score (resumed when it exists)")
    ap.add_argument("--transfer", action="store_true", help="also: the default strategy warm-started from the "
                    "other landscapes of the same family")
    ap.add_argument("--transfer-from", type=Path, nargs="*", default=[], help="also: each strategy warm-started from "
                    "the tuned-on files in these folders of the same kernel on other GPUs (not scored themselves)")
    ap.add_argument("--overhead", type=Path, help="only: overhead per trial of each strategy on this file")
    ap.add_argument("--overhead-trials", type=int, default=200)
    args = ap.parse_args(argv)
    if args.overhead:
        overhead(args.overhead, [s for s in args.strategies.split(",") if s], args.overhead_trials)
        return
    if not args.tuning and not args.held_out:
        ap.error("give --tuning and/or --held-out folders of KernelTuner cache files")
    keep = [s for s in args.only.split(",") if s]

    def pick(paths: list[Path]) -> list[Path]:
        return [p for p in files_in(paths) if not keep or any(k in p.name for k in keep)]

    strategies = [s for s in args.strategies.split(",") if s]
    budgets = [float(b) for b in args.budgets.split(",")]
    tuning, held = pick(args.tuning), pick(args.held_out)
    tuned = [p.name for p in held if p.name.split(".json")[0] in TUNED_ON]
    if tuned:
        ap.error(f"held-out file(s) the strategy was tuned on (TUNED_ON): {', '.join(tuned)}")
    results: dict[str, list[float]] = {}
    if args.results and args.results.is_file():
        results = json.loads(args.results.read_text())

    def save() -> None:
        if args.results:
            args.results.write_text(json.dumps(results, indent=0, sort_keys=True))

    jobs = [Job(str(p), s, pct, seed) for pct in budgets for p in tuning + held for s in strategies
            for seed in range(args.seeds)]  # the smallest budget first: its table is ready first
    if args.transfer:
        pool = tuning + held
        for p in pool:
            src = sources_for(p, pool)
            if src:
                for name in TRANSFER_ARMS:
                    jobs += [Job(str(p), name, pct, seed, src if name.endswith("+transfer") else ())
                             for pct in budgets for seed in range(args.seeds)]
    source_pool = files_in(args.transfer_from)
    sources = {p: tuned_sources(p, source_pool) for p in tuning + held} if source_pool else {}
    for p, src in sources.items():
        jobs += [Job(str(p), f"{s}+transfer", pct, seed, src) for pct in budgets for s in strategies if src
                 for seed in range(args.seeds)]
    run_all(list(dict.fromkeys(jobs)), results, args.jobs, save)
    print(f"score = optimum / recorded median time of the config picked after the final round (1.000 = optimum); "
          f"{args.seeds} seeds; budget = max({MIN_TRIALS}, ceil(pct x configs)) trials; racing on; "
          f"hit = share of seeds within 3 % of the optimum")
    section("TUNING files (the strategy was tuned on these: not evidence of generalisation)", tuning, strategies,
            budgets, args.seeds, results)
    section("HELD-OUT files (not tuned on)", held, strategies, budgets, args.seeds, results)
    if sources:
        arms = [a for s in strategies for a in (s, f"{s}+transfer")]
        section("TRANSFER to TUNING files from the other tuned-on files of the same kernel (other GPUs)",
                [p for p in tuning if sources[p]], arms, budgets, args.seeds, results)
        section("TRANSFER to HELD-OUT files from the tuned-on files of the same kernel (other GPUs)",
                [p for p in held if sources[p]], arms, budgets, args.seeds, results)
    if args.transfer:
        pool = tuning + held
        with_src = [p for p in pool if sources_for(p, pool)]
        section("TRANSFER: warm start from the other landscapes of the same family (another shape or chip)",
                with_src, list(TRANSFER_ARMS), budgets, args.seeds, results)


if __name__ == "__main__":
    main()

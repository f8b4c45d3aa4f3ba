"""A fast, noise-free stand-in for ``search_landscapes.py`` to compare search strategies on recorded landscapes
(issue 41, fourth round): every strategy proposes from the enumerated valid configs and is scored by the best config
it visited (``optimum / time``, each config's time the median of its recorded repetitions), without Optuna's storage,
noisy draws, racing or a final round. A strategy chosen here is then measured by the benchmark's own rules.

    .venv/bin/python benchmarks/search_harness.py table FILES... [--strategies forest,thompson] [--pct 1] [--seeds 40]
    .venv/bin/python benchmarks/search_harness.py curve FILES... [--strategies ...] [--trials 44,88,131,218]
    .venv/bin/python benchmarks/search_harness.py near FILES... [--strategies ...]   # how close the misses came
    .venv/bin/python benchmarks/search_harness.py learn FILES... [--trials 44,100,200,400]   # the surrogate's limit

Strategies: ``random``; ``tpe`` (Optuna's TPE, multivariate, 10 startup trials, every knob categorical, as
``plain-tpe``: an invalid or known proposal is told and asked again, the fifth in a row replaced by a random valid
config); ``forest`` and ``thompson`` (``studies/_forest.py`` itself: expected improvement, Thompson sampling);
``thompsonK`` (Thompson over the mean of K drawn trees); ``thompson-global`` (no one-knob candidates: every proposal
from a random sample of all free configs). ``--warm FILES``: every strategy first evaluates the configs transfer
(``studies/_transfer.py``) takes from those landscapes (another GPU's, same kernel: what a family's other studies give a
real tune): ``TRANSFER_LIMIT`` of them, the sources' fastest, round-robin.

``table`` prints per file the median, p10, mean and hit rate (share of seeds within 3 % of the optimum) of the best
visited config and, per strategy, the mean over files of each. ``curve``: median / hit rate per budget. ``near``: per
seed, the Hamming distance (knobs that differ) from the visited configs to the nearest hit, whether a hit is one knob
from the best config visited (a sweep of its neighbours would find it). ``learn``: the forest's trees fitted to N
random configs (no search): where they rank the optimum among the rest, and the best score among those N and the 44
they rank best.
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HIT = 1 / 1.03


@dataclass(frozen=True)
class Space:
    """A landscape's valid configs (failed ones included, as the replay's valid set) and their median times."""

    name: str
    knobs: dict[str, list[Any]]
    configs: list[dict[str, Any]]
    codes: np.ndarray  # (configs, knobs) value positions
    time: np.ndarray  # median time, inf when the config failed

    @property
    def score(self) -> np.ndarray:
        ok = np.isfinite(self.time)
        return np.where(ok, self.time[ok].min() / np.where(ok, self.time, 1.0), 0.0)


def load(path: Path) -> Space:
    from kernsearch.studies._landscape import Landscape

    land = Landscape.load(path)
    knobs = {k: list(v) for k, v in land.knobs.items()}
    configs, times = [], []
    for entry in land.entries.values():
        configs.append({k: entry[k] for k in knobs})
        times.append(math.inf if land.failed(entry) else float(np.median(entry.get("times") or [entry["time"]])))
    varying = {k: v for k, v in knobs.items() if len(v) > 1}
    pos = {k: {repr(v): i for i, v in enumerate(values)} for k, values in varying.items()}
    codes = np.array([[pos[k][repr(c[k])] for k in varying] for c in configs], dtype=np.int64)
    return Space(path.name.split(".json")[0], knobs, configs, codes, np.array(times))


Proposer = Callable[[list[int], list[float | None]], int]


def _random(space: Space, seed: int, budget: int) -> Proposer:
    rng = np.random.default_rng(seed)

    def propose(seen: list[int], values: list[float | None]) -> int:
        free = np.setdiff1d(np.arange(len(space.time)), seen)
        return int(rng.choice(free))
    return propose


def _forest(space: Space, seed: int, budget: int, acquisition: str = "ei", trees: int | None = None,
            local: bool = True) -> Proposer:
    from kernsearch.family._space import format_config
    from kernsearch.studies import _forest as forest_module
    from kernsearch.studies._forest import ForestSearch

    search = ForestSearch(space.knobs, space.configs, seed=seed, budget=budget, acquisition=acquisition)
    if not local:
        search._candidates = lambda free, idx, y: (  # type: ignore[method-assign]
            np.asarray(search.rng.choice(free, forest_module.MAX_CANDIDATES, replace=False))
            if len(free) > forest_module.MAX_CANDIDATES else free)

    def propose(seen: list[int], values: list[float | None]) -> int:
        known = {format_config(space.configs[i]): SimpleNamespace(value=v, config=space.configs[i])
                 for i, v in zip(seen, values)}
        saved = forest_module.THOMPSON_TREES
        forest_module.THOMPSON_TREES = trees or saved
        try:
            config = search.propose(known, set())
        finally:
            forest_module.THOMPSON_TREES = saved
        assert config is not None
        return search.rows[format_config(config)]
    return propose


def _tpe(space: Space, seed: int, budget: int) -> Proposer:
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState

    from kernsearch.family._space import format_config

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed, multivariate=True,
                                                                       n_startup_trials=10))
    dists = {k: CategoricalDistribution(v) for k, v in space.knobs.items()}
    index = {format_config(c): i for i, c in enumerate(space.configs)}
    rng = np.random.default_rng(seed)
    pending: list[Any] = []

    def tell(trial: Any, value: float | None) -> None:
        if value is None:
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, value)

    def propose(seen: list[int], values: list[float | None]) -> int:
        if pending:
            tell(pending.pop(), values[-1])
        for _ in range(5):
            trial = study.ask(dists)
            i = index.get(format_config({k: trial.params[k] for k in space.knobs}))
            if i is not None and i not in seen:
                pending.append(trial)
                return i
            if i is None:
                study.tell(trial, state=TrialState.PRUNED)
            else:
                tell(trial, values[seen.index(i)])
        i = int(rng.choice(np.setdiff1d(np.arange(len(space.time)), seen)))
        study.enqueue_trial(space.configs[i])
        pending.append(study.ask(dists))
        return i
    return propose


def strategy(name: str) -> Callable[[Space, int, int], Proposer]:
    if name == "random":
        return _random
    if name == "tpe":
        return _tpe
    if name == "forest":
        return _forest
    if name == "thompson-global":
        return lambda s, seed, b: _forest(s, seed, b, "thompson", local=False)
    if name.startswith("thompson"):
        k = int(name.removeprefix("thompson") or 0) or None
        return lambda s, seed, b: _forest(s, seed, b, "thompson", trees=k)
    raise SystemExit(f"unknown strategy {name!r}")


#: ``--warm``: the spaces whose best configs are evaluated first (transfer from another GPU of the same kernel), as
#: ``studies/_transfer.py`` picks them for a real tune from a family's other studies: ``transfer_configs``' limit,
#: round-robin over the sources, fastest first.
WARM: list[Space] = []


def warm_rows(space: Space) -> list[int]:
    """Rows of ``space`` holding the configs transfer would evaluate first (the sources' best, those valid here)."""
    from kernsearch.family._space import format_config
    from kernsearch.studies._transfer import TRANSFER_LIMIT

    index = {format_config(c): i for i, c in enumerate(space.configs)}
    ranked = [np.argsort(-source.score) for source in WARM]
    rows: list[int] = []
    for rank in range(max(len(r) for r in ranked)):
        for source, order in zip(WARM, ranked):
            if rank < len(order) and len(rows) < TRANSFER_LIMIT:
                i = index.get(format_config({k: source.configs[order[rank]].get(k) for k in space.knobs}))
                if i is not None and i not in rows:
                    rows.append(i)
    return rows


def run(space: Space, make: Callable[[Space, int, int], Proposer], seed: int, budget: int) -> list[int]:
    """The configs a seeded search visits, in order (a failed config's value None, as the study records it)."""
    propose = make(space, seed, budget)
    seen: list[int] = []
    values: list[float | None] = []
    first = warm_rows(space) if WARM else []
    for _ in range(min(budget, len(space.time))):
        i = first.pop(0) if first else propose(seen, values)
        assert i not in seen
        seen.append(i)
        values.append(float(space.time[i]) if np.isfinite(space.time[i]) else None)
    return seen


def table(files: list[Path], names: list[str], pct: float, seeds: int) -> None:
    per: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for path in files:
        space = load(path)
        budget = max(5, math.ceil(len(space.time) * pct / 100))
        line = f"{space.name[:34]:<35}{budget:>5}"
        for n in names:
            best = np.array([space.score[run(space, strategy(n), s, budget)].max() for s in range(seeds)])
            per[n].append(best)
            line += f"   {n}: {np.median(best):.3f}/{np.percentile(best, 10):.3f}/{best.mean():.3f}/{np.mean(best >= HIT):.0%}"
        print(line, flush=True)
    print(f"mean over {len(files)} files ({seeds} seeds, {pct:g} %) of per-file median / p10 / mean / hit rate:")
    for n in names:
        a = per[n]
        print(f"  {n:<16} {np.mean([np.median(x) for x in a]):.3f} / {np.mean([np.percentile(x, 10) for x in a]):.3f}"
              f" / {np.mean([x.mean() for x in a]):.3f} / {np.mean([np.mean(x >= HIT) for x in a]):.0%}")


def curve(files: list[Path], names: list[str], budgets: list[int], seeds: int) -> None:
    for path in files:
        space = load(path)
        for n in names:
            cells = []
            for b in budgets:
                best = np.array([space.score[run(space, strategy(n), s, b)].max() for s in range(seeds)])
                cells.append(f"{b}: {np.median(best):.3f}/{np.mean(best >= HIT):3.0%}")
            print(f"{space.name[:30]:<31}{n:<12}" + "   ".join(cells), flush=True)


def near(files: list[Path], names: list[str], pct: float, seeds: int) -> None:
    for path in files:
        space = load(path)
        budget = max(5, math.ceil(len(space.time) * pct / 100))
        hits = np.flatnonzero(space.score >= HIT)
        dist = np.min([(space.codes != space.codes[h]).sum(axis=1) for h in hits], axis=0)
        for n in names:
            found = close = adjacent = 0
            for s in range(seeds):
                seen = np.array(run(space, strategy(n), s, budget))
                best = seen[np.argmax(space.score[seen])]
                found += dist[best] == 0
                close += dist[best] <= 1
                adjacent += dist[seen].min() <= 1
            print(f"{space.name[:30]:<31}{n:<12} hit {found / seeds:4.0%}; a hit one knob from the best visited "
                  f"{close / seeds:4.0%}; a config one knob from a hit visited {adjacent / seeds:4.0%}", flush=True)


def learn(files: list[Path], sizes: list[int], seeds: int) -> None:
    from kernsearch.studies import _trees
    from kernsearch.studies._knob_features import knob_features

    for path in files:
        space = load(path)
        varying = {k: v for k, v in space.knobs.items() if len(v) > 1}
        X = knob_features(varying, space.configs)
        ok = np.isfinite(space.time)
        y = np.log(np.where(ok, space.time, space.time[ok].max() * 3))
        opt = int(np.argmax(space.score))
        for n in sizes:
            ranks, best = [], []
            for s in range(seeds):
                rng = np.random.default_rng(s)
                idx = rng.choice(len(y), n, replace=False)
                pred = _trees.fit(X[idx], y[idx], rng, trees=24, feature_share=0.5).predict(X).mean(axis=0)
                pred[idx] = np.inf
                order = np.argsort(pred)
                ranks.append(int(np.flatnonzero(order == opt)[0]) if opt not in idx else 0)
                best.append(max(space.score[order[:44]].max(), space.score[idx].max()))
            b = np.array(best)
            print(f"{space.name[:30]:<31}N={n:<5} rank of the optimum (median of {seeds}) {int(np.median(ranks)):>5}; "
                  f"best of N + the 44 ranked best: median {np.median(b):.3f}, within 3 % {np.mean(b >= HIT):.0%}",
                  flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("table", "curve", "near", "learn"))
    ap.add_argument("files", type=Path, nargs="+")
    ap.add_argument("--strategies", default="forest,thompson")
    ap.add_argument("--pct", type=float, default=1.0)
    ap.add_argument("--trials", default="44,88,131,218", help="curve: budgets; learn: random sample sizes")
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--warm", type=Path, nargs="*", default=[], help="landscapes of the same kernel on other GPUs: "
                    "their best configs are evaluated first, as transfer picks them (studies/_transfer.py)")
    args = ap.parse_args(argv)
    WARM.extend(load(p) for p in args.warm)
    names = [s for s in args.strategies.split(",") if s]
    for n in names:
        strategy(n)
    files = [f for t in args.files for f in (sorted(p for p in t.iterdir() if p.name.endswith((".json", ".json.gz")))
                                             if t.is_dir() else [t])]
    trials = [int(x) for x in args.trials.split(",")]
    if args.mode == "table":
        table(files, names, args.pct, args.seeds)
    elif args.mode == "curve":
        curve(files, names, trials, args.seeds)
    elif args.mode == "near":
        near(files, names, args.pct, args.seeds)
    else:
        learn(files, trials, args.seeds)


if __name__ == "__main__":
    main()

"""Re-judge the store's measured artifacts on this GPU as consumers call them (issues 26, 38).

One command on the GPU machine, from the repository root (MLX CUDA in /tmp/site, kernsearch in /tmp/site3)::

    PYTHONPATH=/tmp/site:/tmp/site3 python3 benchmarks/gpu_rejudge.py --store artifacts --out $OUT

For every key of this chip whose latest version lacks a figure of a mode its family is judged in (timed by
separate launches, or before chains: its ``graph`` figures read as ``batch``, so every committed decode artifact),
the variant (its config, rendered from the family's template) and the MLX op are timed by the final round's own
method (:func:`kernsearch.evaluation._consumer.consumer_samples` over the back-end's ``consumer_kernel``/
``consumer_op``: the exported package's planned calls, the chain, eager and the family's declared modes, cold
weights), and the result is offered to the store's gate like any tune's: a winner becomes a new version carrying
its consumer figures; a loser is recorded, and the old version's invalidation says what was measured. Writes
``$OUT/rejudge_<chip>.json``. ``--families qmatvec,swiglu_qmatvec,gemv`` limits it to those families.

The op is the judge's (``judge_op``: the baseline's plain MLX ops, compiled only where the spec gives a reason) and
the chain feeds the inputs the family declares (``chain_link``: the residual stream for the fused decode
families), as in a tune. ``--all`` re-times every measured key of this chip, also those whose versions already
carry figures of every judged mode (timed against an older op or link, e.g. a compiled baseline).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def log(*parts: Any) -> None:
    print(*parts, flush=True)


def rejudge_one(store: Any, key: Any, chip: Any, backend: Any) -> dict[str, Any]:
    from kernsearch.artifacts._candidate import Candidate
    from kernsearch.artifacts._manifest import Measurements
    from kernsearch.evaluation._consumer import ConsumerPlan, consumer_samples, timed_modes, weight_sets
    from kernsearch.evaluation._measure import speedup
    from kernsearch.evaluation._verify import make_inputs
    from kernsearch.family._render import geometry, render
    from kernsearch.family._space import Space, make_problem
    from kernsearch.family._spec import load_family

    versions = store.versions(key)
    art = store.load(key, versions[-1])
    m = art.manifest
    fam = load_family(key.family)
    space = Space(make_problem(fam, tuple(m.problem.shape), m.problem.dtype, chip), chip)
    config = dict(m.config)
    kernel, geo = render(fam, config, m.problem.dtype, "cuda"), geometry(space, config)
    first = make_inputs(space.problem, 11)
    weights = [t.name for t in fam.inputs if t.weight]
    n = weight_sets(sum(first[w].nbytes for w in weights), float(chip.system_cache_mb) * 2**20)
    sets = [first] + [{**first, **{w: make_inputs(space.problem, 11 + k)[w] for w in weights}} for k in range(1, n)]
    samples = consumer_samples({"k": backend.consumer_kernel(kernel, geo, fam, space.problem, sets),
                                "op": backend.consumer_op(fam, space.problem, sets)},
                               backend.evaluate, backend.sync, ConsumerPlan(modes=timed_modes(fam.consumer_modes)))
    modes = {}
    for mode, by in samples.items():
        s = speedup(by["k"], by["op"])
        modes[mode] = {"median_ms": float(np.median(by["k"])), "baseline_median_ms": float(np.median(by["op"])),
                       "speedup": s.median, "low": s.low, "high": s.high}
    judged = [str(m) for m in fam.consumer_modes]
    graph = samples[judged[0]]  # the mode that ranks: the family's first declared one (the chain for decode)
    s = speedup(graph["k"], graph["op"])
    from kernsearch.evaluation._measure import spread

    meas = Measurements(median_ms=float(np.median(graph["k"])), spread=spread(graph["k"]),
                        samples_ms=list(graph["k"]), baseline_median_ms=float(np.median(graph["op"])),
                        baseline_spread=spread(graph["op"]), speedup=s.median,
                        speedup_low=min([s.low] + [f["low"] for m, f in modes.items() if m in judged]),
                        speedup_high=s.high,
                        modes=modes, weight_sets=n)
    candidate = Candidate.for_config(space, config, target="cuda", correctness=m.correctness, evidence="measured",
                                     measurements=meas, study=f"rejudge of {key.path}/{versions[-1]}")
    outcome = store.publish(candidate)
    if not outcome.published:
        store.invalidate(key, f"re-judged on {chip.name} as consumers call it: {outcome.reason}")
    return {"key": key.path, "version": versions[-1], "modes": modes, "weight_sets": n,
            "published": outcome.published, "new_version": outcome.version, "reason": outcome.reason}


def judged_in_every_mode(m: Any, family: str) -> bool:
    """Whether a manifest has a figure of every mode its family is judged in (as read: before chains, ``graph``
    is ``batch``)."""
    from kernsearch.family._spec import load_family

    have = set((m.measurements.modes or {}) if m.measurements else {})
    return all(str(mode) in have for mode in load_family(family).consumer_modes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=ROOT / "artifacts")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--families", default="", help="comma-separated families (default: every family)")
    ap.add_argument("--all", action="store_true",
                    help="re-time versions that already have every judged mode's figures too")
    a = ap.parse_args(argv)
    only = {f for f in a.families.split(",") if f}
    a.out.mkdir(parents=True, exist_ok=True)
    from kernsearch import ArtifactStore
    from kernsearch.backends import get_backend
    from kernsearch.hardware._chips import detect_chip

    chip = detect_chip()
    backend = get_backend("cuda")
    backend.check_available()
    store = ArtifactStore(a.store)
    rows = []
    for key in store.keys():
        versions = store.versions(key)
        if key.chip != chip.name.replace(" ", "-") or not versions:
            continue
        m = store.load(key, versions[-1]).manifest
        if m.evidence != "measured" or (only and key.family not in only) or (
                not a.all and judged_in_every_mode(m, key.family)):
            continue
        try:
            row = rejudge_one(store, key, chip, backend)
        except Exception as exc:  # noqa: BLE001 - one key's failure is reported, the others go on
            row = {"key": key.path, "error": f"{type(exc).__name__}: {exc}"[:500]}
        rows.append(row)
        log(json.dumps(row)[:400])
    (a.out / f"rejudge_{chip.name.lower()}.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

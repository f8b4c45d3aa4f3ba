"""Issue 38: why the gate's bound for O + residual at M = 1 (1.31, its tune's final round) lies above what `bench
decode` measures for the same artifact in a decode's chain (1.03-1.24): the gate's own paired rounds (the package's
planned kernel call against the op a consumer writes, each chained from the previous output, as the final round
times them) re-run here for each current decode artifact at chains of 8 calls (the final round's) and 32 (the
bench's layers), in one process, with a fixed number of rounds (no early stop).

    python3 benchmarks/gpu_gate_vs_bench.py --store /tmp/store --out $OUT [--rounds 30] [--family F] [--m 1]

Writes ``$OUT/gpu_gate_vs_bench_<chip>[_<tag>].json``: per artifact and chain length the rounds' median ratio
(op / kernel) and its 99 % interval (``_rules_decision.ratio_interval``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _ratios(cuda: Any, art: Any, fam: Any, problem: Any, chip: Any, calls: int, rounds: int) -> dict[str, Any]:
    from kernsearch._rules_decision import ratio_interval
    from kernsearch.evaluation._consumer import PairedPlan, input_sets, paired_rounds

    sets = input_sets(problem, fam, chip, cuda, 7)
    kernel = cuda.consumer_kernel(art.kernel, art.geometry, fam, problem, sets)
    op = cuda.consumer_op(fam, problem, sets)
    plan = PairedPlan(calls=calls, max_rounds=rounds, max_seconds=120.0, modes=("graph",))
    got = sorted(paired_rounds(kernel, op, cuda.evaluate, cuda.sync, lambda r: False, plan)["graph"])
    iv = ratio_interval(got)
    return {"calls": calls, "rounds": len(got), "sets": len(sets), "median": got[len(got) // 2], "low": iv.low,
            "high": iv.high}


def _with_sets(n: int, run: Any) -> Any:
    """``run()`` with the final round's rotation of ``n`` copies of the weights (0: the gate's own count)."""
    from kernsearch.evaluation import _consumer

    if not n:
        return run()
    kept = _consumer.weight_sets
    _consumer.weight_sets = lambda *args, **kw: n  # type: ignore[assignment]
    try:
        return run()
    finally:
        _consumer.weight_sets = kept


def _low(m: Any) -> float | None:
    """The gate's bound: the smallest lower bound of the judged modes' intervals, as the dispatcher reads it."""
    from kernsearch._rules_decision import consumer_low

    try:
        low = consumer_low(m.model_dump()["modes"], ("graph",))
        return None if low is None else float(low)
    except Exception:  # noqa: BLE001 - a figure the probe cannot read is said as missing, not fatal
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", default="8,32")
    ap.add_argument("--family", action="append", default=[])
    ap.add_argument("--m", type=int, default=0, help="only artifacts of this many rows (0: all)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--sets", default="", help="copies of the weights to rotate, e.g. 10,32 (default: the gate's)")
    a = ap.parse_args(argv)
    from kernsearch import ArtifactStore, get_backend, load_family, make_problem
    from kernsearch.hardware._chips import detect_chip

    chip = detect_chip()
    cuda = get_backend("cuda")
    rows = []
    for art in ArtifactStore(a.store).current_artifacts():
        if art.key.chip != chip.name.replace(" ", "-") or (a.family and art.key.family not in a.family):
            continue
        if a.m and art.key.shape[0] != a.m:
            continue
        fam = load_family(art.key.family)
        problem = make_problem(fam, ",".join(map(str, art.key.shape)), art.key.dtype, chip)
        m = art.manifest.measurements
        bound = {"speedup": m.speedup, "chain_calls": m.chain_calls, "low": _low(m)} if m is not None else None
        row: dict[str, Any] = {"family": art.key.family, "shape": list(art.key.shape),
                               "ops_per_buffer": os.environ.get("MLX_MAX_OPS_PER_BUFFER", "default"),
                               "gate": bound, "chains": []}
        for calls in (int(c) for c in a.calls.split(",")):
            for sets in [int(n) for n in a.sets.split(",") if n] or [0]:
                got = _with_sets(sets, partial(_ratios, cuda, art, fam, problem, chip, calls, a.rounds))
                row["chains"].append({**got, "sets_forced": sets})
        rows.append(row)
        print(json.dumps(row), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    tag = f"_{a.tag}" if a.tag else ""
    (a.out / f"gpu_gate_vs_bench_{chip.name.replace(' ', '-')}{tag}.json").write_text(json.dumps({"rows": rows},
                                                                                                 indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

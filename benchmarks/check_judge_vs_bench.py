"""Issue 38's check, on the CPU, from what the GPU wrote: for each kernel row of `kernsearch bench decode --json`
(each fused call alone, a chain of dependent calls through the exported package, against the op a user writes),
the artifact the row ran and the lower bound its gate published it on (the chain's: ``graph`` mode's interval of
paired rounds; and the gate's own, the lowest over the modes its family is judged in), and whether the row's
speedup is at or above it; then, per M, the step's speedup beside what the four calls' chain figures predict for a
layer (the op's time over the package's, summed over Q/K/V, O, gate/up, down).

    python3 benchmarks/check_judge_vs_bench.py --store STORE_DIR BENCH.json [BENCH.json ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FOUR = ("qkv", "o", "gate_up", "down")


def bounds(store: Path) -> dict[str, tuple[float | None, float | None]]:
    """``key/version`` -> (the graph mode's lower bound, the gate's: the lowest over the family's judged modes)."""
    from kernsearch import ArtifactStore, load_family
    from kernsearch._rules_decision import consumer_low

    out = {}
    for art in ArtifactStore(store).current_artifacts():
        m = art.manifest.measurements
        figures = m.consumer() if m is not None else {}
        modes = tuple(load_family(art.key.family).consumer_modes)
        out[f"{art.key}/{art.version}"] = (consumer_low(figures, ("graph",)), consumer_low(figures, modes))
    return out


def check(run: dict[str, Any], published: dict[str, tuple[float | None, float | None]], name: str) -> int:
    held, op, pkg = 0, {}, {}
    for k in run["kernels"]:
        chain_low, gate_low = published.get(k["chose"], (None, None))
        ok = chain_low is not None and k["speedup"] >= chain_low
        held += ok
        print(f"{name}: {k['role']:8} M={k['M']}: chain {k['speedup']:.2f}x ({k['low']:.2f}-{k['high']:.2f}) against "
              f"its chain bound {chain_low or float('nan'):.3f} (gate {gate_low or float('nan'):.3f}): "
              f"{'holds' if ok else 'BELOW'}")
        if k["role"] in FOUR:
            op[k["M"]] = op.get(k["M"], 0.0) + k["op_us"]
            pkg[k["M"]] = pkg.get(k["M"], 0.0) + k["us"]
    print(f"{name}: {held} of {len(run['kernels'])} rows at or above their bound")
    for r in run["rows"]:
        if r["loop"] == "sync" and r["M"] in op:
            print(f"{name}: M={r['M']} step {r['speedup']:.2f}x ({r['low']:.2f}-{r['high']:.2f}); the four calls' "
                  f"chain figures predict {op[r['M']] / pkg[r['M']]:.2f}x for a layer")
    return len(run["kernels"]) - held


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("runs", type=Path, nargs="+")
    a = ap.parse_args(argv)
    published = bounds(a.store)
    below = sum(check(json.loads(p.read_text()), published, p.parent.name + "/" + p.stem) for p in a.runs)
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())

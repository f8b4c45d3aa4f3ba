"""A/B of the current templates against a store's artifacts: the same config, rendered now and as stored, timed
as the gate times decode kernels (a chain of dependent calls through the package's call path, cold weights), in
paired rounds of one process (issue 35: a kernel change is judged within one run, not across runs whose hosts
differ by 10 % and more).

On the GPU machine, from the repository root, after the wheel install of ``../shared/device/README.md``::

    python3 benchmarks/gpu_ab_template.py --store /tmp/store --out $OUT [--rounds 40] [--family NAME ...]

Each current artifact of the store (for the chip found) is verified rendered now against the float64 reference
(a ragged shape too), then timed: ``old/new`` per round (above 1: the current template is faster), its median and
99 % interval (``_rules_decision.ratio_interval``). ``--dry-run`` renders and compares the sources only (no GPU).
Writes ``$OUT/gpu_ab_template_<chip>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _time(cuda: Any, old: Any, new: Any, geo: Any, fam: Any, problem: Any, chip: Any, rounds: int,
          calls: int, old_geo: Any = None) -> dict[str, Any]:
    """``old``/``new`` per paired round (above 1: ``new`` is faster); ``old_geo``: the old kernel's launch geometry
    where its config differs (else ``geo``)."""
    from kernsearch._rules_decision import ratio_interval
    from kernsearch.evaluation._consumer import PairedPlan, input_sets, paired_rounds

    sets = input_sets(problem, fam, chip, cuda, 7)
    k_new = cuda.consumer_kernel(new, geo, fam, problem, sets)
    k_old = cuda.consumer_kernel(old, old_geo or geo, fam, problem, sets)
    plan = PairedPlan(calls=calls, max_rounds=rounds, max_seconds=60.0, modes=("graph",))
    ratios = paired_rounds(k_new, k_old, cuda.evaluate, cuda.sync, lambda r: False, plan)["graph"]
    iv = ratio_interval(ratios)
    ratios.sort()
    return {"rounds": len(ratios), "median": ratios[len(ratios) // 2], "low": iv.low, "high": iv.high}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--calls", type=int, default=32)
    ap.add_argument("--family", action="append", default=[])
    ap.add_argument("--chip", default=None, help="the store's chip (default: detected)")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    from kernsearch import ArtifactStore, get_backend, get_chip, load_family, make_problem, render
    from kernsearch.evaluation._verify import verify_kernel
    from kernsearch.hardware._chips import detect_chip

    chip = get_chip(a.chip) if a.chip else detect_chip()
    cuda = None if a.dry_run else get_backend("cuda")
    rows = []
    for art in ArtifactStore(a.store).current_artifacts():
        if art.key.chip != chip.name.replace(" ", "-") or (a.family and art.key.family not in a.family):
            continue
        fam = load_family(art.key.family)
        config = dict(art.manifest.config)
        new = render(fam, config, art.key.dtype, "cuda")
        row: dict[str, Any] = {"family": art.key.family, "shape": list(art.key.shape), "config": config,
                               "same_source": new.source == art.kernel.source and new.header == art.kernel.header}
        if cuda is not None and not row["same_source"]:
            problem = make_problem(fam, ",".join(map(str, art.key.shape)), art.key.dtype, chip)
            check, _ = verify_kernel(cuda, new, art.geometry, problem, seed=4)
            row["verified"] = check.summary()
            if check.ok:
                row.update(_time(cuda, art.kernel, new, art.geometry, fam, problem, chip, a.rounds, a.calls))
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "config"}), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"gpu_ab_template_{chip.name.replace(' ', '-')}.json").write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Paired A/B of other configs against a store's artifacts (issue 35): is the published config the fastest one as
a decode calls it, or did the tune's noise pick it?

The ninth session's Nsight pass found the M = 4 kernels at 14-22 % of DRAM peak and 5.6-32 % occupancy (O and down
launch 128 threadgroups of 4 warps for 132 SMs), while the tune's gate noise on these hosts was 48-67 %: a tune whose
final round cannot tell configs apart within 50 % may publish a slow one. Here each candidate is timed against the
published config as the gate times decode kernels (a chain of dependent calls through the package's call path, cold
weights), in paired rounds of one process, which resolved +-5 % (``gpu_ab_template.py``).

Candidates for each artifact (at most ``--per``): the published config's neighbours (one knob moved to another
value, valid at the artifact's shape), then the model's best config of each PATH and its overall top, each valid
and verified against the float64 reference before it is timed. On the GPU machine, from the repository root, after
the wheel install of ``../shared/device/README.md``::

    python3 benchmarks/gpu_ab_configs.py --store /tmp/store --out $OUT [--m 4] [--per 8] [--rounds 24]

Per candidate: ``old/new`` per round (above 1: the candidate is faster), its median and 99 % interval. The JSON
(``$OUT/gpu_ab_configs_<chip>.json``) is rewritten after every candidate: a run cut off keeps what it timed.
``--dry-run`` lists the candidates only (no GPU): what the CPU can check of this script.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def candidates(space: Any, published: dict[str, Any], per: int) -> list[tuple[str, dict[str, Any]]]:
    """(why, config) of the configs to time against ``published``: its valid one-knob neighbours in the model's
    order, then the model's best of each PATH and its overall best, no config twice, at most ``per``."""
    from kernsearch.backends._model import ModelBackend
    from kernsearch.backends._model_columns import predict_many
    from kernsearch.family._space import format_config

    model = ModelBackend(space.chip)
    neighbours = []
    for knob, values in space.knobs.items():
        for value in values:
            cfg = {**published, knob: value}
            if value != published.get(knob) and space.is_valid(cfg):
                neighbours.append((f"{knob}={value}", cfg))
    valid = space.enumerate().valid
    times = [p.time_ms for p in predict_many(model, space, valid)]
    ranked = [valid[i] for i in sorted(range(len(valid)), key=times.__getitem__)]
    best_of_path = {}
    for cfg in ranked:
        best_of_path.setdefault(cfg.get("PATH"), cfg)
    ntimes = [p.time_ms for p in predict_many(model, space, [c for _, c in neighbours])]
    seen = {format_config(published)}

    def fresh(picks: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
        """``picks`` without a config taken before (or twice)."""
        out = []
        for why, cfg in picks:
            if format_config(cfg) not in seen:
                seen.add(format_config(cfg))
                out.append((why, cfg))
        return out

    near = fresh([neighbours[i] for i in sorted(range(len(neighbours)), key=ntimes.__getitem__)])
    best = fresh([(f"model's best {path}", cfg) for path, cfg in best_of_path.items()] + [("model's best", ranked[0])])
    # every PATH's best is kept when ``per`` allows; the neighbours, in the model's order, fill what it leaves
    best = best[:per]
    return near[:per - len(best)] + best


def _row(cuda: Any, art: Any, fam: Any, space: Any, why: str, cfg: dict[str, Any], a: argparse.Namespace) -> dict[str, Any]:
    from gpu_ab_template import _time

    from kernsearch import render
    from kernsearch.evaluation._verify import verify_kernel
    from kernsearch.family._render import geometry

    row: dict[str, Any] = {"why": why, "config": cfg}
    kernel, geo = render(fam, cfg, art.key.dtype, "cuda"), geometry(space, cfg)
    check, _ = verify_kernel(cuda, kernel, geo, space.problem, seed=4)
    row["verified"] = check.summary()
    if check.ok:
        row.update(_time(cuda, art.kernel, kernel, geo, fam, space.problem, space.chip, a.rounds, a.calls,
                         old_geo=art.geometry))
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--m", type=int, action="append", default=[],
                    help="rows of the artifacts taken, the first given first (default: all)")
    ap.add_argument("--family", action="append", default=[])
    ap.add_argument("--per", type=int, default=8, help="candidates per artifact")
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--calls", type=int, default=32)
    ap.add_argument("--max-seconds", type=float, default=420.0, help="no new candidate is started after this")
    ap.add_argument("--chip", default=None, help="the store's chip (default: detected)")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    from kernsearch import ArtifactStore, get_backend, get_chip, load_family, make_problem
    from kernsearch.family._space import Space
    from kernsearch.hardware._chips import detect_chip

    started = time.monotonic()
    chip = get_chip(a.chip) if a.chip else detect_chip()
    cuda = None if a.dry_run else get_backend("cuda")
    out = a.out / f"gpu_ab_configs_{chip.name.replace(' ', '-')}.json"
    a.out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    arts = [art for art in ArtifactStore(a.store).current_artifacts()
            if art.key.chip == chip.name.replace(" ", "-") and (not a.family or art.key.family in a.family)
            and (not a.m or art.key.shape[0] in a.m)]
    for art in sorted(arts, key=lambda art: a.m.index(art.key.shape[0]) if a.m else 0):  # the first --m first
        fam = load_family(art.key.family)
        space = Space(make_problem(fam, ",".join(map(str, art.key.shape)), art.key.dtype, chip), chip)
        published = dict(art.manifest.config)
        entry: dict[str, Any] = {"family": art.key.family, "shape": list(art.key.shape), "dtype": art.key.dtype,
                                 "published": published,
                                 "rows": []}
        results.append(entry)
        for why, cfg in candidates(space, published, a.per):
            if cuda is None or time.monotonic() - started > a.max_seconds:
                entry["rows"].append({"why": why, "config": cfg, "timed": False})
            else:
                try:
                    entry["rows"].append(_row(cuda, art, fam, space, why, cfg, a))
                except Exception as exc:  # noqa: BLE001 - a candidate that fails to build or run is a row, not the end
                    entry["rows"].append({"why": why, "config": cfg, "error": f"{type(exc).__name__}: {exc}"[:300]})
            print(json.dumps({"family": art.key.family, "M": art.key.shape[0], **entry["rows"][-1]}), flush=True)
            out.write_text(json.dumps({"chip": chip.name, "rows": results}, indent=1))
    out.write_text(json.dumps({"chip": chip.name, "rows": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

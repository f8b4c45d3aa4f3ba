"""Offer the configs ``gpu_ab_configs.py`` found faster than the published ones to the store's gate (issue 35).

For each artifact of ``gpu_ab_configs_<chip>.json`` whose best candidate's 99 % interval against the published config
lies above ``--above`` (default 1.05), run ``kernsearch tune FAMILY --shape S --start CONFIG --publish`` on the GPU:
a short search that starts from that config, whose final round times its leader against the current version in
paired rounds of the same run (``Figures.versus``), on which the gate decides (docs/artifacts.md, rule 7). Nothing
is published on this script's word: the gate's own rounds decide.

    python3 benchmarks/gpu_ab_publish.py --ab $OUT/gpu_ab_configs_H200.json --store /tmp/store [--trials 6]

``--dry-run`` prints the commands only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def picks(ab: dict[str, Any], above: float) -> list[tuple[str, list[int], str, dict[str, Any], float]]:
    """(family, shape, dtype, config, interval low) of each artifact's best timed candidate whose interval's low end
    against the published config exceeds ``above``."""
    out = []
    for entry in ab.get("rows", []):
        timed = [r for r in entry.get("rows", []) if isinstance(r.get("low"), (int, float)) and r["low"] > above]
        if timed:
            best = max(timed, key=lambda r: (r["low"], r["median"]))
            out.append((str(entry["family"]), [int(d) for d in entry["shape"]], str(entry.get("dtype", "float16")),
                        dict(best["config"]), float(best["low"])))
    return out


def command(family: str, shape: list[int], dtype: str, config: dict[str, Any], store: str, trials: int) -> list[str]:
    start = ",".join(f"{k}={v}" for k, v in config.items())
    return [sys.executable, "-m", "kernsearch", "tune", family, "--shape", ",".join(map(str, shape)), "--dtype", dtype,
            "--backend",
            "cuda", "--start", start, "--trials", str(trials), "--publish", "--store", store, "--json"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ab", type=Path, required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument("--above", type=float, default=1.05)
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds for each tune")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    for family, shape, dtype, config, low in picks(json.loads(a.ab.read_text()), a.above):
        cmd = command(family, shape, dtype, config, a.store, a.trials)
        print(f"{family} {shape}: candidate {config} (interval low {low:.2f} against the published config)", flush=True)
        print(" ".join(cmd[1:]), flush=True)
        if a.dry_run:
            continue
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            print("  tune timed out", flush=True)
            continue
        try:
            publish = json.loads(proc.stdout).get("publish") or {}
        except ValueError:
            publish = {"error": proc.stderr.strip().splitlines()[-1:] or proc.returncode}
        print(f"  exit {proc.returncode}: {json.dumps(publish)[:600]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

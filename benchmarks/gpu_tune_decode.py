"""Issue 28's tunes on the GPU: every decode shape through `kernsearch tune --publish` (the store the command
publishes into is the repository's `artifacts/`, copied back under `$OUT`).

One command on the GPU machine, from the repository root, after the wheel install of `../shared/device/README.md`
and `pip install --no-deps --no-build-isolation --target /tmp/site3 .`::

    PYTHONPATH=/tmp/site:/tmp/site3 KERNSEARCH_HOME=/tmp/ksh KERNSEARCH_ARTIFACTS=$PWD/artifacts \\
        python3 benchmarks/gpu_tune_decode.py --group a --out $OUT --budget 420

Each tune is the CLI as a user runs it (its final round times the finalists and the op as consumers call them);
the logs go to ``$OUT/tunes_<group>.log`` and the store to ``$OUT/artifacts_<group>.tgz``. A tune that would not
finish inside ``--budget`` is not started (and said). ``--dry-run`` runs the same commands on a machine without a
GPU with the model back-end, no publish: it checks the commands, not the kernels.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def q(m: int, n: int, k: int, bits: int = 4, group: int = 64) -> str:
    """A qmatvec/swiglu_qmatvec problem (M,N,K,KW,NG) at ``bits`` bits and group ``group``."""
    return f"{m},{n},{k},{k * bits // 32},{k // group}"


#: (family, shape) per group: (a) the qmatvec shapes of issue 28's goals, (b) the rest of a Llama-7B-shaped
#: decode layer (hidden 4096, FFN 11008: Q/K/V concatenated, O, gate+up fused, down) at M = 1, (c) at M = 4.
GROUPS = {
    "a": [("qmatvec", q(1, 4096, 4096)), ("qmatvec", q(1, 11008, 4096)), ("qmatvec", q(1, 14336, 4096)),
          ("qmatvec", q(4, 11008, 4096)), ("qmatvec", q(4, 14336, 4096)), ("qmatvec", q(16, 4096, 4096))],
    "b": [("qmatvec", q(1, 12288, 4096)), ("qmatvec", q(1, 4096, 11008)), ("swiglu_qmatvec", q(1, 11008, 4096))],
    "c": [("qmatvec", q(4, 12288, 4096)), ("qmatvec", q(4, 4096, 4096)), ("qmatvec", q(4, 4096, 11008)),
          ("swiglu_qmatvec", q(4, 11008, 4096))],
}
#: Issue 35: the fused decode families at every call of a Llama-7B-shaped layer (norm + Q/K/V, O + residual,
#: norm + gate/up SwiGLU, down + residual), M = 1 and M = 4: what `kernsearch bench decode --job` lists.
#: mlp_block (the post-attention half in one persistent kernel) first: with rmsnorm_qmatvec, the two-launch layer.
for _m in (1, 4):
    GROUPS[f"fused{_m}"] = [("mlp_block", f"{_m},4096,11008,512,64,1376,172"), ("rmsnorm_qmatvec", q(_m, 12288, 4096)),
                            ("rmsnorm_swiglu_qmatvec", q(_m, 11008, 4096)), ("qmatvec_residual", q(_m, 4096, 11008)),
                            ("qmatvec_residual", q(_m, 4096, 4096))]
#: The two M = 4 tunes whose h2 configs needed X past 48 KB of shared memory (refused before the opt-in).
GROUPS["fix4"] = [("qmatvec_residual", q(4, 4096, 11008)), ("mlp_block", "4,4096,11008,512,64,1376,172")]


def h2_starts(family: str, shape: str) -> list[str]:
    """``--start`` configs of the h2 core for a tune (evaluated first: a short tune may not sample the path)."""
    m = int(shape.split(",")[0])
    mb = 1 if m == 1 else 4 if m <= 4 else 0
    two = family in ("mlp_block", "rmsnorm_swiglu_qmatvec", "swiglu_qmatvec")   # two matrices a pass
    if not mb:
        return []
    pairs = [(1, 2), (1, 4)] + ([(2, 2)] if not (two and mb > 1) and mb <= 2 else [])
    bps = {(1, 2): 4, (1, 4): 3, (2, 2): 2}   # mlp_block: as many blocks an SM as registers allow (H200, ptxas)
    if mb > 1:  # M = 4: X1 of 11008 values staged (94 KB): two blocks an SM by shared memory
        bps = {k: min(v, 2) for k, v in bps.items()}
    return [f"PATH=h2,KS=1,TW=1,MB={mb},RT={rt},UNROLL={u}" + (f",BPS={bps[rt, u]}" if family == "mlp_block" else "")
            for rt, u in pairs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--group", choices=sorted(GROUPS), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for all the tunes of the group")
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--time-budget", default=None, help="each tune's --time-budget (e.g. 60s); default: none")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--h2-start", action="store_true", help="evaluate the h2 core's configs first (tune --start)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    log = (a.out / f"tunes_{a.group}.log").open("w")
    start, took = time.monotonic(), []
    for family, shape in GROUPS[a.group]:
        left = a.budget - (time.monotonic() - start)
        guess = max(took) if took else 45.0
        if left < guess:
            print(f"skipped {family} {shape}: {left:.0f} s left of the budget, a tune takes ~{guess:.0f} s",
                  file=log, flush=True)
            continue
        cmd = [sys.executable, "-m", "kernsearch.cli", "tune", family, "--shape", shape, "--dtype", "float16",
               "--trials", str(a.trials), "--finalists", "3"]
        cmd += ["--time-budget", a.time_budget] if a.time_budget else []
        for cfg in h2_starts(family, shape) if a.h2_start else []:
            cmd += ["--start", cfg]
        cmd += ["--backend", "model", "--chip", "H100", "--trials", "3"] if a.dry_run else ["--backend", "cuda",
                                                                                             "--publish"]
        print(f"$ {' '.join(cmd[1:])}", file=log, flush=True)
        t0 = time.monotonic()
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=max(60.0, left),
                             env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "160"})
        took.append(time.monotonic() - t0)
        print(res.stdout + res.stderr + f"[exit {res.returncode}, {took[-1]:.0f} s]\n", file=log, flush=True)
        print(f"{family} {shape}: exit {res.returncode} in {took[-1]:.0f} s; "
              + next((line for line in res.stdout.splitlines()[::-1] if "artifact" in line or "winner" in line), ""),
              flush=True)
        if res.returncode != 0 and len(took) == 1 and not a.group.startswith("fused"):  # the rest would fail too
            print("the first tune failed; the group stops here:\n" + (res.stdout + res.stderr)[-3000:], flush=True)
            break
    store = Path(os.environ.get("KERNSEARCH_ARTIFACTS", REPO / "artifacts"))
    with tarfile.open(a.out / f"artifacts_{a.group}.tgz", "w:gz") as tar:
        tar.add(store, arcname="artifacts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

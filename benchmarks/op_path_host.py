"""Host cost of the exported package's call where it runs the MLX op (issue 37, "the op path adds nothing").

Runs on MLX's CPU back-end (no GPU needed). Exports ``artifacts/`` (every family) to a source tree and builds its
dispatcher in two situations:

* ``no-gpu``: this machine as it is (no GPU: no kernel of any family can run, every call is the op);
* ``h100-untuned``: the dispatcher told it runs on an H100 (device_info injected, a GPU reported available), at
  shapes no artifact was tuned for: the store holds H100 kernels of the decode families, so every call is planned
  and runs the op, the path the GPU figures of issue 37 took (2.51 us per qmatvec call against the op's 0.78 us).

For each family (small shapes; nothing is evaluated: host time only, building the lazy graph), microseconds per
call, interleaved (the three shuffled every round, 300 rounds of 200 calls, the least sample of each: this machine
is shared), all three called through one lambda: the op called by hand (``op``), the package's plain call with
weights seen before (``package``) and its bound form (``bound``, weight families). The goal: package <= op + 0.5 us, bound <=
op + 0.3 us. ``--out FILE`` writes the figures as JSON; the table is printed.

    .venv/bin/python benchmarks/op_path_host.py --out benchmarks/data/op_path_host_cpu.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_consumer import CPU_SHAPES, FAMILIES, consumer_op, problem_arrays  # noqa: E402

H100 = {"architecture": "sm_90", "device_name": "NVIDIA H100 80GB HBM3"}
#: Shapes no H100 artifact was tuned at (the decode families' are M = 1..16 at Llama sizes).
UNTUNED = {"qmatvec": (2, 4096, 4096, 512, 64), "swiglu_qmatvec": (2, 4096, 4096, 512, 64), "gemv": (2, 4096, 4096)}


def interleaved_us(fns: dict[str, Any], rounds: int = 300, calls: int = 200) -> dict[str, float]:
    """Microseconds of host time per call building the graph (nothing evaluated) of each ``fns`` entry (no
    arguments): ``calls`` calls per sample, the entries shuffled every round, the least sample of each (on a
    shared machine the least is the one no other process interrupted)."""
    for f in fns.values():
        f()
    best = {name: math.inf for name in fns}
    order = list(fns)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            f = fns[name]
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            best[name] = min(best[name], (time.perf_counter() - t0) / calls * 1e6)
    return best


def costs(d: Any, family: str, shape: tuple[int, ...]) -> dict[str, Any]:
    import mlx.core as mx

    from kernsearch.family._spec import load_family

    sets, dims, weighted, _ = problem_arrays(family, shape, "float32" if family not in UNTUNED else "float16", 1)
    args = sets[0]
    op, fn = consumer_op(family, mx, dims), d.function(family)
    row: dict[str, Any] = {"shape": "x".join(map(str, shape)), "chose": str(d.explain(family, *args).level)}
    fns = {"op": lambda: op(*args), "package": lambda: fn(*args)}
    if weighted:
        slots = [i for i, t in enumerate(load_family(family).inputs) if t.weight]
        bound = d.bind(family, *[args[i] for i in slots])
        free = [args[i] for i in range(len(args)) if i not in slots]
        fns["bound"] = lambda: bound(*free)
    row.update(interleaved_us(fns))
    row["package_over_op"] = row["package"] - row["op"]
    if "bound" in row:
        row["bound_over_op"] = row["bound"] - row["op"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--store", type=Path, default=ROOT / "artifacts")
    ap.add_argument("--families", default=",".join(FAMILIES))
    a = ap.parse_args(argv)
    import mlx.core as mx

    from kernsearch import ArtifactStore, export
    from kernsearch.exporting.runtime import _runtime

    work = Path(tempfile.mkdtemp(prefix="op_path_host_"))
    result = export(list(FAMILIES), work / "export", ArtifactStore(a.store), package="ks_host", version="0.0.1")
    root = result.source_dir / "ks_host"
    report: dict[str, Any] = {"mlx": mx.__version__, "python": platform.python_version(),
                              "machine": platform.machine(), "device": "cpu", "situations": {}}
    gpu_available = _runtime._gpu_available
    for situation in ("no-gpu", "h100-untuned"):
        rows = {}
        if situation == "h100-untuned":
            _runtime._gpu_available = lambda: True  # type: ignore[assignment]
        d = _runtime.Dispatcher(root, device_info=H100 if situation == "h100-untuned" else None)
        for family in [f for f in a.families.split(",") if f]:
            shape = UNTUNED.get(family, CPU_SHAPES[family]) if situation == "h100-untuned" else CPU_SHAPES[family]
            rows[family] = costs(d, family, shape)
            r = rows[family]
            print(f"{situation:13s} {family:15s} {r['shape']:18s} {r['chose']:8s} op {r['op']:.2f} us  package "
                  f"{r['package']:.2f} (+{r['package_over_op']:.2f})"
                  + (f"  bound {r['bound']:.2f} (+{r['bound_over_op']:.2f})" if "bound" in r else ""), flush=True)
        _runtime._gpu_available = gpu_available  # type: ignore[assignment]
        report["situations"][situation] = rows
    if a.out:
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""GPU-side kernel durations of the published GEMM artifacts, the family default and ``mx.matmul``.

The wall-clock timings of ``gpu_gemm.py`` include MLX's per-operation host cost, which dominates a
kernel of a few tens of microseconds (the decode shape). Run under Nsight Compute to read each
kernel's own duration on the GPU::

    ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file OUT/ncu.csv \\
        python benchmarks/gpu_kernel_times.py --shape 16x4096x4096 --out OUT/order.json [--runs 5]

Each variant loads its current artifact from ``artifacts/`` (so this also checks that the published
kernels load, verify against the float64 reference and run) and runs ``--runs`` times; kernels are
told apart by name (``custom_kernel_kernsearch_gemm_<hash>`` for ours, the cuBLAS/CUTLASS kernels
for ``mx.matmul``). One shape per ncu run. ``summarise`` reads the CSV back::

    python benchmarks/gpu_kernel_times.py summarise OUT/ncu.csv OUT/order.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KEYS = {"4096x4096x4096": (4096, 4096, 4096), "16x4096x4096": (16, 4096, 4096)}


def run(runs: int, shape_key: str, out: Path) -> None:
    import mlx.core as mx
    from gpu_gemm import device_chip  # noqa: E402 - same folder

    from kernsearch import ArtifactStore, Space, geometry, get_backend, load_family, make_problem, render
    from kernsearch.artifacts._artifacts import ArtifactKey
    from kernsearch.backends._mlx_base import mlx_namespace, to_mx
    from kernsearch.evaluation._verify import kernel_inputs, make_inputs, verify_kernel

    fam = load_family("gemm")
    chip, _ = device_chip()
    cuda = get_backend("cuda")
    store = ArtifactStore(Path("artifacts"))
    order = []  # (label, kernel name prefix) in launch order
    for text, shape in [(shape_key, KEYS[shape_key])]:
        problem = make_problem(fam, shape, "float16", chip)
        space = Space(problem, chip)
        art = store.load(ArtifactKey("gemm", "H100", "float16", shape))
        variants = {"tuned " + art.version: (art.kernel, art.geometry),
                    "default": (render(fam, dict(fam.default), "float16", "cuda"), geometry(space, dict(fam.default)))}
        logical = make_inputs(problem, 3)
        for label, (kernel, geo) in variants.items():
            check, _ = verify_kernel(cuda, kernel, geo, problem, seed=4)
            print(f"{text} {label}: {check.summary()}", flush=True)
            arrays = [to_mx(x, "float16") for x in kernel_inputs(problem, logical, geo)]
            for _ in range(runs):
                mx.eval(cuda._call(kernel, geo, arrays, None))
            order.append({"shape": text, "label": label, "kernel": f"custom_kernel_{kernel.name}"})
        a, b = to_mx(logical["A"], "float16"), to_mx(logical["B"], "float16")
        ns = mlx_namespace()
        for _ in range(runs):
            mx.eval(ns["matmul"](a, b))
        order.append({"shape": text, "label": "mx.matmul", "kernel": None})
        mx.synchronize()
    out.write_text(json.dumps({"runs": runs, "order": order}, indent=1))


def summarise(csv_path: Path, order_path: Path) -> None:
    """Per variant, the GPU durations of its last ``runs`` launches (ours by kernel name; mx.matmul = the
    GEMM-like kernels that are not ours, reported with their names)."""
    import csv

    rows = []
    with open(csv_path, newline="") as fh:
        lines = [line for line in fh if line.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") == "gpu__time_duration.sum":
            scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0}.get(r.get("Metric Unit", "nsecond"), 1e-6)
            rows.append((r["Kernel Name"], float(r["Metric Value"].replace(",", "")) * scale))
    order = json.loads(order_path.read_text())
    runs = order["runs"]
    ours = [o["kernel"] for o in order["order"] if o["kernel"]]
    result = []
    print(f"{'shape':<16} {'variant':<10} {'GPU median ms':>14} {'min':>9}  kernel(s)")
    for o in order["order"]:
        if o["kernel"]:
            picked = [(n, ms) for n, ms in rows if o["kernel"] in n][-runs:]
        else:
            picked = [(n, ms) for n, ms in rows if not any(k in n for k in ours)
                      and any(t in n.lower() for t in ("gemm", "gemv", "xmma", "cutlass", "matmul", "nvjet", "splitk"))]
        if not picked:
            print(f"{o['shape']:<16} {o['label']:<10} no kernel found")
            continue
        # Per kernel name the median of its launches; a call made of several kernels (split-K GEMM +
        # reduction) costs the sum of its kernels' medians.
        by_name: dict[str, list[float]] = {}
        for n, ms in picked:
            by_name.setdefault(n, []).append(ms)
        names = sorted(by_name)
        med = float(sum(np.median(v) for v in by_name.values()))
        low = float(sum(min(v) for v in by_name.values()))
        print(f"{o['shape']:<16} {o['label']:<10} {med:>14.4f} {low:>9.4f}  {'; '.join(n[:60] for n in names)}")
        result.append({**o, "gpu_ms": {n: v for n, v in by_name.items()}, "median_ms": med, "min_ms": low})
    Path(csv_path).with_suffix(".summary.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "summarise":
        summarise(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        def arg(name: str, default: str) -> str:
            return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default

        run(int(arg("--runs", "5")), arg("--shape", "4096x4096x4096"), Path(arg("--out", "kernel_times_order.json")))

"""What limits the WMMA template at 4096^3 float16: hand-edited variants of the landscape's best config.

    python benchmarks/gpu_headroom.py

Not a search: three edits of one rendered kernel (BM=128,BN=128,BK=32,WM=2,WN=4, WMMA, double buffer,
PAD=4), each verified on the device against the float64 reference, then timed interleaved with
``mx.matmul`` (one submission per launch):
  render    the template's own output (VEC=4: 8-byte cp.async copies)
  cp16      16-byte copies (``cp.async.cg``, 8 halves), a width the VEC knob cannot express for float16
  cp16+bk64 16-byte copies and BK=64 (half the barriers per K; outside the BK knob's domain)
Answers whether the gap to mx.matmul is in the copies/barriers (the knobs' reach) or in the WMMA
inner loop itself.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIG = "BM=128,BN=128,BK=32,WM=2,WN=4,MMA=simdgroup,STAGE=AB,VEC=4,DOUBLE_BUFFER=true,LAYOUT_B=n,PAD=4"


def main() -> None:
    from gpu_gemm import device_chip, stats  # noqa: E402 - same folder

    from kernsearch import Space, geometry, get_backend, load_family, make_problem, render
    from kernsearch.evaluation._measure import TimingPlan, interleaved
    from kernsearch.evaluation._verify import kernel_inputs, make_inputs, verify_kernel

    fam = load_family("gemm")
    chip, _ = device_chip()
    problem = make_problem(fam, "4096,4096,4096", "float16", chip)
    space = Space(problem, chip)
    cfg = space.validate(space.parse_config(CONFIG))
    base, geo = render(fam, cfg, "float16", "cuda"), geometry(space, cfg)

    def edit(kernel, name: str, swaps: list[tuple[str, str]], header_swaps: list[tuple[str, str]]):  # noqa: ANN001, ANN202
        src, hdr = kernel.source, kernel.header
        for a, b in swaps:
            assert a in src, a
            src = src.replace(a, b)
        for a, b in header_swaps:
            assert a in hdr, a
            hdr = hdr.replace(a, b)
        return dataclasses.replace(kernel, name=f"{kernel.name}_{name}", source=src, header=hdr)

    cp16_hdr = [("cp.async.ca.shared.global [%0], [%1], 8, %2;", "cp.async.cg.shared.global [%0], [%1], 16, %2;"),
                ("inside ? 8 : 0", "inside ? 16 : 0")]
    cp16 = edit(base, "cp16", [("constexpr int VEC = 4;", "constexpr int VEC = 8;")], cp16_hdr)
    bk64 = edit(base, "cp16bk64", [("constexpr int VEC = 4;", "constexpr int VEC = 8;"),
                                   ("constexpr int BM = 128, BN = 128, BK = 32;",
                                    "constexpr int BM = 128, BN = 128, BK = 64;")], cp16_hdr)
    smem64 = (128 * (64 + 8) + 64 * (128 + 8)) * 2 * 2
    variants = {"render": (base, geo), "cp16": (cp16, geo),
                "cp16+bk64": (bk64, dataclasses.replace(geo, shared_memory=smem64))}
    cuda = get_backend("cuda")
    logical = make_inputs(problem, 7)
    candidates = {}
    for label, (kernel, g) in variants.items():
        check, _ = verify_kernel(cuda, kernel, g, problem, seed=13)
        print(f"{label}: {check.summary()}", flush=True)
        if check.ok:
            candidates[label] = cuda.launcher(kernel, g, kernel_inputs(problem, logical, g), "float16", sets=1)
    candidates["mx.matmul"] = cuda.baseline_launcher(fam, problem, logical, sets=1)
    samples = interleaved(candidates, rounds=20, plan=TimingPlan(min_batch_ms=25.0))
    base_ms = float(np.median(samples["mx.matmul"]))
    for label, s in samples.items():
        st = stats(s)
        print(f"  {label:<10} {st['median_ms']:.4f} ms ({st['p10_ms']:.4f}-{st['p90_ms']:.4f})  "
              f"{problem.flops() / st['median_ms'] / 1e9:.0f} TFLOP/s  {100 * base_ms / st['median_ms']:.1f}% of mx.matmul")


if __name__ == "__main__":
    main()

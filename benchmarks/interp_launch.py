"""CPU a kernel run of the interpreter costs its caller, forked by the caller itself or by its thread's launcher
(``kernsearch.interp._launcher``), in a caller that holds 0-800 MB (a search process holds ~100 MB, a pytest worker
of ``make test`` 500-900 MB by its end). Interleaved, several rounds; CPU = the caller's and its children's user +
system time (a run's child is the caller's or the launcher's: both are counted, the launcher's when it ends).

    python benchmarks/interp_launch.py [--runs 40] [--rounds 3] [--out benchmarks/interp_launch.txt]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

SIZES_MB = (0, 200, 800)


def child(size_mb: int, how: str, runs: int) -> float:
    """CPU seconds a run costs (median of ``runs`` runs' mean, in one process holding ``size_mb`` MB)."""
    import numpy as np

    from kernsearch import Geometry, KernelSource, get_backend
    from kernsearch.interp import _run

    held = [bytearray(os.urandom(1)) * (1 << 20) for _ in range(size_mb)]  # touched pages, as a worker's heap
    if how == "caller":
        _run._LOCAL.refused = os.getpid()  # as where no launcher can start: the caller forks
    kernel = KernelSource(name="bench", target="metal", input_names=("A",), output_names=("C",),
                          header="#include <metal_stdlib>\nusing namespace metal;\n",
                          source="C[thread_position_in_grid.x] = 2.0f * A[thread_position_in_grid.x];",
                          template=(("T", "float32"),))
    geo = Geometry(grid=(256, 1, 1), threadgroup=(64, 1, 1), output_shapes=((256,),), output_dtypes=("float32",))
    backend = get_backend("cpu")
    a = np.arange(256, dtype=np.float64)
    backend.run(kernel, geo, [a], "float32")  # compiled and cached; the launcher started
    launcher = _run._launcher_here()
    t0, c0 = _cpu(), time.perf_counter()
    for i in range(runs):
        backend.run(kernel, geo, [a], "float32")
        for block in held[i % 8::8]:  # the caller goes on writing its heap between runs (an eighth of it)
            block[4096 * (i % 256)] = i % 256
    if launcher is not None:
        launcher.close()  # reaped: its CPU (and its children's) counted
    wall = time.perf_counter() - c0
    cpu = (_cpu() - t0) / runs
    print(f"{cpu:.6f} {wall / runs:.6f}")
    return cpu


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="")
    ap.add_argument("--child", nargs=2)
    opts = ap.parse_args()
    if opts.child:
        child(int(opts.child[0]), opts.child[1], opts.runs)
        return
    seen: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for _ in range(opts.rounds):
        for size in SIZES_MB:
            for how in ("caller", "launcher"):
                out = subprocess.run([sys.executable, __file__, "--runs", str(opts.runs), "--child", str(size), how],
                                     capture_output=True, text=True, check=True).stdout.split()
                seen.setdefault((size, how), []).append((float(out[0]), float(out[1])))
    lines = [f"interpreter kernel runs, {opts.runs} a process, {opts.rounds} rounds interleaved; median ms a run "
             f"(CPU of the caller and its children; wall); {os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
             f"{'held MB':>8} {'forked by':>9} {'CPU ms':>8} {'wall ms':>8}"]
    for (size, how), got in seen.items():
        lines.append(f"{size:>8} {how:>9} {statistics.median(c for c, _ in got) * 1e3:>8.2f} "
                     f"{statistics.median(w for _, w in got) * 1e3:>8.2f}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if opts.out:
        with open(opts.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()

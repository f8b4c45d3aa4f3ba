"""Throughput of the Metal-on-CPU interpreter (interpreted evidence: correctness only, not kernel speed).

Prints, for GEMM 64x64x64 float32:
  * variants verified per minute in fast mode, from a cold compile cache (compile + run + reference check),
  * compile time per variant (median, p90),
  * CPU time per verified variant (compile + run + check), a load-independent throughput estimate,
  * CPU time of run + check per variant with a warm cache, fast vs check mode, and the check-mode
    slowdown of the kernel run alone where it dominates (256x256x256).

    .venv/bin/python benchmarks/interp_bench.py [--variants 40] [--jobs 1]

``--jobs`` verifies that many variants at once (one process each); the figure a search on this machine
sees depends on what else runs on it, so the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor


def _setup():
    from kernsearch import Space, get_chip, load_family, make_problem

    fam = load_family("gemm")
    chip = get_chip("M2 Max")
    problem = make_problem(fam, "64,64,64", "float32", chip)
    return fam, chip, problem, Space(problem, chip)


def _cpu_seconds() -> float:
    """CPU time of this process and its waited-for children (g++, forked kernel runs)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _verify(cfg: dict, mode: str) -> tuple[bool, float, float, float]:
    """(passed, compile seconds, wall seconds, CPU seconds) of one verification."""
    from kernsearch import geometry, get_backend, render
    from kernsearch.evaluation._verify import verify_kernel

    fam, chip, problem, space = _setup()
    cpu0 = _cpu_seconds()
    start = time.perf_counter()
    check, diags = verify_kernel(get_backend("cpu"), render(fam, cfg, "float32"), geometry(space, cfg), problem,
                                 mode=mode, chip=chip)
    wall = time.perf_counter() - start
    cpu = _cpu_seconds() - cpu0
    return check.ok and not [d for d in diags if d.severity == "error"], _last_compile(), wall, cpu


def _run_only(cfg: dict, mode: str, shape: str) -> float | None:
    """CPU seconds of one run (objects compiled first, outside the measurement); None if invalid there."""
    from kernsearch import Space, geometry, get_backend, get_chip, make_problem, render
    from kernsearch.evaluation._verify import kernel_inputs, make_inputs

    fam, chip, _, _ = _setup()
    problem = make_problem(fam, shape, "float32", get_chip(chip.name))
    space = Space(problem, chip)
    if not space.is_valid(cfg):
        return None
    kernel, geo = render(fam, cfg, "float32"), geometry(space, cfg)
    inputs = kernel_inputs(problem, make_inputs(problem), geo)
    cpu = get_backend("cpu")
    cpu.run(kernel, geo, inputs, "float32", mode=mode, timeout=600)  # compile (cached afterwards)
    start = _cpu_seconds()
    cpu.run(kernel, geo, inputs, "float32", mode=mode, timeout=600)
    return _cpu_seconds() - start


def _barrier_cost() -> float:
    """Seconds per thread per barrier: a kernel doing 1000 extra barriers with 1024 threads."""
    import numpy as np

    from kernsearch import Geometry, KernelSource, get_backend

    cpu = get_backend("cpu")
    geo = Geometry((1024, 1, 1), (1024, 1, 1), ((1024,),), ("float32",))
    times = []
    for iters in (1, 1001):
        src = (f"for (int i = 0; i < {iters}; ++i) {{ threadgroup_barrier(mem_flags::mem_none); }}\n"
               "C[thread_position_in_grid.x] = A[0];")
        k = KernelSource("barriers", "metal", ("A",), ("C",), "", src, (("T", "float32"),))
        cpu.run(k, geo, [np.ones(8)], "float32")
        start = time.perf_counter()
        cpu.run(k, geo, [np.ones(8)], "float32")
        times.append(time.perf_counter() - start)
    return (times[1] - times[0]) / (1000 * 1024)


_COMPILE_SECONDS: list[float] = []


def _last_compile() -> float:
    return _COMPILE_SECONDS[-1] if _COMPILE_SECONDS else 0.0


def _track_compiles() -> None:
    from kernsearch.interp import _compile, _interp

    original = _compile.compile_unit

    def tracked(cpp: str, mode: str, *rest: bool):  # noqa: ANN202
        result = original(cpp, mode, *rest)
        _COMPILE_SECONDS.append(result.seconds)
        return result

    _interp.compile_unit = tracked


def _worker_init(cache: str) -> None:
    os.environ["KERNSEARCH_CACHE"] = cache
    _track_compiles()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    _, _, _, space = _setup()
    valid = space.enumerate().valid
    configs = random.Random(args.seed).sample(valid, min(args.variants, len(valid)))
    load = os.getloadavg()
    print(f"GEMM 64x64x64 float32, {len(configs)} random valid variants (of {len(valid)}), {args.jobs} job(s), "
          f"{os.cpu_count()} CPUs, load average {load[0]:.2f} at start")

    with tempfile.TemporaryDirectory(prefix="ks-bench-") as cache:
        start = time.perf_counter()
        with ProcessPoolExecutor(args.jobs, initializer=_worker_init, initargs=(cache,)) as pool:
            cold = list(pool.map(_verify, configs, ["fast"] * len(configs)))
        elapsed = time.perf_counter() - start
        passed = sum(r[0] for r in cold)
        compiles = sorted(r[1] for r in cold)
        cpu = statistics.median(r[3] for r in cold)
        print(f"fast mode, cold cache: {passed}/{len(configs)} passed in {elapsed:.1f} s "
              f"-> {60 * len(configs) / elapsed:.0f} variants verified per minute")
        print(f"compile time per variant: median {statistics.median(compiles):.3f} s, "
              f"p90 {compiles[int(0.9 * (len(compiles) - 1))]:.3f} s (wall clock, includes waiting for a core)")
        print(f"CPU time per verified variant (compile + run + check): median {cpu:.3f} s "
              f"-> {60 / cpu:.0f} variants per minute per otherwise idle core")

        os.environ["KERNSEARCH_CACHE"] = cache
        _track_compiles()
        warm_fast = [_verify(c, "fast")[3] for c in configs]  # objects cached: run + check only
        for c in configs:  # compile the check-mode objects outside the timing
            _verify(c, "check")
        warm_check = [_verify(c, "check")[3] for c in configs]
        f, k = statistics.median(warm_fast), statistics.median(warm_check)
        print(f"CPU time of run + reference check per variant (warm cache): fast {1000 * f:.1f} ms, "
              f"check {1000 * k:.1f} ms (median) -> check-mode slowdown {k / f:.2f}x")
        # Where the kernel dominates (256^3: 64x the work of 64^3), the check-mode slowdown of the run itself.
        big_fast, big_check = [], []
        for mode, sink in (("fast", big_fast), ("check", big_check)):
            for c in configs[:8]:
                big = _run_only(c, mode, "256,256,256")
                if big is not None:
                    sink.append(big)
        if big_fast and big_check:
            bf, bc = statistics.median(big_fast), statistics.median(big_check)
            print(f"kernel run alone at 256x256x256 ({len(big_fast)} variants, CPU time): fast {bf:.2f} s, "
                  f"check {bc:.2f} s (median) -> check-mode slowdown {bc / bf:.1f}x")
        print(f"scheduling cost: {1e9 * _barrier_cost():.0f} ns per thread per threadgroup barrier "
              "(1024 threads, two fiber switches each, wall clock)")
        os.environ["KERNSEARCH_INTERP_UCONTEXT"] = "1"
        print(f"  with the ucontext fallback: {1e9 * _barrier_cost():.0f} ns")
        del os.environ["KERNSEARCH_INTERP_UCONTEXT"]
        print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if passed != len(configs):
        sys.exit(1)


if __name__ == "__main__":
    main()

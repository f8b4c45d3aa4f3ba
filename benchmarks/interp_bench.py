"""Throughput of the Metal-on-CPU interpreter (interpreted evidence: correctness only, not kernel speed).

Prints, for GEMM 64x64x64 float32:
  * variants verified per minute in fast mode, from a cold compile cache (compile + run + reference check),
  * compile time per variant (median, p90),
  * run time per variant with a warm cache, fast vs check mode, and the check-mode slowdown.

    .venv/bin/python benchmarks/interp_bench.py [--variants 40] [--jobs 1]

``--jobs`` verifies that many variants at once (one process each); the figure a search on this machine
sees depends on what else runs on it, so the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor


def _setup():
    from kernsearch._chips import get_chip
    from kernsearch._space import Space, make_problem
    from kernsearch._spec import load_family

    fam = load_family("gemm")
    chip = get_chip("M2 Max")
    problem = make_problem(fam, "64,64,64", "float32", chip)
    return fam, chip, problem, Space(problem, chip)


def _verify(cfg: dict, mode: str) -> tuple[bool, float, float]:
    """(passed, compile seconds, wall seconds) of one verification."""
    from kernsearch._render import geometry, render
    from kernsearch._verify import verify_kernel
    from kernsearch.backends import get_backend

    fam, chip, problem, space = _setup()
    start = time.perf_counter()
    check, diags = verify_kernel(get_backend("cpu"), render(fam, cfg, "float32"), geometry(space, cfg), problem,
                                 mode=mode, chip=chip)
    wall = time.perf_counter() - start
    return check.ok and not [d for d in diags if d.severity == "error"], _last_compile(), wall


_COMPILE_SECONDS: list[float] = []


def _last_compile() -> float:
    return _COMPILE_SECONDS[-1] if _COMPILE_SECONDS else 0.0


def _track_compiles() -> None:
    from kernsearch.interp import _compile, _interp

    original = _compile.compile_unit

    def tracked(cpp: str, mode: str):  # noqa: ANN202
        result = original(cpp, mode)
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
        passed = sum(ok for ok, _, _ in cold)
        compiles = sorted(c for _, c, _ in cold)
        print(f"fast mode, cold cache: {passed}/{len(configs)} passed in {elapsed:.1f} s "
              f"-> {60 * len(configs) / elapsed:.0f} variants verified per minute")
        print(f"compile time per variant: median {statistics.median(compiles):.3f} s, "
              f"p90 {compiles[int(0.9 * (len(compiles) - 1))]:.3f} s")

        os.environ["KERNSEARCH_CACHE"] = cache
        _track_compiles()
        warm_fast = [_verify(c, "fast")[2] for c in configs]  # objects cached: run + check only
        for c in configs:  # compile the check-mode objects outside the timing
            _verify(c, "check")
        warm_check = [_verify(c, "check")[2] for c in configs]
        f, k = statistics.median(warm_fast), statistics.median(warm_check)
        print(f"run + reference check per variant (warm cache): fast {1000 * f:.1f} ms, check {1000 * k:.1f} ms "
              f"(median) -> check-mode slowdown {k / f:.2f}x")
        print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if passed != len(configs):
        sys.exit(1)


if __name__ == "__main__":
    main()

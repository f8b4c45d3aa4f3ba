"""CPU seconds of the steps a `tune` of gemm pays before it searches, and of the README's search itself, for the code
importable as ``kernsearch`` (run it once per checkout to compare two, interleaved: benchmarks/space_speed.txt).

    python benchmarks/space_speed.py      # one JSON line: the minimum of 5 timings a step (a process a round:
                                          # load_family_first is the process's first load)

Steps, gemm at 64x64x64 float32 on the M2 Max model: ``load_family`` (first in the process, then again),
``enumerate`` (the pruned walk of its 2,488,320 configs), ``predict`` (the model's predictions of its 44,004 valid
configs: the auto sampler's prior and the "cannot rank" check), ``valid_set`` (the auto sampler's start over them), and
``tune_cli``: a whole `kernsearch tune gemm --backend model --trials 8` process (its CPU and its children's: the
search's worker, the interpreter's compiles and runs), with a fresh study and a warm compile cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any


def _cpu(fn: Callable[[], Any], repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return round(best, 4)


def _tune_cli(home: str) -> float:
    with tempfile.TemporaryDirectory(dir=home) as tmp:
        env = {**os.environ, "KERNSEARCH_HOME": tmp, "OPENBLAS_NUM_THREADS": "1"}
        before = os.times()
        subprocess.run([sys.executable, "-m", "kernsearch", "tune", "gemm", "--backend", "model", "--chip", "M2 Max",
                        "--shape", "64,64,64", "--dtype", "float32", "--trials", "8"], env=env, check=True,
                       capture_output=True)
        after = os.times()
    return round(after.children_user + after.children_system - before.children_user - before.children_system, 3)


def one_round(home: str) -> dict[str, Any]:
    from kernsearch import get_chip, load_family, make_problem
    from kernsearch.family._space import Space
    from kernsearch.studies._ranking import predict
    from kernsearch.studies._strategy import ValidSetSearch

    start = time.process_time()
    fam = load_family("gemm")
    first = round(time.process_time() - start, 4)
    chip = get_chip("M2 Max")
    problem = make_problem(fam, "64,64,64", "float32", chip)
    valid = Space(problem, chip).enumerate().valid
    space = Space(problem, chip)
    return {
        "kernsearch": os.path.dirname(sys.modules["kernsearch"].__file__ or ""),
        "load_family_first": first,
        "load_family_again": _cpu(lambda: load_family("gemm")),
        "enumerate": _cpu(lambda: Space(problem, chip).enumerate()),
        "predict": _cpu(lambda: predict(Space(problem, chip), valid)),
        "valid_set": _cpu(lambda: ValidSetSearch(space.knobs, valid, seed=0, budget=150)),
        "valid_configs": len(valid),
        "tune_cli": _tune_cli(home),
    }


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as home:
        print(json.dumps(one_round(home)), flush=True)

"""One farm worker process for tests/test_farm.py: a synthetic 10x10 space searched on a shared storage.

``python farm_worker.py URL STUDY TRIALS EVAL_S [HANG_ON_TRIAL]``: each evaluation takes EVAL_S seconds and
writes ``<pid> <config>`` to $FARM_LOG; the process hangs inside its HANG_ON_TRIAL-th evaluation (to be
killed there, mid-trial).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from kernsearch import run_study
from kernsearch.studies._study import Objective, Record


class Synthetic(Objective):
    backend = "model"
    evidence = "modeled"

    def __init__(self, eval_s: float, hang_on: int | None) -> None:
        self.eval_s, self.hang_on, self.done = eval_s, hang_on, 0

    @property
    def knobs(self) -> dict[str, list[Any]]:
        return {"a": list(range(10)), "b": list(range(10))}

    @property
    def study_key(self) -> dict[str, str]:
        return {"family": "synthetic", "chip": "farm", "dtype": "float32", "shape": "10x10", "backend": "model"}

    def violation(self, config: dict[str, Any]) -> str | None:
        return None

    def valid_configs(self) -> list[dict[str, Any]]:
        return [{"a": a, "b": b} for a in range(10) for b in range(10)]

    def evaluate(self, config: dict[str, Any]) -> Record:
        self.done += 1
        with open(os.environ["FARM_LOG"], "a") as log:
            log.write(f"{os.getpid()} a={config['a']},b={config['b']}\n")
        if self.hang_on is not None and self.done >= self.hang_on:
            time.sleep(3600)
        time.sleep(self.eval_s)
        return Record(time_ms=1.0 + (config["a"] - 3) ** 2 + (config["b"] - 6) ** 2, evidence="modeled")


if __name__ == "__main__":
    url, name, trials, eval_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    hang = int(sys.argv[5]) if len(sys.argv) > 5 else None
    result = run_study(Synthetic(eval_s, hang), trials=trials, storage=url, study_name=name, seed=os.getpid())
    print(result.evaluated, result.stop_reason)

"""Compile ahead, time one at a time: the schedule of a pipelined measured search, on a simulated GPU whose
compiles and kernel runs take real time (``benchmarks/simulated_gpu.py``), read back from its event log."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COMPILE_S = 0.6
PROPOSE_S = 0.15


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _overlap(a: dict, b: dict) -> float:
    return max(0.0, min(a["end"], b["end"]) - max(a["start"], b["start"]))


@pytest.mark.slow
def test_compiles_run_ahead_in_parallel_while_one_process_times_one_config_at_a_time(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from kernsearch import get_chip, load_family, make_problem, run_study
    from kernsearch.evaluation._measure import TimingPlan
    from kernsearch.studies._objective import KernelObjective

    events = tmp_path / "events.jsonl"
    chip = get_chip("H100")
    problem = make_problem(load_family("swiglu"), "64,256", "float16", chip)
    options = {"compile_s": COMPILE_S, "kernel_ms": 1.0, "noise": 0.0, "events": str(events),
               "cache_dir": str(tmp_path / "cache"), "family": "swiglu", "shape": "64,256", "dtype": "float16"}
    plan = TimingPlan(warmup=1, min_batch_ms=40.0, min_samples=5, max_samples=5, max_seconds=10.0)
    objective = KernelObjective(problem, chip, "simulated_gpu:SimulatedGPU", compile_workers=3, racing=False,
                                search_plan=plan, backend_options=options, timeout=60.0)
    check = objective.violation

    def slow_proposal(config):  # the sampler and storage's share of a proposal, made slow (0.15 s)
        time.sleep(PROPOSE_S)
        return check(config)

    objective.violation = slow_proposal  # type: ignore[method-assign]
    result = run_study(objective, trials=12, sampler="random", seed=0, storage=":memory:", finalists=2)
    assert result.evaluated == 12 and not result.failures
    log = _events(events)
    timings = sorted((e for e in log if e["kind"] in ("time", "verify")), key=lambda e: e["start"])
    compiles = [e for e in log if e["kind"] == "compile"]
    timers = {e["pid"] for e in timings if e["kind"] == "time"}
    # one process times the trials, one config at a time: no two timings or device checks ever overlap (the
    # final round's fresh worker included)
    assert len(timers) == 1 and len([e for e in timings if e["kind"] == "time"]) == 12
    assert all(b["start"] >= a["end"] for a, b in zip(timings, timings[1:]))
    # every config was compiled ahead in a compile worker, never in the timing process (which only loads)
    assert len(compiles) == 12 and not {e["pid"] for e in compiles} & timers
    assert len({e["pid"] for e in compiles}) > 1
    assert len([e for e in log if e["kind"] == "load" and e["pid"] in timers]) == 12
    # compiles overlap each other and the timing of earlier configs
    assert sum(_overlap(a, b) for i, a in enumerate(compiles) for b in compiles[i + 1:]) > COMPILE_S
    assert sum(_overlap(c, t) for c in compiles for t in timings if t["kind"] == "time") > 2 * COMPILE_S
    # after the first fill of the pipeline the timer never waits for a compiler: each config's compile had
    # ended before the timer finished the config before it (a timing takes ~0.25 s, a compile 0.6 s on 3 workers)
    done = {e["key"]: e["end"] for e in compiles}
    times = [e for e in timings if e["kind"] == "time"]
    waits = [max(0.0, done[b["key"]] - a["end"]) for a, b in zip(times, times[1:])][3:]
    assert sum(waits) < 0.2 * sum(t["end"] - t["start"] for t in times), waits
    # nor for the search loop: proposals (0.15 s each here) are made while the GPU times the config before,
    # so the gap between two timings is the recording of a trial, not a proposal
    gaps = [b["start"] - a["end"] for a, b in zip(times, times[1:])][3:]
    assert sum(gaps) / len(gaps) < 0.6 * PROPOSE_S, gaps  # a synchronous loop: >= PROPOSE_S each

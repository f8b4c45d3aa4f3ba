"""A pytest plugin that records each test's wall and CPU seconds (its process and the children it reaped: CLI
subprocesses, servers stopped by the test, g++) and when it started (epoch seconds: a worker's timeline), one JSON
line a test, for benchmarks/test_suite_time.txt.

On a shared machine wall times follow the load; CPU seconds do not (much). A child still running when the test
ends (a session fixture's server) is counted by the test in whose teardown it is reaped.

    PYTHONPATH=benchmarks CPU_TIMES_OUT=/tmp/cpu.jsonl python -m pytest -p pytest_cpu_times -n 2 ...
    python benchmarks/pytest_cpu_times.py /tmp/cpu.jsonl      # the slowest tests and files by CPU
    python benchmarks/pytest_cpu_times.py --durations /tmp/cpu.jsonl > tests/durations.json   # make test's file order
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    start, wall, cpu = time.time(), time.monotonic(), _cpu()
    yield
    row = {"id": item.nodeid, "wall": round(time.monotonic() - wall, 3), "cpu": round(_cpu() - cpu, 3),
           "start": round(start, 3),
           "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "slow": item.get_closest_marker("slow") is not None}
    with open(os.environ.get("CPU_TIMES_OUT", "cpu_times.jsonl"), "a", encoding="utf-8") as out:
        out.write(json.dumps(row) + "\n")


def _rows(path: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def _per_file(rows: list[dict[str, Any]], figure: str) -> Counter[str]:
    """``figure`` ("cpu" or "wall") summed over each test file's tests."""
    files: Counter[str] = Counter()
    for r in rows:
        files[r["id"].split("::")[0]] += r[figure]
    return files


def summary(path: str, top: int = 30) -> str:
    rows = _rows(path)
    files = _per_file(rows, "cpu")
    lines = [f"{len(rows)} tests, {sum(r['cpu'] for r in rows):.0f} s of CPU, {sum(r['wall'] for r in rows):.0f} s "
             "of wall (summed over workers)", "", "   CPU s   wall s  test"]
    lines += [f"{r['cpu']:8.1f} {r['wall']:8.1f}  {r['id']}" for r in sorted(rows, key=lambda r: -r["cpu"])[:top]]
    lines += ["", "   CPU s  file"] + [f"{cpu:8.1f}  {name}" for name, cpu in files.most_common(top)]
    return "\n".join(lines)


def durations(path: str) -> str:
    """Each test file's seconds of wall (its tests summed), longest first, as JSON: tests/durations.json, the order
    ``make test`` hands its files to the workers in (tests/schedule.py)."""
    files = _per_file(_rows(path), "wall")
    return json.dumps({name: round(wall, 1) for name, wall in files.most_common()}, indent=0)


if __name__ == "__main__":
    print(durations(sys.argv[2]) if sys.argv[1] == "--durations" else summary(sys.argv[1]))

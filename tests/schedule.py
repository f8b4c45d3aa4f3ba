"""The order the suite's test files run in: the longest first (issue 42).

``make test`` hands whole files to its workers (``--dist loadfile``), the next file to the first worker free, in the
order collected. Alphabetical order ended runs on a long file started last (``make tune`` through a pipe, 26 s
alone at the end while the other workers idled: benchmarks/test_suite_time.txt, tenth pass); longest first is the
classic list schedule (LPT) that ends on short files. A whole file stays on one worker: its module fixtures (a
Prefect server, a tuned study) are set up once, as before.

:data:`DURATIONS` holds each file's seconds of wall in a whole ``make test`` (its tests on one worker, three workers
on two cores), written by ``python benchmarks/pytest_cpu_times.py --durations RUN.jsonl``; they only order the
files. A file it does not name (a new one) runs first: its length is unknown, and a long file started early cannot
leave a tail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")


def file_seconds(path: Path = DURATIONS) -> dict[str, float]:
    """The table (test file, relative to the repository, -> seconds); empty where it cannot be read."""
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in table.items() if isinstance(v, (int, float))} if isinstance(table, dict) \
        else {}


def longest_files_first(items: list[pytest.Item], seconds: dict[str, float]) -> None:
    """Reorder ``items`` in place: files the table does not name first, then the others longest first; the tests of
    a file keep their order and stay together (ties keep the collected order)."""
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(item.nodeid.split("::")[0], i)

    def key(name: str) -> tuple[float, int]:
        return (-seconds.get(name, float("inf")), first[name])

    rank = {name: n for n, name in enumerate(sorted(first, key=key))}
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])  # stable: a file's tests keep their order

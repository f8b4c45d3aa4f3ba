"""Flows survive their own death (issue 36): the GPU slot a killed run left taken is freed by the next run, which
names the dead holder; a run waiting for a live holder says what it waits for every few seconds; SIGTERM stops
`flows run` within moments with one line. The Prefect client is a stand-in here (the server's side is Prefect's)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest

from kernsearch.flows import _slot

LIMIT = "kernsearch-gpu-test"


class Client:
    """The two calls of Prefect's client the slot makes; the slot frees itself after ``frees_after`` reads."""

    def __init__(self, active: int, frees_after: int | None = None) -> None:
        self.active, self.reads, self.frees_after, self.freed = active, 0, frees_after, 0

    def read_global_concurrency_limit_by_name(self, name: str) -> Any:
        self.reads += 1
        assert self.reads < 10_000, "the wait never ended"
        if self.frees_after is not None and self.reads > self.frees_after:
            self.active = 0
        return SimpleNamespace(active_slots=self.active, limit=1)

    def update_global_concurrency_limit(self, name: str, update: Any) -> None:
        self.active = update.active_slots
        self.freed += 1


@pytest.fixture(autouse=True)
def _own_home(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNSEARCH_HOME", str(tmp_path / "home"))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def record(pid: int, since: float = 1_700_000_000.0) -> None:
    path = _slot.record_path(LIMIT)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'{{"pid": {pid}, "host": "{socket.gethostname()}", "since": {since}}}')


@pytest.mark.slow
def test_a_slot_left_taken_by_a_dead_run_is_freed_naming_the_dead_holder() -> None:
    pid = dead_pid()
    record(pid)
    client, lines = Client(active=1), []
    _slot.wait_until_free(client, LIMIT, lines.append, sleep=lambda s: None)
    assert client.active == 0 and client.freed == 1
    assert len(lines) == 1 and f"its holder, process {pid} on {socket.gethostname()} since 2023-11-14" in lines[0]
    assert "is dead" in lines[0] and not _slot.record_path(LIMIT).exists()


def test_a_run_waiting_for_a_live_holder_says_who_and_since_when_every_few_seconds() -> None:
    record(os.getpid())
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    client, lines = Client(active=1, frees_after=20), []
    _slot.wait_until_free(client, LIMIT, lines.append, clock=lambda: now[0], sleep=sleep)
    assert client.freed == 0  # a live holder is waited for, never robbed
    assert len(lines) == 4, lines  # at 0, 5, 10 and 15 s of the 20 s
    assert all(f"held by process {os.getpid()}" in line and "waiting for the GPU slot" in line for line in lines)


def test_a_slot_taken_with_no_holder_recorded_is_freed_after_a_lease() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    client, lines = Client(active=1), []
    _slot.wait_until_free(client, LIMIT, lines.append, clock=lambda: now[0], sleep=sleep, lease_s=30)
    assert client.freed == 1 and now[0] >= 30
    assert "no holder recorded" in lines[-1]


@pytest.mark.slow
def test_sigterm_stops_the_run_within_seconds_with_one_line() -> None:
    code = ("import time\nfrom kernsearch.flows._serve import stop_on_sigterm\n"
            "with stop_on_sigterm():\n    print('ready', flush=True)\n    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    started = time.monotonic()
    proc.terminate()
    _, err = proc.communicate(timeout=10)
    assert time.monotonic() - started < 5
    assert proc.returncode == 143
    assert err.strip().count("\n") == 0 and "stopped by SIGTERM" in err and "Traceback" not in err

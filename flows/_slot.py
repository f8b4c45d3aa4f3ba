"""This machine's GPU slot, held so that a run's death never blocks the next run silently.

The slot is a Prefect global concurrency limit of 1 (``kernsearch-gpu-<host>``), taken with a lease Prefect renews
while the run lives. A run killed with its temporary Prefect server (SIGKILL, or a server that went down first) can
leave the slot counted as taken with no lease left to expire. So the holder is recorded beside the studies
(``$KERNSEARCH_HOME/gpu-slots/<limit>.json``: process id, host, since when), and a run that finds the slot taken:

- says every few seconds what it waits for, who holds it and since when;
- frees the slot when the recorded holder is a process of this machine that no longer exists (one line naming
  the dead holder), or when the slot has been taken with no holder recorded for longer than a lease.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kernsearch import _safeio

#: Seconds of the slot's lease (Prefect renews it while the run lives) and between two "waiting" lines.
LEASE_S = 120.0
SAY_EVERY_S = 5.0
POLL_S = 1.0


@dataclass(frozen=True)
class Holder:
    """Who holds the slot: a process of a host, since a time (seconds since the epoch)."""

    pid: int
    host: str
    since: float

    def text(self) -> str:
        when = datetime.fromtimestamp(self.since, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"process {self.pid} on {self.host} since {when}"

    def alive(self) -> bool:
        """Unknown (another host's process) counts as alive."""
        if self.host != socket.gethostname():
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def record_path(limit: str) -> Path:
    from kernsearch.studies._storage import data_home

    return data_home() / "gpu-slots" / f"{limit}.json"


def read_holder(limit: str) -> Holder | None:
    try:
        data = _safeio.read_json(record_path(limit), limit=4096)
        return Holder(int(data["pid"]), str(data["host"])[:200], float(data["since"]))
    except (_safeio.UnsafeFile, OSError, KeyError, TypeError, ValueError):
        return None


def write_holder(limit: str) -> Holder:
    holder = Holder(os.getpid(), socket.gethostname(), time.time())
    path = record_path(limit)
    path.parent.mkdir(parents=True, exist_ok=True)
    import json

    _safeio.write_atomic(path, json.dumps(asdict(holder)))
    return holder


def clear_holder(limit: str, holder: Holder) -> None:
    if read_holder(limit) == holder:
        with contextlib.suppress(OSError):
            record_path(limit).unlink()


def taken(client: Any, limit: str) -> bool:
    found = client.read_global_concurrency_limit_by_name(limit)
    return int(found.active_slots) >= int(found.limit)


def free(client: Any, limit: str) -> None:
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    client.update_global_concurrency_limit(limit, GlobalConcurrencyLimitUpdate(active_slots=0))


def wait_until_free(client: Any, limit: str, say: Callable[[str], None], *, clock: Callable[[], float] = time.time,
                    sleep: Callable[[float], None] = time.sleep, lease_s: float = LEASE_S) -> None:
    """Return once the slot is free (freeing it from a dead holder, said in one line); says what it waits for
    every :data:`SAY_EVERY_S` seconds."""
    started = clock()
    said = -SAY_EVERY_S
    while taken(client, limit):
        holder = read_holder(limit)
        now = clock()
        if holder is not None and not holder.alive():
            free(client, limit)
            say(f"freed the GPU slot {limit}: its holder, {holder.text()}, is dead (killed before it released it)")
            with contextlib.suppress(OSError):
                record_path(limit).unlink()
            continue
        if holder is None and now - started > lease_s:
            free(client, limit)
            say(f"freed the GPU slot {limit}: taken for over {lease_s:g} s with no holder recorded on this machine")
            continue
        if now - said >= SAY_EVERY_S:
            who = holder.text() if holder is not None else "a run with no holder recorded (freed after a lease)"
            say(f"waiting for the GPU slot {limit} ({now - started:.0f} s): held by {who}")
            said = now
        sleep(POLL_S)


@contextlib.contextmanager
def gpu_slot(limit: str, say: Callable[[str], None]) -> Iterator[None]:
    """Hold this machine's GPU slot for the block (module docstring)."""
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency

    with get_client(sync_client=True) as client:
        wait_until_free(client, limit, say)
    with concurrency(limit, occupy=1, strict=True, lease_duration=LEASE_S):
        holder = write_holder(limit)
        try:
            yield
        finally:
            clear_holder(limit, holder)

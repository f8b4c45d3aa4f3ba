"""Calls to a test's Prefect server API that retry what Prefect's own client retries.

Prefect's server answers 503 for errors a client may retry (SQLite busy under load: `prefect.server.api.server.
custom_internal_exception_handler`), and its client retries 408/429/502/503 with back-off. Raw httpx calls in the
tests must do the same, or a loaded CI machine fails them on a busy database (seen: 503 on POST /deployments/).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]

RETRY_CODES = frozenset({408, 429, 502, 503})


def call(method: str, url: str, *, tries: int = 8, **kwargs: Any) -> httpx.Response:
    """One API request; a retryable status is tried again after 0.5, 1, 2, 4, 5... s, then returned as it is."""
    kwargs.setdefault("timeout", 10)
    for attempt in range(tries):
        r = httpx.request(method, url, **kwargs)
        if r.status_code not in RETRY_CODES or attempt == tries - 1:
            return r
        time.sleep(min(0.5 * 2**attempt, 5.0))
    raise AssertionError("unreachable")


def get(url: str, **kwargs: Any) -> httpx.Response:
    return call("GET", url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return call("POST", url, **kwargs)


def migrated_home(home: Path) -> Path:
    """``home`` made a PREFECT_HOME whose SQLite database is already at Prefect's schema: a copy of one database
    migrated once per Prefect version and kept with the suite's compile cache (``$KERNSEARCH_CACHE``, a clean clone
    makes it once), so a test's `prefect server` skips the migrations, about half of its start (~10 s of CPU). The
    server still runs its migrations on start (none are left) and owns its copy."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated_database(), home / "prefect.db")
    return home


def migrated_database() -> Path:
    """The kept database at Prefect's schema (made on first use; copy it, never open it)."""
    import sqlite3

    root = Path(os.environ.get("KERNSEARCH_CACHE") or REPO / ".kernsearch" / "test-cache") / "prefect-db"
    db = root / f"prefect-{version('prefect')}.db"
    if db.is_file():
        return db
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | {
            "PREFECT_HOME": tmp, "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        done = subprocess.run([sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        with sqlite3.connect(Path(tmp) / "prefect.db") as made:  # everything in the one file: a copy is whole
            made.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        made.close()
        os.replace(Path(tmp) / "prefect.db", db)  # whole or absent for a worker that reads it meanwhile
    return db

"""Calls to a test's Prefect server API that retry what Prefect's own client retries.

Prefect's server answers 503 for errors a client may retry (SQLite busy under load: `prefect.server.api.server.
custom_internal_exception_handler`), and its client retries 408/429/502/503 with back-off. Raw httpx calls in the
tests must do the same, or a loaded CI machine fails them on a busy database (seen: 503 on POST /deployments/).
"""

from __future__ import annotations

import time
from typing import Any

import httpx

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

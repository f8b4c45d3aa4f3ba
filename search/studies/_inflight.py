"""The one evaluation in flight: timed in a background thread so the search loop asks the sampler, records
trials and hands the next proposals to the compile workers while the GPU times (never two at once: the
loop starts the next only after this one is recorded).

An objective that evaluates one config at a time (``lookahead() == 1``: the model, replay) needs no
thread: its evaluation runs at once, in the caller's thread, exactly as a plain loop would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class InFlight(Generic[T]):
    """``fn()`` running (in a daemon thread when ``threaded``); :meth:`result` waits and returns its value or
    raises its exception. ``seconds`` is how long ``fn`` ran."""

    def __init__(self, fn: Callable[[], T], threaded: bool) -> None:
        self._fn = fn
        self._value: T | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self.seconds = 0.0
        if threaded:  # daemon: an abandoned evaluation (a second Ctrl-C) never holds up the interpreter's exit
            threading.Thread(target=self._run, name="kernsearch-timing", daemon=True).start()
        else:
            self._run()

    def _run(self) -> None:
        start = time.monotonic()
        try:
            self._value = self._fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by result()
            self._error = exc
        finally:
            self.seconds = time.monotonic() - start
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        """Block until it ends (a Ctrl-C interrupts the wait, not the evaluation)."""
        while not self._done.wait(0.5):
            pass

    def result(self) -> T:
        self.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

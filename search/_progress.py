"""How the CLI shows long steps (:mod:`kernsearch._steps`) while they run.

On a terminal: one rich progress display, a bar per running step (a pulse when it has no total) with its count,
elapsed time and estimate. Through a pipe (a log, CI): whole lines, never redrawn: a step's name once it has run
for :data:`ANNOUNCE_AFTER` seconds, then a line at least every :data:`LINE_EVERY` seconds while a step runs, so
a log never stays quiet long enough to look hung.
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from . import _steps

if TYPE_CHECKING:
    from rich.console import Console

#: Through a pipe, a running step prints its name after this many seconds (quicker steps print nothing)...
ANNOUNCE_AFTER = 1.0
#: ... and a line at least this often while it runs.
LINE_EVERY = 4.0


def seconds(value: float) -> str:
    """``42 s``, ``3 min 5 s``: an estimate a person reads."""
    value = max(0.0, value)
    if value < 90:
        return f"{value:.0f} s"
    minutes, rest = divmod(int(value + 0.5), 60)
    return f"{minutes} min {rest} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def describe(step: _steps.Step) -> str:
    """One line on a running step: what, how far, since when, and what is left (only when it can be known)."""
    count = f": {step.done}/{step.total}" if step.total else (f": {step.done}" if step.done else "")
    left = step.remaining_s
    return f"{step.text}{count} ({seconds(step.elapsed_s)}" + \
        (f", ~{seconds(left)} left)" if left is not None else ")")


class Display:
    """The listener the CLI installs around a command's work (``with Display(err) as display:``)."""

    def __init__(self, console: Console, *, quiet: bool = False) -> None:
        self.console = console
        self.quiet = quiet
        self.live = console.is_terminal
        self._lock = threading.RLock()
        self._last = time.monotonic()
        self._running: list[_steps.Step] = []
        self._announced: set[int] = set()
        self._tasks: dict[int, Any] = {}
        self._progress: Any = None
        self._stack = ExitStack()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # -- the display's life -------------------------------------------------------------------------------
    def __enter__(self) -> Display:
        if self.quiet:
            return self
        if self.live:
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
            from rich.table import Column

            def fixed() -> Column:  # figures are never cut; the texts give way (ellipsis) on a narrow terminal
                return Column(no_wrap=True)

            self._progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}", table_column=Column(ratio=2, no_wrap=True,
                                                                                     overflow="ellipsis")),
                BarColumn(bar_width=16), TextColumn("{task.fields[count]}", table_column=fixed()),
                TimeElapsedColumn(table_column=fixed()), TextColumn("{task.fields[left]}", table_column=fixed()),
                TextColumn("{task.fields[status]}", table_column=Column(ratio=3, no_wrap=True, overflow="ellipsis")),
                console=self.console, transient=False, expand=True)
            self._stack.enter_context(self._progress)
        else:
            self._ticker = threading.Thread(target=self._tick, name="kernsearch-progress", daemon=True)
            self._ticker.start()
        self._stack.enter_context(_steps.listening(self))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2)
        self._stack.close()

    # -- what the command prints --------------------------------------------------------------------------
    def line(self, text: str) -> None:
        """A permanent whole line (above the bars on a terminal), e.g. a trial that set a new best."""
        if self.quiet:
            return
        with self._lock:
            if self._progress is not None:
                self._progress.console.print(text, soft_wrap=True, markup=False, highlight=False)
            else:
                self.console.print(text, soft_wrap=True, markup=False, highlight=False)
            self._last = time.monotonic()
            if self._running:  # a line while a step runs says it runs: no separate announcement
                self._announced.add(id(self._running[-1]))

    def quiet_for(self) -> float:
        """Seconds since the last line (through a pipe)."""
        return time.monotonic() - self._last

    def status(self, step: _steps.Step, status: str) -> None:
        """A terminal bar's trailing text (e.g. the best config so far); through a pipe, nothing."""
        with self._lock:
            if self._progress is not None and id(step) in self._tasks:
                self._progress.update(self._tasks[id(step)], status=status)

    # -- the listener ---------------------------------------------------------------------------------------
    def started(self, step: _steps.Step) -> None:
        with self._lock:
            self._running.append(step)
            if self._progress is not None:
                self._tasks[id(step)] = self._progress.add_task(step.text, total=step.total, count="", left="",
                                                                status="")

    def advanced(self, step: _steps.Step) -> None:
        with self._lock:
            if self._progress is not None and id(step) in self._tasks:
                left = step.remaining_s
                self._progress.update(self._tasks[id(step)], completed=step.done, total=step.total,
                                      count=f"{step.done}/{step.total}" if step.total else str(step.done or ""),
                                      left=f"~{seconds(left)} left" if left is not None else "")

    def ended(self, step: _steps.Step) -> None:
        with self._lock:
            if step in self._running:
                self._running.remove(step)
            self._announced.discard(id(step))
            task = self._tasks.pop(id(step), None)
            if task is not None and self._progress is not None:
                self._progress.remove_task(task)

    # -- through a pipe: the lines that keep a log alive ----------------------------------------------------
    def _tick(self) -> None:
        while not self._stop.wait(0.2):
            with self._lock:
                if not self._running:
                    continue
                step = self._running[-1]
                if id(step) not in self._announced and step.elapsed_s >= ANNOUNCE_AFTER:
                    self._announced.add(id(step))
                    self.line(f"{step.text}…" if step.elapsed_s < 2 else describe(step))
                elif self.quiet_for() >= LINE_EVERY:
                    self.line(describe(step))

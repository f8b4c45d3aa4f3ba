"""Long steps say what they are doing while they run.

Library code wraps each step that can take seconds (enumerating a space, ranking it with the model, verifying
finalists on the interpreter, re-timing them) in :func:`step`, and reports how far it got with
:meth:`Step.advance`. Nothing is printed here: whoever shows progress (the CLI: a progress bar on a terminal,
plain lines through a pipe) registers a :class:`Listener` with :func:`listening`; with none, a step costs a few
attribute writes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class Step:
    """One running step: what it does, and (when it knows) how much of how much is done."""

    text: str
    total: int | None = None
    done: int = 0
    started: float = field(default_factory=time.monotonic)
    parent: Step | None = None
    _left: tuple[float, float] | None = None  # an estimate the step's owner made: (seconds left, when)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def remaining_s(self) -> float | None:
        """The owner's estimate (see :meth:`estimate`), counted down since; else the time left at the rate so
        far; None until some of a known total is done (no guess)."""
        if self._left is not None:
            left, at = self._left
            return max(0.0, left - (time.monotonic() - at))
        if not self.total or self.done <= 0:
            return None
        return self.elapsed_s / self.done * max(0, self.total - self.done)

    def estimate(self, seconds_left: float | None) -> None:
        """The owner knows better than the rate (e.g. a search that stops at its patience): its estimate."""
        self._left = None if seconds_left is None else (seconds_left, time.monotonic())

    def advance(self, done: int) -> None:
        """``done`` of :attr:`total` are finished (listeners are told at most every 0.1 s)."""
        self.done = done
        now = time.monotonic()
        if now - _state.told >= 0.1 or (self.total is not None and done >= self.total):
            _state.told = now
            for listener in list(_state.listeners):
                listener.advanced(self)


class Listener(Protocol):
    """What a progress display implements."""

    def started(self, step: Step) -> None: ...

    def advanced(self, step: Step) -> None: ...

    def ended(self, step: Step) -> None: ...


class _State(threading.local):
    def __init__(self) -> None:
        self.listeners: list[Listener] = []
        self.current: Step | None = None
        self.told = 0.0


_state = _State()


@contextmanager
def step(text: str, total: int | None = None) -> Iterator[Step]:
    """Run the body as a step named ``text`` (of ``total`` units, when known)."""
    s = Step(text, total, parent=_state.current)
    _state.current = s
    for listener in list(_state.listeners):
        listener.started(s)
    try:
        yield s
    finally:
        _state.current = s.parent
        for listener in list(_state.listeners):
            listener.ended(s)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Tell ``listener`` about the steps this thread runs inside the block."""
    _state.listeners.append(listener)
    try:
        yield
    finally:
        _state.listeners.remove(listener)

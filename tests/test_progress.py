"""Issue 24: every long step says what it does while it runs (a rich bar on a terminal, whole lines through a pipe),
with an honest estimate; `make tune`'s own run through a pipe is tests/test_ux.py::test_make_tune_through_a_pipe_...
"""

from __future__ import annotations

import io
import re
import time
from collections import Counter

import pytest
from rich.console import Console

from kernsearch import _progress, _steps
from kernsearch._vocabulary import TrialStatus
from kernsearch.studies._study import _progress as study_progress
from kernsearch.studies._trial import Trial


def _pipe() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=False, width=80, highlight=False), buffer


def test_through_a_pipe_a_long_step_names_itself_then_prints_a_line_every_few_seconds(monkeypatch) -> None:
    monkeypatch.setattr(_progress, "ANNOUNCE_AFTER", 0.2)
    monkeypatch.setattr(_progress, "LINE_EVERY", 0.25)
    console, buffer = _pipe()
    with _progress.Display(console):
        with _steps.step("a quick step"):
            pass  # done before it would be announced: no line
        with _steps.step("ranking 1,000 configs with a long name that does not fit in eighty columns at all",
                         total=1000) as s:
            # work until the display has printed its announcement and two lines after it (a line every 0.25 s:
            # about 0.75 s on an idle machine; the bound only stops a broken display, under any load)
            deadline, i = time.monotonic() + 30, 0
            while len(buffer.getvalue().splitlines()) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
                i = min(i + 10, 990)
                s.advance(i)
    lines = buffer.getvalue().splitlines()
    assert lines and not any("quick" in line for line in lines), lines
    assert lines[0].startswith("ranking 1,000 configs") and lines[0].endswith("…"), lines
    later = lines[1:]
    assert len(later) >= 2, lines  # lines keep coming while the step runs
    assert all(re.fullmatch(r"ranking 1,000 configs .*: \d+/1000 \(\d+ s(, ~\d+ s left)?\)", line) for line in later)
    assert all(len(line) > 80 for line in lines)  # whole lines: never cut at the console's width


def test_a_step_estimates_only_from_what_it_has_done(monkeypatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(_steps.time, "monotonic", lambda: clock[0])
    s = _steps.Step("x", total=10, started=100.0)
    assert s.remaining_s is None  # nothing done: no guess
    clock[0] += 4.0
    s.done = 2
    assert s.remaining_s == pytest.approx(16.0)
    s.estimate(3.0)  # the owner knows better (a search that stops at its patience)
    clock[0] += 1.0
    assert s.remaining_s == pytest.approx(2.0)


def test_the_search_estimate_counts_the_trials_that_can_still_run() -> None:
    """Issue 24: '~2888 s left' 30 s before the end: the estimate divided the set-up into the trials and ignored the
    patience that ends a search early. It is the loop's own pace times the trials left to the budget or, if no new
    best comes, to the patience."""
    known = {f"c{i}": Trial(i, {"x": i}, TrialStatus.OK, value=1.0 if i == 0 else 2.0)
             for i in range(20)}  # best at trial 0, 19 stale
    p = study_progress(known, 150, None, 60.0, Counter(), 0, "", 20, None, pace=0.5, patience=60)
    assert p.remaining_s == pytest.approx((60 - 19) * 0.5)
    p = study_progress(known, 25, None, 60.0, Counter(), 0, "", 20, None, pace=0.5, patience=60)
    assert p.remaining_s == pytest.approx(5 * 0.5)  # the budget first
    p = study_progress(known, None, 10.0, 8.0, Counter(), 0, "", 20, None, pace=0.5, patience=None)
    assert p.remaining_s == pytest.approx(2.0)  # a time budget: what is left of it


def test_on_a_terminal_a_step_is_a_bar_with_its_count() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120)
    with _progress.Display(console):
        with _steps.step("enumerating the configs", total=4) as s:
            for i in range(1, 5):
                s.advance(i)
                time.sleep(0.12)
    text = buffer.getvalue()
    assert "enumerating the configs" in text and "4/4" in text


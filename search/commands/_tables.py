"""The tables and verdict lines of a search's result, as ``tune`` prints them at the end and ``show`` prints them
from the stored study."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from .._rules import modes_text
from .._vocabulary import Evidence, Verifier
from ._app import (
    _fmt,
    _wide,
)

if TYPE_CHECKING:
    from ..studies._final import FinalistCheck, FinalRound
    from ..studies._study import TrialSummary


def _top_table(rows: list[TrialSummary], evidence: str, winner: int | None, final: FinalRound | None = None,
               title: str = "top configs") -> Any:
    from ..family._space import format_config

    checks = final.checks if final is not None else {}

    label = "time (predicted)" if evidence == Evidence.MODELED else "time"
    if _wide().width < 120:  # a narrow terminal: one block per config, the config wrapped between knobs
        from rich.console import Group
        from rich.padding import Padding
        from rich.text import Text

        blocks: list[Any] = [Text(title, style="italic")]
        for i, t in enumerate(rows, 1):
            err = _max_err(t, checks.get(t.number))
            blocks.append(Text(f"{i}{' *' if t.number == winner else ''}  trial {t.number}  {label} {t.time_ms:.4g} ms"
                               f"  spread {f'{t.spread:.1%}' if t.spread else '-'}  {_fmt(t.gflops, '.0f')} GFLOP/s"
                               f"  max err {_fmt(err, '.2g')}  {t.evidence}  verified: "
                               f"{_verified(t, final)}"))
            blocks.append(Padding(Text(format_config(t.config).replace(",", ", ")), (0, 0, 0, 4)))
        return Group(*blocks)
    table = Table("#", "trial", "config", f"{label} ms", "spread", "GFLOP/s", "% roofline", "max err",
                  "evidence", "verified", title=title, title_justify="left", box=None)
    for i, column in enumerate(table.columns):  # only the config wraps, and only between knobs
        column.no_wrap = i != 2
    table.columns[2].ratio = 1
    for i, t in enumerate(rows, 1):
        mark = " *" if t.number == winner else ""
        err = _max_err(t, checks.get(t.number))
        table.add_row(f"{i}{mark}", str(t.number), format_config(t.config).replace(",", ", "), f"{t.time_ms:.4g}",
                      f"{t.spread:.1%}" if t.spread else "-", _fmt(t.gflops, ".0f"), _fmt(t.peak_pct, ".1f"),
                      _fmt(err, ".2g"), t.evidence, _verified(t, final))
    return table


def _max_err(t: TrialSummary, check: FinalistCheck | None) -> float | None:
    """A row's error: the final round's interpreter check when it passed one, else the trial's own."""
    return check.max_abs_err if check is not None and check.max_abs_err is not None else t.max_abs_err


def _verified(t: TrialSummary, final: FinalRound | None) -> str:
    """Where a row was proven correct: in the final round (interpreter, or device at a ragged shape), else
    per trial."""
    return (final.verdict(t.number) if final is not None else None) or t.verified or "-"


def _finalist_line(number: int, check: FinalistCheck, final: FinalRound) -> str:
    """One finalist's verification: pass with its error, or FAIL with the reason and the detail's first line; the
    extra shapes the winner was also checked at."""
    detail = f": {escape(check.detail.splitlines()[0][:300])}" if check.detail else ""
    state = f"[green]pass[/] (max abs err {_fmt(check.max_abs_err, '.2g')})" if check.ok else \
        f"[red]FAIL ({check.reason})[/]{detail}"
    also = ""
    if check.also:
        sampled = check.threadgroups_checked
        also = " and " + ", ".join(check.also) + (f" ({sampled} threadgroups sampled at the tuned shape)"
                                                  if sampled else "")
    shape = check.shape or final.verify_shape or ()  # each finalist at the smallest shape valid for it
    return (f"trial {number} on the {final.verified_on or Verifier.INTERPRETER} at {'x'.join(map(str, shape))}"
            f"{escape(also)}: {state}")


def _final_lines(final: FinalRound | None, evidence: str) -> list[str]:
    lines: list[str] = []
    f = final.figures if final is not None else None
    if final is not None and f is not None and f.speedup is not None:
        beats = "" if final.beats_baseline else " [yellow](lead within the measured noise)[/]"
        spread = "" if f.modes else \
            f"range {_fmt(f.speedup_low, '.2f')}-{_fmt(f.speedup_high, '.2f')}; "
        lines.append(f"speedup over the baseline op: {f.speedup:.2f}x ({spread}baseline "
                     f"{_fmt(f.baseline_median_ms, '.4g')} ms){beats}")
        if f.modes:
            lines.append(f"as consumers call it: {modes_text(f.consumer(), tuple(f.consumer()))}")
    elif evidence == Evidence.MODELED:
        lines.append("speedup over the baseline op: not available (modeled times; the baseline is not modeled)")
    if final is None:
        return lines
    if final.lead_exceeds_noise is False:
        lines.append("[yellow]the winner's lead over the runner-up is within the measured noise[/]")
    lines += [_finalist_line(number, check, final) for number, check in final.checks.items()]
    if final.note:
        lines.append(final.note)
    return lines


"""A study as one self-contained HTML page: convergence, importances, per-knob effects, the leaders and the
winner's speedup, each figure labelled with its evidence kind. Plotly's JavaScript is inlined once, so the
file opens offline and can be attached to a Prefect run or mailed as is.

Every text that comes from the storage (names, configs, reasons) is escaped: a study may be hostile.
"""

from __future__ import annotations

import html
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._rules import modes_text
from .._vocabulary import Evidence
from ..artifacts._manifest import MODELED_POLICY
from ._history import StudyHistory, TrialPoint

if TYPE_CHECKING:
    from ._trial import Trial

# Evidence kinds never mix: each has its own colour and words on every figure.
EVIDENCE_STYLE = {
    Evidence.MEASURED.value: ("#1b7f3b", "MEASURED on a real GPU"),
    f"{Evidence.MEASURED}, replayed": ("#7a4fb0", "MEASURED, REPLAYED (recorded on another GPU, not here)"),
    Evidence.MODELED.value: ("#b35900", "MODELED (predicted by the performance model, not measured)"),
    Evidence.INTERPRETED.value: ("#3559a8", "INTERPRETED (correctness only, no times)"),
}


def evidence_badge(evidence: str) -> tuple[str, str]:
    return EVIDENCE_STYLE.get(evidence, ("#666666", f"{evidence.upper()} evidence"))


def default_report_path(study_name: str) -> Path:
    from ._storage import data_home

    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", study_name).strip("-.") or "study"
    return data_home() / "reports" / f"{slug[:150]}.html"


def _figure_base(title: str, evidence: str) -> Any:
    import plotly.graph_objects as go

    colour, words = evidence_badge(evidence)
    fig = go.Figure()
    fig.update_layout(title={"text": f"{html.escape(title)}<br><sup style='color:{colour}'>{words}</sup>"},
                      template="plotly_white", height=420, margin={"t": 80, "l": 70, "r": 30, "b": 60},
                      legend={"orientation": "h", "y": -0.2})
    fig.add_annotation(text=words.split(" (")[0], xref="paper", yref="paper", x=1, y=1.12, showarrow=False,
                       font={"color": "white", "size": 11}, bgcolor=colour, borderpad=3)
    return fig


def _time_axis(evidence: str) -> str:
    return "predicted time (ms)" if evidence == Evidence.MODELED else "time (ms)"


def _config_text(config: dict[str, Any]) -> str:
    return html.escape(",".join(f"{k}={v}" for k, v in config.items()))


def _config_cell(config: dict[str, Any]) -> str:
    """``K=V,K=V`` breakable only between knobs (``<wbr>``): a long config wraps in its table cell instead of
    pushing the table's last columns (evidence, verified) off the page."""
    return ",<wbr>".join(html.escape(f"{k}={v}") for k, v in config.items())


def _best_so_far(ok: list[TrialPoint]) -> tuple[list[int], list[float]]:
    """The convergence line: after each timed trial (in trial order), the best time so far."""
    best: float | None = None
    xs: list[int] = []
    ys: list[float] = []
    for t in sorted(ok, key=lambda t: t.number):
        assert t.time_ms is not None  # ok holds the timed trials
        if best is None or t.time_ms < best:
            best = t.time_ms
        xs.append(t.number)
        ys.append(best)
    return xs, ys


def _add_failures(fig: Any, h: StudyHistory, ok: list[TrialPoint]) -> None:
    """The failed trials, one trace a failure reason (most common first), drawn above the slowest timed one."""
    import plotly.graph_objects as go

    failed = [t for t in h.trials if t.time_ms is None]
    top = max((t.time_ms for t in ok if t.time_ms is not None), default=1.0)
    symbols = ["x", "triangle-up", "square", "diamond", "cross", "star"]
    for i, (reason, _) in enumerate(h.failures.most_common()):
        ts = [t for t in failed if (t.reason or "?") == reason]
        fig.add_trace(go.Scatter(x=[t.number for t in ts], y=[top * 1.15] * len(ts), mode="markers",
                                 name=f"failed: {html.escape(reason)} ({len(ts)})",
                                 marker={"symbol": symbols[i % len(symbols)], "size": 9, "color": "#888"},
                                 text=[_config_text(t.config) for t in ts],
                                 hovertemplate=f"trial %{{x}} failed ({html.escape(reason)})<br>%{{text}}"))


def convergence_figure(h: StudyHistory) -> Any:
    import plotly.graph_objects as go

    fig = _figure_base("Convergence: every trial and the best so far", h.evidence)
    ok = [t for t in h.trials if t.time_ms is not None]
    fig.add_trace(go.Scatter(x=[t.number for t in ok], y=[t.time_ms for t in ok], mode="markers", name="trial",
                             marker={"color": "#4c78a8", "size": 6, "opacity": 0.7},
                             text=[_config_text(t.config) for t in ok],
                             hovertemplate="trial %{x}: %{y:.4g} ms<br>%{text}"))
    xs, ys = _best_so_far(ok)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"shape": "hv", "color": "#e45756", "width": 2},
                             name="best so far"))
    _add_failures(fig, h, ok)
    fig.update_xaxes(title="trial")
    fig.update_yaxes(title=_time_axis(h.evidence), type="log")
    return fig


def importance_figure(h: StudyHistory) -> Any:
    import plotly.graph_objects as go

    fig = _figure_base("Which knobs matter: parameter importances", h.evidence)
    items = sorted(h.importances.items(), key=lambda kv: kv[1])
    fig.add_trace(go.Bar(x=[v for _, v in items], y=[html.escape(k) for k, _ in items], orientation="h",
                         marker={"color": "#4c78a8"}, name="importance"))
    fig.update_xaxes(title=f"importance ({html.escape(h.importance_note)})")
    fig.update_layout(height=max(300, 60 + 28 * len(items)))
    return fig


def knob_figure(h: StudyHistory, knob: str) -> Any:
    import plotly.graph_objects as go

    fig = _figure_base(f"Effect of {knob}: time per value", h.evidence)
    ok = [t for t in h.trials if t.time_ms is not None and knob in t.config]
    order = [v for v in h.knobs.get(knob, []) if any(t.config[knob] == v for t in ok)]
    order += sorted({str(t.config[knob]) for t in ok} - {str(v) for v in order})
    for value in order:
        ys = [t.time_ms for t in ok if str(t.config[knob]) == str(value)]
        fig.add_trace(go.Box(y=ys, name=html.escape(str(value)), boxpoints="all", jitter=0.4, pointpos=0,
                             marker={"size": 4}, showlegend=False))
    fig.update_xaxes(title=html.escape(knob), type="category")
    fig.update_yaxes(title=_time_axis(h.evidence), type="log")
    fig.update_layout(height=360)
    return fig


def speedup_figure(h: StudyHistory) -> Any | None:
    """The winner against the baseline op with the measured range; None when there is no measured speedup."""
    import plotly.graph_objects as go

    f = h.final.figures if h.final is not None else None
    if f is None or f.speedup is None:
        return None
    fig = _figure_base("Winner's speedup over the baseline op (with its measured range)", h.evidence)
    s = f.speedup
    low = f.speedup_low if f.speedup_low is not None else s
    high = f.speedup_high if f.speedup_high is not None else s
    fig.add_trace(go.Bar(x=["baseline op", "winner"], y=[1.0, s], marker={"color": ["#999", "#1b7f3b"]},
                         error_y={"type": "data", "array": [0, high - s], "arrayminus": [0, s - low]},
                         text=["1.00x", f"{s:.2f}x ({low:.2f}-{high:.2f})"], textposition="outside"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#555")
    fig.update_yaxes(title="speedup (x the baseline)")
    fig.update_layout(height=360)
    return fig


def _table(h: StudyHistory) -> str:
    final = h.final
    winner = final.winner if final is not None else h.top[0].number if h.top else None
    rows = []
    for i, t in enumerate(h.top, 1):
        verified = (final.verdict(t.number) if final is not None else None) or t.verified or "-"
        rows.append("<tr{}><td>{}</td><td>{}</td><td class='config'><code>{}</code></td><td>{:.4g}</td><td>{}</td>"
                    "<td>{}</td><td>{}</td><td>{}</td></tr>".format(
                        ' class="winner"' if t.number == winner else "", i, t.number, _config_cell(t.config),
                        t.time_ms, f"{t.spread:.1%}" if t.spread else "-",
                        "-" if t.gflops is None else f"{t.gflops:.0f}", html.escape(t.evidence or h.evidence),
                        html.escape(str(verified))))
    label = "predicted ms" if h.evidence == Evidence.MODELED else "ms"
    return (f"<table><thead><tr><th>#</th><th>trial</th><th>config</th><th>{label}</th><th>spread</th>"
            f"<th>GFLOP/s</th><th>evidence</th><th>verified</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _speedup_lines(h: StudyHistory, best: Trial | None) -> list[str]:
    """The summary's speedup: measured against the baseline op (and per consumer mode), or why there is none
    (modeled times; a study that did not time the baseline); nothing for interpreted evidence or no winner."""
    final = h.final
    lines: list[str] = []
    f = final.figures if final is not None else None
    if final is not None and f is not None and f.speedup is not None:
        beats = final.beats_baseline
        spread = "" if f.modes else f"range {f.speedup_low or 0:.2f}-{f.speedup_high or 0:.2f}; "
        lines.append(f"<p>Speedup over the baseline op: {f.speedup:.2f}x "
                     f"({spread}baseline {f.baseline_median_ms or 0:.4g} ms)"
                     + ("" if beats else " — <b>within the measured noise: not a win, the MLX op runs</b>") + "</p>")
        if f.modes:  # every consumer mode timed; the family's declared ones judged (docs/timing.md)
            figures = f.consumer()
            lines.append(f"<p>As consumers call it: {html.escape(modes_text(figures, list(figures)))} "
                         "(graph: a chain of dependent calls, as a decode step runs)</p>")
    elif h.evidence == Evidence.MODELED:
        lines.append("<p>Speedup over the baseline op: not available (modeled times; the baseline is not modeled): "
                     f"{html.escape(MODELED_POLICY)}.</p>")
    elif h.evidence != Evidence.INTERPRETED and best is not None:
        lines.append("<p>Speedup over the baseline op: not measured in this study.</p>")
    return lines


def _summary(h: StudyHistory) -> str:
    a, final = h.attrs, h.final
    colour, words = evidence_badge(h.evidence)
    ok = sum(1 for t in h.trials if t.time_ms is not None)
    fails = ", ".join(f"{html.escape(k)} {v}" for k, v in h.failures.most_common()) or "none"
    lines = [f"<p class='badge' style='background:{colour}'>{html.escape(words)}</p>",
             "<p>{} {} {} on {} · {} back-end</p>".format(*(html.escape(str(a.get(k, "?"))) for k in
                                                             ("family", "shape", "dtype", "chip", "backend"))),
             (f"<p>{len(h.trials)} configs evaluated ({ok} ok, {len(h.trials) - ok} failed: {fails}); "
             f"{h.invalid} proposals rejected by constraints before compiling; {h.known} repeats of known configs "
             "answered from the study</p>")]
    if a.get("cannot_rank"):
        lines.append(f"<p class='warn'>{html.escape(str(a['cannot_rank']))}</p>")
    winner = final.winner if final is not None else h.top[0].number if h.top else None
    best = next((t for t in h.top if t.number == winner), None)
    if best is None:
        lines.append("<p class='warn'>No correct variant: nothing wins; the MLX op runs.</p>")
    else:
        lines.append(f"<p>Winner: trial {best.number} <code>{_config_text(best.config)}</code> "
                     f"{best.time_ms:.4g} ms ({html.escape(h.evidence)})</p>")
    lines += _speedup_lines(h, best)
    if final is not None and final.note:
        lines.append(f"<p>{html.escape(final.note)}</p>")
    return "\n".join(lines)


CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:2em}.badge{color:#fff;display:inline-block;padding:.2em .6em;
border-radius:4px;font-weight:bold}.warn{color:#a00;font-weight:bold}table{border-collapse:collapse;font-size:.9em}
td,th{border-bottom:1px solid #ddd;padding:.3em .6em;text-align:left;white-space:nowrap}tr.winner{background:#eef7ee}
td.config{white-space:normal}
.figure{margin:1em 0}.note{color:#666}code{font-size:.95em}"""


def render_report(h: StudyHistory) -> str:
    """The whole page as one string."""
    from plotly.offline import get_plotlyjs

    evaluated = any(t.time_ms is not None for t in h.trials)
    figures: list[tuple[str, Any]] = []
    if h.trials:
        figures.append(("Convergence", convergence_figure(h)))
    if h.importances:
        figures.append(("Parameter importances", importance_figure(h)))
    speed = speedup_figure(h)
    if speed is not None:
        figures.append(("Speedup", speed))
    ranked = sorted(h.importances, key=lambda k: -h.importances[k]) or list(h.knobs)
    knob_figs = [(f"Knob {k}", knob_figure(h, k)) for k in ranked] if evaluated else []
    parts = [] if h.trials else ["<p class='warn'>This study has no evaluated trial yet.</p>"]
    if h.importance_note and not h.importances and h.trials:
        parts.append(f"<p class='note'>Parameter importances: {html.escape(h.importance_note)}</p>")
    for i, (title, fig) in enumerate(figures + knob_figs):
        if i == len(figures):
            parts.append(f"<h2>Top configs</h2>{_table(h)}<h2>Per-knob effects</h2>")
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig{i}",
                          config={"displaylogo": False, "responsive": True})
        parts.append(f"<div class='figure' data-title='{html.escape(title)}'>{div}</div>")
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    title = html.escape(h.name)
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>kernsearch report: {title}</title>"
            f"<style>{CSS}</style><script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
            f"<h1>kernsearch study report: {title}</h1>{_summary(h)}{''.join(parts)}"
            f"<p class='note'>Made by kernsearch at {when}. Every figure names its evidence kind: measured, "
            f"modeled, interpreted or replayed results are never mixed.</p></body></html>")


def write_report(study_name: str, storage: str | None = None, out: str | Path | None = None,
                 history: StudyHistory | None = None) -> Path:
    """Render the study's report to ``out`` (default: under the data folder); returns the path written.
    ``history``: the study already loaded (the CLI loads it, and checks ``out``, before it shows progress)."""
    from .._errors import KernsearchError
    from ._history import load_history

    h = history if history is not None else load_history(study_name, storage)
    path = report_path(study_name, out)
    from .._safeio import UnsafeFile, write_atomic

    try:
        if not os.path.lexists(path.parent):
            path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, render_report(h))
    except UnsafeFile as exc:
        raise KernsearchError(f"cannot write the report: {exc}") from None
    except OSError as exc:
        raise KernsearchError(f"cannot write the report to {str(path)[:200]!r}: {exc.strerror or exc}") from None
    return path


def report_path(study_name: str, out: str | Path | None = None) -> Path:
    """Where the report goes, refused (one :class:`KernsearchError`) where no report can be written."""
    from .._errors import KernsearchError
    from .._safeio import UnsafeFile, check_replaceable

    path = Path(out) if out is not None else default_report_path(study_name)
    if "\x00" in str(path):
        raise KernsearchError(f"cannot write the report to {str(path)[:200]!r}: a NUL byte in the name")
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            raise KernsearchError(f"--out {path} is a folder: give a file name, e.g. {path / 'report.html'}")
        check_replaceable(path)  # before the page is rendered
    except UnsafeFile as exc:
        raise KernsearchError(f"cannot write the report: {exc}") from None
    except OSError as exc:
        raise KernsearchError(f"cannot write the report to {str(path)[:200]!r}: {exc.strerror or exc}") from None
    return path

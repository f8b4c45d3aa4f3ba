"""``studies``, ``show``, ``report``, ``dashboard``: the stored studies, listed, shown, reported and browsed."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.table import Table

from .._console import err, out
from .._errors import KernsearchError
from .._vocabulary import TrialStatus
from ._app import (
    StorageOpt,
    _evidence_label,
    _fmt,
    _wide,
    app,
)
from ._tables import _final_lines, _top_table

if TYPE_CHECKING:
    pass


@app.command()
def studies(storage: str | None = StorageOpt) -> None:
    """List the stored studies: name, configs evaluated (as `tune` counts), best time and its evidence kind."""
    import optuna

    from ..studies._storage import check_storage
    from ..studies._study import EVALUATED

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    summaries = optuna.get_all_study_summaries(check_storage(storage))
    if not summaries:
        out.print("no studies stored yet (run `kernsearch tune FAMILY`)")
        return
    store = check_storage(storage)
    table = Table("study", "configs", "best ms", "evidence", "started", box=None)
    table.columns[0].no_wrap = True
    for s in sorted(summaries, key=lambda s: s.study_name):
        best = s.best_trial.value if s.best_trial is not None else None
        started = s.datetime_start.strftime("%Y-%m-%d %H:%M") if s.datetime_start else "-"
        trials = optuna.load_study(study_name=s.study_name, storage=store).get_trials(deepcopy=False)
        evaluated = sum(t.user_attrs.get("status") in EVALUATED for t in trials)  # as `tune` counts
        table.add_row(s.study_name, str(evaluated), _fmt(best, ".4g"),
                      _evidence_label(str(s.user_attrs.get("evidence", "?")), s.user_attrs.get("backend")),
                      started)
    _wide().print(table)


@app.command()
def show(study: str = typer.Argument(..., help="study name (see `kernsearch studies`)"),
         storage: str | None = StorageOpt, top: int = typer.Option(10, "--top", help="rows of the table"),
         as_json: bool = typer.Option(False, "--json", help="machine-readable output")) -> None:
    """One study: what it tuned, trials by outcome, failures by reason, the top configs and the winner."""
    import json
    from collections import Counter

    import optuna

    from .. import _options
    from ..studies._storage import check_storage
    from ..studies._study import _top

    _options.check(_options.Rows, top, "--top")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    store = check_storage(storage)
    names = [s.study_name for s in optuna.get_all_study_summaries(store)]
    if study not in names:
        raise KernsearchError(f"no study {study!r} in this storage (see `kernsearch studies`)")
    s = optuna.load_study(study_name=study, storage=store)
    trials = s.get_trials(deepcopy=False)
    status = Counter(str(t.user_attrs.get("status", TrialStatus.RUNNING)) for t in trials)
    reasons = Counter(t.user_attrs.get("failure", {}).get("reason", "?") for t in trials
                      if t.user_attrs.get("status") == TrialStatus.FAILED)
    rows = _top(s, top)
    attrs = s.user_attrs
    from ..studies._final import FinalRound

    final = FinalRound.from_dict(attrs.get("final"))
    if as_json:
        from dataclasses import asdict

        sys.stdout.write(json.dumps({"study": study, **attrs, "status": dict(status), "failures": dict(reasons),
                                     "top": [asdict(r) for r in rows]}, indent=2, default=str) + "\n")
        return
    evidence = str(attrs.get("evidence", "?"))
    out.print(f"[bold]{study}[/]: {attrs.get('family')} {attrs.get('shape')} {attrs.get('dtype')} on "
              f"{attrs.get('chip')} ({attrs.get('backend')} back-end, "
              f"{_evidence_label(evidence, attrs.get('backend'))})", soft_wrap=True)
    out.print(_trial_counts(status, reasons), soft_wrap=True)
    if attrs.get("cannot_rank"):
        out.print(f"[yellow]{escape(str(attrs['cannot_rank']))}[/]", soft_wrap=True)
    if rows:
        _wide().print(_top_table(rows, evidence, final.winner if final is not None else None, final))
    for line in _final_lines(final, evidence):
        out.print(line, soft_wrap=True)


def _trial_counts(status: Any, reasons: Any) -> str:
    """Counted as `tune` counts: configs evaluated (ok + failed); proposals that ran nothing said apart."""
    ok, failed = status.get(TrialStatus.OK, 0), status.get(TrialStatus.FAILED, 0)
    text = f"configs evaluated: {ok + failed} ({ok} ok, {failed} failed"
    text += (": " + ", ".join(f"{k} {v}" for k, v in reasons.most_common()) + ")") if reasons else ")"
    notrun = []
    if status.get(TrialStatus.KNOWN):
        notrun.append(f"{status[TrialStatus.KNOWN]} repeats of evaluated configs (answered from the study, not run "
                      "again)")
    if status.get(TrialStatus.INVALID):
        notrun.append(f"{status[TrialStatus.INVALID]} invalid (rejected by a constraint before compiling)")
    others = [f"{k} {v}" for k, v in status.most_common()
              if k not in (TrialStatus.OK, TrialStatus.FAILED, TrialStatus.KNOWN, TrialStatus.INVALID)]
    if notrun:
        text += " · proposals not run: " + ", ".join(notrun)
    if others:
        text += " · other trials: " + ", ".join(others)
    return text


@app.command("report")
def report_cmd(study: str = typer.Argument(..., help="study name (see `kernsearch studies`)"),
               storage: str | None = StorageOpt,
               out_file: str | None = typer.Option(None, "--out", "-o", help="HTML file to write (default: "
                                                      "reports/<study>.html under $KERNSEARCH_HOME or ~/.kernsearch)")
               ) -> None:
    """Write one study as a self-contained HTML page with plots (opens offline) and print its path."""
    from .._progress import Display
    from .._steps import step
    from ..studies._history import load_history
    from ..studies._report import report_path, write_report

    history = load_history(study, storage)  # a bad study, storage or --out is one line, before any progress
    report_path(study, out_file)
    with Display(err), step(f"writing the report of {study}"):
        path = write_report(study, storage, out_file, history=history)
    out.print(str(path), soft_wrap=True, markup=False)


@app.command()
def dashboard(storage: str | None = StorageOpt,
              host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
              port: int = typer.Option(8080, "--port", min=1, max=65535, help="port to listen on")) -> None:
    """Browse the stored studies in optuna-dashboard (history, importances, trials' attributes); Ctrl-C stops."""
    from ..studies._storage import default_storage, make_storage, redact

    try:
        from optuna_dashboard import run_server  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        raise KernsearchError("optuna-dashboard is not installed: pip install optuna-dashboard") from None
    import os
    import signal

    def stop(signum: int, frame: Any) -> None:  # SIGTERM (a service manager, kill): stop at once
        # (an exception raised here mid-request is swallowed by wsgiref's handler and the server goes on);
        # the dashboard only reads and answers: nothing is left half-written.
        os._exit(0)

    store = make_storage(storage)
    _check_listen(host, port)  # before the banner: a bad address is one line, not the server's start-up and then it
    signal.signal(signal.SIGTERM, stop)
    err.print(f"optuna-dashboard on {redact(storage or default_storage())}: open http://{host}:{port}/ (Ctrl-C stops)",
              soft_wrap=True, markup=False)
    try:
        run_server(store, host=host, port=port)
    except OSError as exc:
        raise KernsearchError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    except KeyboardInterrupt:
        pass


def _check_listen(host: str, port: int) -> None:
    """One line if ``host:port`` cannot be listened on (unknown name, foreign address, port taken)."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will
            probe.bind(address)
    except (OSError, ValueError, UnicodeError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise KernsearchError(f"cannot listen on {host}:{port}: {detail}") from None


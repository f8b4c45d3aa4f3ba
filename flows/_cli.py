"""``kernsearch flows serve|run``: the Typer sub-app (Prefect is imported only when a command runs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from kernsearch._errors import not_empty

if TYPE_CHECKING:
    from ._report import NightlyReport

app = typer.Typer(no_args_is_help=True, help="Nightly search flows (Prefect): serve the schedule or run once now.")

JobFileArg = typer.Argument(..., help="job file (.toml or .yaml): families, shapes, dtypes, chips, budgets")
ChipOpt = typer.Option(None, "--chip", help="the chip whose jobs run here (default: detected; name one to run "
                                            "modeled searches for it on a machine without that GPU)",
                       callback=not_empty)


@app.command()
def serve(job_file: str = JobFileArg, chip: str | None = ChipOpt,
          cron: str = typer.Option("0 2 * * *", "--cron", help="when the nightly run starts (cron syntax)"),
          timezone: str | None = typer.Option(None, "--timezone", help="IANA time zone of --cron (default: UTC)"),
          name: str | None = typer.Option(None, "--name", help="deployment name (default: nightly-<chip>)")) -> None:
    """Serve this machine's nightly deployment on a cron schedule until interrupted."""
    from ._serve import serve as serve_deployment

    serve_deployment(job_file, chip=chip, cron=cron, timezone=timezone, name=name)


@app.command()
def deploy(job_file: str = JobFileArg,
           chips: list[str] | None = typer.Option(None, "--chip", help="deploy for this chip only (repeatable; "
                                                                          "default: every chip of the job file)",
                                                  callback=not_empty),
           cron: str = typer.Option("0 2 * * *", "--cron", help="when the nightly run starts (cron syntax)"),
           timezone: str | None = typer.Option(None, "--timezone", help="IANA time zone of --cron (default: UTC)")
           ) -> None:
    """Register a deployment per chip in work pool kernsearch-<chip>; run one worker per machine on its pool."""
    from kernsearch._console import out

    from ._serve import deploy as deploy_chips

    for deployment, pool in deploy_chips(job_file, chips=chips, cron=cron, timezone=timezone):
        out.print(f"{deployment}  →  work pool {pool}   (on each such machine: prefect worker start --pool {pool})",
                  soft_wrap=True)


@app.command()
def run(job_file: str = JobFileArg, chip: str | None = ChipOpt) -> None:
    """Run the nightly flow once, now, without a schedule; exit 1 if a job or the export failed."""
    from ._report import ExportStatus
    from ._serve import run_once

    report = run_once(job_file, chip=chip)
    print_report(report)
    if report.failed or report.export.status == ExportStatus.FAILED:
        raise typer.Exit(1)


def print_report(report: NightlyReport) -> None:
    from rich.table import Table

    from kernsearch._console import out
    from kernsearch._vocabulary import Evidence

    table = Table("job", "problem", "old ms", "new ms", "speedup", "outcome", "evidence", box=None)
    for r in report.jobs:
        table.add_row(r.job, r.problem, _ms(r.old_ms) + (f" ({r.old_version})" if r.old_version else ""),
                      _ms(r.new_ms), f"{r.speedup:.3f}x" if r.speedup else "-", r.verdict, f"{r.evidence or '-'}")
    out.print(f"[bold]kernsearch nightly on {report.chip}[/]: {report.totals}")
    out.print(table)
    for r in report.jobs:  # reasons are long: one line each, below the table
        out.print(f"  {r.job} ({r.dtype} {r.shape}): {r.outcome}: {r.reason}", soft_wrap=True)
        if r.report:
            out.print(f"    report: {r.report}", soft_wrap=True, markup=False)
    export = report.export
    out.print(f"export: {export.status}" + (f" ({export.reason})" if export.reason else "")
              + (f": {export.wheel}" if export.wheel else ""), soft_wrap=True)
    if any(r.evidence == Evidence.MODELED for r in report.jobs):
        out.print("[dim]modeled times are predictions of the performance model, not measurements[/]")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"

"""The nightly search flow: tune → verify → publish every job for this machine's chip, then export.

Importing this module imports Prefect (over a second); only ``kernsearch flows ...`` does.

Each step is a Prefect task. ``tune`` and ``verify`` run kernels, so they run in a killable subprocess
(:mod:`kernsearch.flows._steps`) with their own timeout, and hold this machine's GPU slot: a Prefect
global concurrency limit of 1 named ``kernsearch-gpu-<host>``, so two runs on one machine (a nightly and
a manual one, two deployments) never time kernels at the same time (``_slot``: a run waiting for it says so every
few seconds, and a slot left taken by a dead run is freed, naming the dead holder). ``tune`` is retried once when its
process crashed (the study resumes where it stopped); a timeout or a search without a correct winner is
not retried. ``publish`` is retried when the artifact key is busy. A job that fails is reported and the
run goes on with the next job. The run ends with a table artifact: per job the old and new time, the
speedup, published or rejected (with the gate's reason) or failed (with the reason), and the evidence.
"""

from __future__ import annotations

import os
import re
import socket
import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from kernsearch import KernsearchError
from kernsearch._vocabulary import Evidence
from kernsearch.artifacts._manifest import KeyBusy

from ._jobs import Jobs, Unit, load_jobs
from ._report import Exported, ExportOutcome, ExportStatus, JobRow, NightlyReport, Outcome, Previous, Published
from ._slot import gpu_slot
from ._steps import StepCrashed, StepError, Tuned, Verified, run_step

FLOW_NAME = "kernsearch-nightly"
GPU_LIMIT_PREFIX = "kernsearch-gpu-"
#: A job's outcome (:class:`Outcome`), by its older names.
PUBLISHED, REJECTED, FAILED = Outcome.PUBLISHED, Outcome.REJECTED, Outcome.FAILED
OUTCOMES = tuple(Outcome)
#: Seconds the verify step may take per extra shape (interpreter runs of small shapes take seconds).
VERIFY_SECONDS_PER_SHAPE = 300.0


def slug(text: str) -> str:
    """Lower-case letters, digits and dashes (Prefect artifact keys and deployment names)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def machine_name() -> str:
    """This machine in a farm: ``KERNSEARCH_MACHINE``, else the host name."""
    return os.environ.get("KERNSEARCH_MACHINE") or socket.gethostname()


def gpu_limit_name(host: str | None = None) -> str:
    """The per-machine concurrency limit that serialises GPU measurement (one GPU job per machine)."""
    return GPU_LIMIT_PREFIX + slug(host or machine_name())


def refusal(chip: str | None) -> str | None:
    """Why a farm worker must not run a run for ``chip`` (None: it may).

    A worker's machine declares its chip in ``KERNSEARCH_CHIP``; a run for another chip (a deployment in the
    wrong pool, a run started by hand with another chip) is refused before anything is tuned. Without the
    variable a machine runs what it is asked (``kernsearch flows run --chip X`` models X anywhere).
    """
    declared = os.environ.get("KERNSEARCH_CHIP")
    if not declared or chip is None:
        return None
    from kernsearch import get_chip

    if get_chip(declared).name == get_chip(chip).name:
        return None
    return (f"refused: this worker's machine {machine_name()!r} is a {get_chip(declared).name} "
            f"(KERNSEARCH_CHIP); the run is for {get_chip(chip).name}")


def ensure_gpu_limit(name: str) -> None:
    """Create the machine's global concurrency limit (1 slot) if the server does not have it yet."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
            except ObjectAlreadyExists:  # another run created it meanwhile
                pass


def _retry_on_crash(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a step only when its process died (a resumed study continues); never after a timeout."""
    try:
        state.result()
    except StepCrashed:
        return True
    except BaseException:  # noqa: BLE001 - any other failure is deterministic
        return False
    return False


def _retry_when_busy(task: Any, task_run: Any, state: Any) -> bool:
    try:
        state.result()
    except KeyBusy:
        return True
    except BaseException:  # noqa: BLE001 - any other failure is deterministic
        return False
    return False


def _say(line: str) -> None:
    """A line of the slot's (waiting for it, freeing it from a dead holder) in the run's log."""
    get_run_logger().warning(line)


# -- tasks --------------------------------------------------------------------------------------------

@task(name="tune", retries=1, retry_delay_seconds=10, retry_condition_fn=_retry_on_crash)
def tune_task(unit: Unit, backend: str, storage: str | None, gpu_limit: str,
              artifacts: str | None = None) -> tuple[Tuned, tuple[float, float]]:
    """Run or resume the unit's study in a subprocess, holding this machine's GPU slot; returns its result and the
    window (start, end) while this run held the slot. Its final round times the leader against the current version
    in ``artifacts`` too (the store it publishes to), as `tune --publish` does."""
    payload = {"family": unit.family, "shape": list(unit.shape), "dtype": unit.dtype, "chip": unit.chip,
               "backend": backend, "storage": storage, "artifacts": artifacts, "options": unit.options.model_dump()}
    with gpu_slot(gpu_limit, _say):
        started = time.time()
        tuned = Tuned.from_json(run_step("tune", payload, timeout=unit.step_timeout()))
        return tuned, (started, time.time())


@task(name="verify")
def verify_task(unit: Unit, backend: str, config: dict[str, Any], gpu_limit: str) -> Verified:
    """Verify the winner on the unit's extra shapes (interpreter for modeled searches, else the device)."""
    from kernsearch.backends import backend_class

    payload = {"family": unit.family, "dtype": unit.dtype, "chip": unit.chip, "config": config,
               "shapes": [list(s) for s in unit.verify_shapes], "tuned_shape": list(unit.shape),
               "seed": unit.options.seed,
               "verifier_backend": backend_class(backend).verifier(), "timeout": unit.options.timeout}
    with gpu_slot(gpu_limit, _say):
        timeout = VERIFY_SECONDS_PER_SHAPE * max(1, len(unit.verify_shapes))
        return Verified.from_json(run_step("verify", payload, timeout=timeout))


@task(name="publish", retries=2, retry_delay_seconds=5, retry_condition_fn=_retry_when_busy, timeout_seconds=600)
def publish_task(unit: Unit, backend: str, tuned: Tuned, verified: Verified, artifacts: str | None) -> Published:
    """Offer the verified winner to the store's regression gate (``Candidate.from_winner``, as `tune --publish`
    does); returns the outcome and the old time."""
    from kernsearch import ArtifactStore, Candidate, Space, load_family, make_problem
    from kernsearch.backends import backend_class
    from kernsearch.hardware._chips import resolve_chip
    from kernsearch.hardware._targets import chip_target

    fam = load_family(unit.family)
    winner = tuned.winner if verified.proof is None else tuned.winner.proven_also(verified.proof)
    measured = winner.evidence == Evidence.MEASURED  # a measurement belongs to the device detected here
    cls = backend_class(backend)
    chip = resolve_chip(unit.chip, measures=cls.measures_device, target=cls.target, default=True, quiet=True)
    if measured and chip.name != unit.chip:
        raise KernsearchError(f"measured on {chip.name}, but the job is for {unit.chip}")
    space = Space(make_problem(fam, unit.shape, unit.dtype, chip), chip)
    candidate = Candidate.from_winner(winner, space, target=chip_target(chip.vendor))
    store = ArtifactStore(artifacts)
    previous = _current(store, candidate.key)
    outcome = store.publish(candidate, min_gain=unit.options.min_gain, margin=unit.options.margin)
    return Published(outcome.published, outcome.version, outcome.reason, outcome.key, outcome.current, previous)


@task(name="export", retries=1, retry_delay_seconds=10, timeout_seconds=1800)
def export_task(artifacts: str | None, out: str, families: list[str]) -> Exported:
    """Build the installable package of the current artifacts (``kernsearch export``)."""
    return export_package(artifacts, out, families)


def export_package(artifacts: str | None, out: str, families: list[str]) -> Exported:
    from kernsearch import ArtifactStore, export

    result = export(families, out, ArtifactStore(artifacts))
    return Exported(out, str(result.wheel), result.package, result.version, tuple(result.artifacts),
                    tuple(result.notes))


# -- the flow -----------------------------------------------------------------------------------------

@flow(name=FLOW_NAME, description="Re-tune, verify and publish the kernels of a job file for this machine's chip.")
def nightly(job_file: str, chip: str | None = None) -> NightlyReport:
    """Run every job of ``job_file`` listed for ``chip`` (default: the detected chip); see the module doc."""
    logger = get_run_logger()
    refused = refusal(chip)
    if refused:
        logger.error(refused)
        raise KernsearchError(refused)
    from kernsearch.hardware._chips import resolve_chip

    jobs = load_jobs(job_file)
    detected = resolve_chip(quiet=True)
    machine = resolve_chip(chip, detected=detected)  # the chip whose jobs run here
    units = jobs.units(machine.name)
    if not units:
        logger.warning("no job in %s is for %s (jobs are for: %s)", job_file, machine.name, ", ".join(jobs.chips()))
    limit = gpu_limit_name()
    ensure_gpu_limit(limit)
    rows = tuple(_run_unit(unit, jobs, detected, limit, logger) for unit in units)
    report = NightlyReport(machine.name, machine_name(), str(jobs.path), rows, _maybe_export(jobs, rows, logger))
    _summarise(report)
    logger.info("%s on machine %s: %d published, %d rejected, %d failed", machine.name, machine_name(),
                report.published, report.rejected, report.failed)
    return report


def _backend(choice: str, detected: Any, chip: str) -> str:
    """``auto``: measure (metal / cuda) when the job's chip is the GPU here, else predict with the model
    (``backends.select_backend``, as ``kernsearch tune`` decides)."""
    from kernsearch.backends import select_backend

    return select_backend(choice, chip, detected=detected).backend


def _run_unit(unit: Unit, jobs: Jobs, detected: Any, limit: str, logger: Any) -> JobRow:
    """One job's tune → verify → publish; a step that fails ends the job with its reason, and the run goes on."""
    from kernsearch.backends import backend_class

    backend = _backend(unit.options.backend, detected, unit.chip)
    row = JobRow.start(unit, backend)
    if backend_class(backend).measures_device and detected.name != unit.chip:
        row.reason = (f"a {backend} search measures the chip it runs on: this machine is {detected.name}, "
                      f"the job is for {unit.chip}")
        logger.error("%s: %s", unit.name, row.reason)
        return row
    timeout = unit.step_timeout() + 120.0
    store = str(jobs.artifacts) if jobs.artifacts else None
    tuning = tune_task.with_options(timeout_seconds=timeout)(unit, backend, jobs.storage, limit, store,
                                                             return_state=True)
    if _failed(tuning, row, "tune"):
        logger.error("%s: tune failed: %s", unit.name, row.reason)
        return row
    tuned, window = tuning.result()
    _tuned(row, tuned, window, _attach_report(unit, tuned.study, jobs.storage, logger))
    vtimeout = VERIFY_SECONDS_PER_SHAPE * max(1, len(unit.verify_shapes)) + 60.0
    verifying = verify_task.with_options(timeout_seconds=vtimeout)(unit, backend, tuned.winner.config, limit,
                                                                    return_state=True)
    if _failed(verifying, row, "verify"):
        logger.error("%s: verification failed: %s", unit.name, row.reason)
        return row
    verified = verifying.result()
    publishing = publish_task(unit, backend, tuned, verified, store, return_state=True)
    if not _failed(publishing, row, "publish"):
        _published(row, tuned, verified, publishing.result())
        logger.info("%s: %s: %s", unit.name, row.outcome, row.reason)
    return row


def _tuned(row: JobRow, tuned: Tuned, window: tuple[float, float], report: str | None) -> None:
    """The row of a job whose search found a winner: its study, evidence and time."""
    row.evidence, row.new_ms, row.study = tuned.evidence, tuned.winner.figures.median_ms, tuned.study
    row.evaluated, row.tune_window, row.report = tuned.evaluated, window, report


def _published(row: JobRow, tuned: Tuned, verified: Verified, outcome: Published) -> None:
    """The row of a job whose winner reached the gate: published or rejected, and why."""
    old = outcome.previous
    row.old_ms, row.old_version, row.version = old.ms, old.version, outcome.version
    row.outcome = Outcome.PUBLISHED if outcome.published else Outcome.REJECTED
    row.reason = outcome.reason
    # a speedup only between figures of one evidence kind (measured vs modeled never mix)
    row.speedup = (old.ms / tuned.winner.figures.median_ms) if old.ms and old.evidence == tuned.evidence else None
    if verified.skipped:
        row.reason += "; not verified at " + ", ".join(
            f"{'x'.join(map(str, s.shape))} ({s.why})" for s in verified.skipped)


def _attach_report(unit: Unit, study: str, storage: str | None, logger: Any) -> str | None:
    """The job's study as an HTML report (``kernsearch report``) and a markdown artifact that summarises it and
    links the file. A report that cannot be made is a warning: it never fails the job."""
    from kernsearch.studies._history import load_history
    from kernsearch.studies._report import evidence_badge, write_report

    try:
        path = write_report(study, storage)
        h = load_history(study, storage, importances=False)
    except Exception as exc:  # noqa: BLE001 - the report is a view of the study, not part of the job
        logger.warning("%s: no report: %s", unit.name, " ".join(str(exc).split())[:300])
        return None
    _, words = evidence_badge(h.evidence)
    fails = ", ".join(f"{k} {v}" for k, v in h.failures.most_common()) or "none"
    label = "predicted ms" if h.evidence == Evidence.MODELED else "ms"
    lines = [f"# {unit.name}: study `{study}`", "", f"**{words}**", "",
             f"{len(h.trials)} configs evaluated, failed: {fails}; {h.invalid} rejected by constraints.", "",
             f"HTML report with plots (convergence, importances, per-knob effects): [{path.name}]({path.as_uri()})"
             f" on this machine (`{path}`).", "", f"| # | config | {label} |", "|---|---|---|"]
    lines += [f"| {i} | `{','.join(f'{k}={v}' for k, v in t.config.items())}` | {t.time_ms:.4g} |"
              for i, t in enumerate(h.top[:5], 1)]
    create_markdown_artifact(markdown="\n".join(lines), key=f"kernsearch-report-{slug(unit.name)}",
                             description=f"kernsearch study report for {unit.name} ({h.evidence})")
    return str(path)


def _why(state: Any, step: str) -> str | None:
    """Why the task did not complete, as the report says it (None: it completed)."""
    if state.is_completed():
        return None
    exc = state.result(raise_on_failure=False)
    if isinstance(exc, StepError):
        why = f"{exc.reason}: {exc.detail}" if exc.detail else exc.reason
    elif isinstance(exc, BaseException):
        why = str(exc) or type(exc).__name__
    else:
        why = state.message or state.name
    return f"{step}: {' '.join(str(why).split())}"


def _failed(state: Any, row: JobRow, step: str) -> bool:
    """Whether the job's step failed; if so the row says why."""
    why = _why(state, step)
    if why is None:
        return False
    row.reason = why
    return True


def _current(store: Any, key: Any) -> Previous:
    """The current version's time, before publishing (for the summary)."""
    try:
        pointer = store.pointer(key)
        if pointer is None:
            return Previous()
        manifest = store.load(key, pointer.version).manifest
    except KernsearchError:
        return Previous()
    m = manifest.measurements
    return Previous(m.median_ms if m else None, pointer.version, manifest.evidence)


def _maybe_export(jobs: Jobs, rows: tuple[JobRow, ...], logger: Any) -> ExportOutcome:
    """Export the package once, after the jobs, when something new was published."""
    if jobs.export is None:
        return ExportOutcome(ExportStatus.SKIPPED, "the job file names no export folder")
    if not any(r.outcome == Outcome.PUBLISHED for r in rows):
        return ExportOutcome(ExportStatus.SKIPPED, "nothing new was published")
    families = jobs.families()  # every family of the file: the package ships them all, not only tonight's
    state = export_task(str(jobs.artifacts) if jobs.artifacts else None, str(jobs.export), families,
                        return_state=True)
    why = _why(state, "export")
    if why is not None:
        logger.error("export failed: %s", why)
        return ExportOutcome(ExportStatus.FAILED, why)
    return ExportOutcome(ExportStatus.EXPORTED, exported=state.result())


def _summarise(report: NightlyReport) -> None:
    """The run's summary as Prefect artifacts: a table of jobs and a short markdown note."""
    table = [{"job": r.job, "problem": r.problem, "chip": r.chip,
              "old ms": _ms(r.old_ms) + (f" ({r.old_version})" if r.old_version else ""),
              "new ms": _ms(r.new_ms), "speedup": f"{r.speedup:.3f}x" if r.speedup else "-",
              "outcome": r.verdict, "reason": r.reason, "evidence": f"{r.evidence or '-'}"} for r in report.jobs]
    key = f"kernsearch-nightly-{slug(report.chip)}"
    create_table_artifact(table=table, key=key, description=f"kernsearch nightly on {report.chip}: {report.totals}")
    export = report.export
    lines = [f"# kernsearch nightly on {report.chip}", "",
             f"{report.totals} (job file `{report.job_file}`).", "",
             "Times labelled *modeled* are predictions of the performance model, not measurements.", "",
             f"Export: {export.status}: {export.reason or export.out}"]
    create_markdown_artifact(markdown="\n".join(lines), key=f"{key}-note")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"

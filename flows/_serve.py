"""Serving the nightly deployment of this machine's chip, and running the flow once, now.

One deployment per chip (``nightly-m2-max``), tagged ``chip:m2-max`` and parameterised with that chip:
the machine that serves it is the only one that runs it, so a job for an M3 Max never runs on an M2 Max.
(With work pools instead of ``serve``: one pool per chip, one worker per machine; see docs/flows.md.)
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernsearch import KernsearchError

if TYPE_CHECKING:
    from ._report import NightlyReport

DEFAULT_CRON = "0 2 * * *"


def deployment_name(chip: str) -> str:
    from .nightly import slug

    return f"nightly-{slug(chip)}"


def check_schedule(cron: str, timezone: str | None) -> None:
    """A bad cron string or time zone is a one-line error before anything is served."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        CronSchedule(cron=cron, timezone=timezone or "UTC")
    except (ValidationError, ValueError) as exc:
        errors = exc.errors() if isinstance(exc, ValidationError) else [{"msg": str(exc)}]
        raise KernsearchError(f"bad schedule: {errors[0]['msg'].removeprefix('Value error, ')}") from None


def serve(job_file: str | Path, *, chip: str | None = None, cron: str = DEFAULT_CRON, timezone: str | None = None,
          name: str | None = None) -> None:
    """Serve the nightly deployment of this machine's chip until interrupted (blocks)."""
    from ._jobs import load_jobs

    jobs = load_jobs(job_file)
    check_schedule(cron, timezone)
    from kernsearch.hardware._chips import resolve_chip

    machine = resolve_chip(chip, quiet=True).name  # the chip whose jobs this machine runs
    if not jobs.units(machine):
        raise KernsearchError(f"{job_file}: no job is for {machine} (jobs are for: {', '.join(jobs.chips())}); "
                              "pass --chip to serve another chip's jobs")

    check_api(required="a schedule runs on a Prefect server that stays up (a temporary one schedules nothing)")
    from prefect.schedules import Cron
    from prefect.types.entrypoint import EntrypointType

    from .nightly import nightly, slug

    nightly.serve(name=name or deployment_name(machine), schedules=[Cron(cron, timezone=timezone or "UTC")],
                  parameters={"job_file": str(jobs.path), "chip": machine},
                  tags=["kernsearch", f"chip:{slug(machine)}"],
                  description=f"kernsearch nightly searches for {machine} ({jobs.path})", limit=1,
                  entrypoint_type=EntrypointType.MODULE_PATH)


def check_api(required: str | None = None) -> None:
    """With ``PREFECT_API_URL`` set, the server must answer: else one line, not a retry storm and a traceback.
    ``required``: why this command needs a server of its own (without one, Prefect would start a temporary
    server that lives as long as the command, and schedules nothing on it)."""
    if not os.environ.get("PREFECT_API_URL"):  # read by Prefect's settings when first imported: set them before
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")  # a busy machine
        # A temporary server's telemetry heartbeat races the run for its SQLite file ("database is locked"
        # tracebacks on stderr) and reports nothing worth keeping.
        os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from pydantic import ValidationError

    try:
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL

        url = PREFECT_API_URL.value()
    except ValidationError as exc:  # a PREFECT_* variable Prefect cannot read
        first = exc.errors()[0]
        raise KernsearchError(f"Prefect's settings are invalid: {'.'.join(map(str, first['loc']))}: {first['msg']} "
                              "(check the PREFECT_* environment variables and profile)") from None
    if not url and required:
        raise KernsearchError(f"{required}: start one (prefect server start) and set PREFECT_API_URL, e.g. "
                              "http://server.lan:4200/api (docs/flows.md); `kernsearch flows run` runs once "
                              "without one")
    if not url:  # no server configured: Prefect starts a temporary local one, slower than its 20 s default
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")  # on a busy machine
        return
    with get_client(sync_client=True) as client:
        problem = client.api_healthcheck()
    if problem is not None:
        raise KernsearchError(f"cannot reach the Prefect server at {url} ({type(problem).__name__}: "
                              f"{' '.join(str(problem).split())}); start it or fix PREFECT_API_URL")


def pool_name(chip: str) -> str:
    from .nightly import slug

    return f"kernsearch-{slug(chip)}"


def deploy(job_file: str | Path, *, chips: list[str] | None = None, cron: str = DEFAULT_CRON,
           timezone: str | None = None) -> list[tuple[str, str]]:
    """Register one scheduled deployment per chip, each in its chip's process work pool (created if missing).

    Returns ``(deployment, work pool)`` pairs. Each machine then runs ``prefect worker start --pool
    kernsearch-<chip>``: a worker only takes runs of its own pool, so a chip's jobs run on that chip only.
    """
    from ._jobs import load_jobs

    jobs = load_jobs(job_file)
    check_schedule(cron, timezone)
    from kernsearch import get_chip

    wanted = [get_chip(c).name for c in chips] if chips else jobs.chips()
    for chip in wanted:
        if not jobs.units(chip):
            raise KernsearchError(f"{job_file}: no job is for {chip} (jobs are for: {', '.join(jobs.chips())})")

    check_api(required="deployments live on a Prefect server")
    from prefect.schedules import Cron
    from prefect.types.entrypoint import EntrypointType

    from .nightly import FLOW_NAME, nightly, slug

    done = []
    for chip in wanted:
        pool = pool_name(chip)
        _ensure_process_pool(pool, chip)
        deployment = nightly.to_deployment(
            name=deployment_name(chip), schedules=[Cron(cron, timezone=timezone or "UTC")], paused=False,
            parameters={"job_file": str(jobs.path), "chip": chip}, tags=["kernsearch", f"chip:{slug(chip)}"],
            description=f"kernsearch nightly searches for {chip} ({jobs.path})", work_pool_name=pool,
            entrypoint_type=EntrypointType.MODULE_PATH)
        deployment.apply()
        done.append((f"{FLOW_NAME}/{deployment_name(chip)}", pool))
    return done


def _ensure_process_pool(name: str, chip: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            try:
                client.create_work_pool(WorkPoolCreate(
                    name=name, type="process", description=f"kernsearch nightly runs for {chip} machines",
                    base_job_template=ProcessWorker.get_default_base_job_template()))
            except ObjectAlreadyExists:
                pass


def run_once(job_file: str | Path, *, chip: str | None = None) -> NightlyReport:
    """Run the nightly flow now, in this process, without a schedule; returns its report."""
    from kernsearch.hardware._chips import resolve_chip

    from ._jobs import load_jobs

    jobs = load_jobs(job_file)  # a bad file is one line, before Prefect starts
    machine = resolve_chip(chip, quiet=True).name  # the chip whose jobs this machine runs
    if not jobs.units(machine):  # say so now, not after a temporary Prefect server has started
        raise KernsearchError(f"{job_file}: no job is for {machine} (jobs are for: {', '.join(jobs.chips())}); "
                              "pass --chip to run another chip's jobs")
    check_api()
    from .nightly import nightly

    try:
        with stop_on_sigterm():
            return nightly(job_file=str(jobs.path), chip=machine)
    except RuntimeError as exc:  # Prefect's own machinery, not a job: the server it needs is not there
        why = " ".join(str(exc).split())
        if not any(sign in why for sign in _NO_SERVER):
            raise
        raise KernsearchError(f"no Prefect server to run the flow on ({why[:160]}): start one (prefect server "
                              "start) and set PREFECT_API_URL=http://127.0.0.1:4200/api, then run again "
                              "(docs/flows.md)") from None


#: What Prefect raises when the API it runs a flow against is gone or never came up.
_NO_SERVER = ("ephemeral Prefect API server", "Cannot put items in a stopped service instance")



@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM stops the run within moments: one line on stderr, every step's processes killed, exit 143 (no
    tracebacks of a Prefect server going down with it). The GPU slot the run may hold is freed by the next run
    (its recorded holder is dead: ``_slot``). Off the main thread, nothing is installed."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        from ._steps import kill_running

        kill_running()
        sys.stderr.write("kernsearch flows run: stopped by SIGTERM (its steps killed; a GPU slot it held is freed "
                         "by the next run)\n")
        sys.stderr.flush()
        os._exit(143)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

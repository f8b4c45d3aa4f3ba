"""Issue 39, case 5: every path a job file names is checked when it is loaded, by the command line's own rules.

A job file whose export path was a device node, or whose artifact store was a FIFO, passed load and then printed
Prefect's traceback from ``flows run`` (exit 1). Now it is one line at load naming the file and the field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernsearch.flows._jobs import JobFileError, load_jobs

JOB = "[[jobs]]\nfamily = 'gemm'\nchips = ['M2 Max']\nshapes = ['64,64,64']\nbackend = 'model'\ntrials = 2\n"


def _paths(tmp: Path) -> dict[str, tuple[str, str]]:
    """name -> (the job file's top-level line, what the one-line error must say)."""
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    (tmp / "plain").write_text("not a folder\n")
    return {
        "export is a device": ('export = "/dev/null"', "export: /dev/null is not a folder"),
        "export under a file": (f'export = "{tmp / "plain" / "dist"}"', "is not a folder"),
        "artifacts is a FIFO": (f'artifacts = "{fifo}"', "artifacts:"),
        "artifacts is a file": ('artifacts = "plain"', "artifacts:"),
        "storage is a FIFO": (f'storage = "sqlite:///{fifo}"', "storage:"),
        "storage is a device": ('storage = "sqlite:////dev/null"', "storage:"),
    }


CASES = ["export is a device", "export under a file", "artifacts is a FIFO", "artifacts is a file",
         "storage is a FIFO", "storage is a device"]


@pytest.mark.parametrize("case", CASES)
def test_a_job_files_paths_are_checked_at_load(tmp_path: Path, case: str) -> None:
    line, needle = _paths(tmp_path)[case]
    path = tmp_path / "jobs.toml"
    path.write_text(line + "\n" + JOB)
    with pytest.raises(JobFileError) as info:
        load_jobs(path)
    message = str(info.value)
    assert str(path) in message and needle in message and "\n" not in message, message


def test_good_paths_still_load(tmp_path: Path) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text('export = "dist"\nartifacts = "store"\nstorage = "sqlite:///studies.db"\n' + JOB)
    jobs = load_jobs(path)
    assert jobs.export == tmp_path / "dist" and jobs.artifacts == tmp_path / "store"


@pytest.mark.slow
def test_flows_run_refuses_a_device_export_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text('export = "/dev/null"\n' + JOB)
    proc = subprocess.run([sys.executable, "-m", "kernsearch", "flows", "run", str(path)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PREFECT_API_URL": ""})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "export: /dev/null is not a folder" in proc.stderr


@pytest.mark.slow
def test_flows_run_without_a_prefect_server_is_one_line_that_says_how_to_start_one(tmp_path: Path) -> None:
    """The temporary server Prefect starts does not come up in time (a busy machine; forced here with a 1 s
    start-up limit): one line saying how to start a server, no Prefect traceback."""
    path = tmp_path / "jobs.toml"
    path.write_text('artifacts = "store"\nstorage = "sqlite:///studies.db"\n' + JOB)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="1")
    proc = subprocess.run([sys.executable, "-m", "kernsearch", "flows", "run", str(path), "--chip", "M2 Max"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "prefect server start" in errors[0] and "PREFECT_API_URL" in errors[0], errors
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "soon"
    proc = subprocess.run([sys.executable, "-m", "kernsearch", "flows", "run", str(path), "--chip", "M2 Max"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "settings are invalid" in proc.stderr, \
        proc.stderr[-3000:]

"""Issue 17: Prefect's own CLI, the UI's API calls and the cron scheduler work against a real `prefect server`.

docs/flows.md tells operators to use `prefect deployment ls`, `prefect work-pool ls` and `prefect artifact ls`;
with FastAPI >= 0.151 they failed with 422 from our own server, and with SQLAlchemy 2.1 the scheduler service
created no runs for cron deployments. One server for the whole file (it takes ~15 s to start on 2 cores).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PREFECT = [sys.executable, "-m", "prefect"]  # this interpreter's Prefect, whatever the scripts' shebangs say


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    import httpx
    import prefect_api

    tmp = tmp_path_factory.mktemp("prefect")
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_HOME": str(prefect_api.migrated_home(tmp / "home")), "PREFECT_API_URL": api, "PREFECT_SERVER_UI_ENABLED": "false",
           "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2", "COLUMNS": "250"}
    log = open(tmp / "server.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([*PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (tmp / "server.log").read_text()[-3000:]
            try:
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the Prefect server did not start in 180 s"
            time.sleep(0.5)
        yield {**env, "_log": str(tmp / "server.log")}
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=10)
        log.close()


def _prefect(env: dict[str, str], *args: str) -> str:
    r = subprocess.run([*PREFECT, *args], check=False, env={k: v for k, v in env.items() if not k.startswith("_")},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"prefect {' '.join(args)}: {r.stdout[-2000:]}{r.stderr[-2000:]}"
    # an HTTP 422 as a token of its own, never inside an id (a UUID printed by `ls` may hold "422": seen in CI)
    assert not re.search(r"(?<![0-9A-Za-z-])422(?![0-9A-Za-z-])", r.stdout + r.stderr), r.stdout + r.stderr
    return r.stdout


@pytest.mark.slow
@pytest.mark.e2e
def test_prefect_ls_commands_and_scheduler(server: dict[str, str]) -> None:
    import prefect_api

    api = server["PREFECT_API_URL"]
    _prefect(server, "work-pool", "create", "kernsearch-m2-max", "--type", "process")
    flow = prefect_api.post(f"{api}/flows/", json={"name": "kernsearch-nightly"}, timeout=10).json()
    dep = prefect_api.post(f"{api}/deployments/", timeout=10, json={
        "name": "nightly-m2-max", "flow_id": flow["id"], "work_pool_name": "kernsearch-m2-max",
        "schedules": [{"schedule": {"cron": "0 2 * * *", "timezone": "UTC"}, "active": True}]})
    assert dep.status_code in (200, 201), dep.text
    art = prefect_api.post(f"{api}/artifacts/", timeout=10, json={
        "key": "kernsearch-report-gemm", "type": "markdown", "data": "# report", "description": "study report"})
    assert art.status_code in (200, 201), art.text

    assert "kernsearch-nightly/nightly-m2-max" in _prefect(server, "deployment", "ls")
    assert "kernsearch-m2-max" in _prefect(server, "work-pool", "ls")
    assert "kernsearch-report-gemm" in _prefect(server, "artifact", "ls")

    # the calls the UI's pages make (a 422 or 500 here is a blank page for an operator)
    for path, body in [("deployments/paginate", {"page": 1, "limit": 10}), ("work_pools/filter", {}),
                       ("artifacts/filter", {"limit": 10}), ("artifacts/latest/filter", {"limit": 10}),
                       ("flow_runs/paginate", {"page": 1, "limit": 10}), ("flows/paginate", {"page": 1})]:
        r = prefect_api.post(f"{api}/{path}", json=body, timeout=10)
        assert r.status_code == 200, f"{path}: {r.status_code} {r.text[:300]}"

    # the scheduler service creates the cron deployment's upcoming runs (it did not with SQLAlchemy 2.1)
    deadline = time.monotonic() + 60
    runs: list = []
    while not runs and time.monotonic() < deadline:
        time.sleep(1)
        runs = prefect_api.post(f"{api}/flow_runs/filter", timeout=10,
                          json={"deployments": {"id": {"any_": [dep.json()["id"]]}}}).json()
    assert runs, "no scheduled run in 60 s: " + Path(server["_log"]).read_text()[-2000:]
    assert all(r["auto_scheduled"] and r["state"]["type"] == "SCHEDULED" for r in runs)

"""The farm end to end: a real PostgreSQL (the shared studies), a real ``prefect server``, the nightly deployments
of two chips, and three Prefect workers as separate processes: two "machines" of M2 Max, one of M3 Max
(identity injected through KERNSEARCH_CHIP / KERNSEARCH_MACHINE), all publishing into one artifact store."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from pgserver import PostgresServer, pg_bin
from test_flows import KERNSEARCH, TELEMETRY_OFF, _wait, alive, free_port, stop, write

# this interpreter's Prefect (a venv's script may name another venv's Python)
PREFECT = [sys.executable, "-m", "prefect"]

JOBS = """
artifacts = "store"
storage = "{url}"

[defaults]
backend = "model"
trials = {trials}
finalists = 1
sampler = "tpe"
verify_shapes = ["20,24,16"]

[[jobs]]
name = "square"
family = "gemm"
shapes = ["64,64,64"]
dtypes = ["float16"]
chips = ["M2 Max", "M3 Max"]
"""


@pytest.mark.slow  # a Prefect server, three workers and three flow runs: minutes; CI runs it
@pytest.mark.skipif(pg_bin() is None, reason="PostgreSQL is not installed (.ci/run installs it)")
def test_three_workers_two_chips_one_study_per_chip_one_store(tmp_path: Path) -> None:
    import httpx
    import optuna

    from kernsearch._storage import make_storage

    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, **TELEMETRY_OFF, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_API_URL": api,
           "PREFECT_UI_ENABLED": "false", "PREFECT_SERVER_UI_ENABLED": "false",
           "KERNSEARCH_HOME": str(tmp_path / "home"), "PREFECT_WORKER_QUERY_SECONDS": "2",
           "KERNSEARCH_HEARTBEAT_S": "2"}
    procs: list[subprocess.Popen] = []
    logs = []
    with PostgresServer() as pg:
        jobs = write(tmp_path / "jobs.toml", JOBS.format(url=pg.url, trials=8))
        try:
            def start(name: str, args: list[str], extra: dict[str, str] | None = None) -> subprocess.Popen:
                log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 - closed below
                logs.append(log)
                p = subprocess.Popen(args, env={**env, **(extra or {})}, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=tmp_path)
                procs.append(p)
                return p

            server = start("server", [*PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)])

            def healthy() -> bool:
                try:
                    return httpx.get(f"{api}/health", timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False

            _wait(healthy, 240, "the Prefect server", [server])
            deployed = subprocess.run(KERNSEARCH + ["flows", "deploy", str(jobs)], env=env, capture_output=True,
                                      text=True, timeout=240, cwd=tmp_path)
            assert deployed.returncode == 0, deployed.stdout + deployed.stderr
            machines = {"mini-a": "M2 Max", "mini-b": "M2 Max", "studio-c": "M3 Max"}
            for machine, chip in machines.items():
                pool = "kernsearch-" + chip.lower().replace(" ", "-")
                start(machine, [*PREFECT, "worker", "start", "--pool", pool, "--limit", "1", "--name", machine],
                      {"KERNSEARCH_CHIP": chip, "KERNSEARCH_MACHINE": machine})
            ids: dict[str, str] = {}
            for label, chip in (("m2-1", "m2-max"), ("m2-2", "m2-max"), ("m3-1", "m3-max")):
                t = subprocess.run([*PREFECT, "deployment", "run", f"kernsearch-nightly/nightly-{chip}"], env=env,
                                   capture_output=True, text=True, timeout=180)
                assert t.returncode == 0, t.stdout + t.stderr
                ids[label] = re.search(r"UUID: ([0-9a-f-]{36})", t.stdout).group(1)  # type: ignore[union-attr]

            def all_finished() -> list[dict] | None:
                runs = [httpx.get(f"{api}/flow_runs/{i}", timeout=5).json() for i in ids.values()]
                done = all(r["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") for r in runs)
                return runs if done else None

            runs = _wait(all_finished, 480, "the three flow runs", procs)
            assert [r["state"]["type"] for r in runs] == ["COMPLETED"] * 3, [r["state"] for r in runs]

            # each chip's runs ran on that chip's machines only (the flow logs the machine it ran on)
            ran_on: dict[str, str] = {}
            for label, run_id in ids.items():
                logs_ = httpx.post(f"{api}/logs/filter", json={"logs": {"flow_run_id": {"any_": [run_id]}}},
                                   timeout=10).json()
                found = [m.group(1) for entry in logs_ if (m := re.search(r"on machine (\S+):", entry["message"]))]
                assert len(found) == 1, [e["message"] for e in logs_]
                ran_on[label] = found[0]
            assert machines[ran_on["m3-1"]] == "M3 Max"
            assert {machines[ran_on["m2-1"]], machines[ran_on["m2-2"]]} == {"M2 Max"}

            # one study per chip, shared by the runs of that chip: no config evaluated twice
            storage = make_storage(pg.url)
            names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
            assert sorted(n.split("/")[1] for n in names) == ["M2 Max", "M3 Max"]
            for name in names:
                trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
                configs = Counter(json.dumps(t.user_attrs["config"], sort_keys=True) for t in trials
                                  if t.user_attrs.get("status") in ("ok", "failed"))
                assert configs and max(configs.values()) == 1, name

            # one store: every published version once (the second M2 Max run publishes only if it beat v1)
            store = tmp_path / "store" / "gemm"
            for chip in ("M2-Max", "M3-Max"):
                versions = sorted(p.parent.name for p in (store / chip / "float16" / "64x64x64").glob("v*/manifest.json"))
                assert versions and versions == [f"v{i}" for i in range(1, len(versions) + 1)], (chip, versions)

            # a run for M2 Max handed to the M3 Max machine is refused in one line
            refused = subprocess.run(KERNSEARCH + ["flows", "run", str(jobs), "--chip", "M2 Max"],
                                     env={**env, "KERNSEARCH_CHIP": "M3 Max", "KERNSEARCH_MACHINE": "studio-c"},
                                     capture_output=True, text=True, timeout=240, cwd=tmp_path)
            assert refused.returncode != 0
            assert "refused: this worker's machine 'studio-c' is a M3 Max" in refused.stdout + refused.stderr
        finally:
            for p in reversed(procs):  # stop every process this test started (and their children)
                stop(p)
            for f in logs:
                f.close()
    assert all(p.poll() is not None for p in procs) and not any(alive(p.pid) for p in procs)
    assert not pg.running()

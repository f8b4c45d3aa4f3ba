"""The farm end to end: a real PostgreSQL (the shared studies), a real ``prefect server``, the nightly deployments
of two chips, and three Prefect workers as separate processes: two "machines" of M2 Max, one of M3 Max
(identity injected through KERNSEARCH_CHIP / KERNSEARCH_MACHINE), all publishing into one artifact store."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from ci import IN_CI
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


def _tree(root: int) -> list[int]:
    """``root`` and every process descended from it (a worker, its flow runs, their step processes, which run
    in sessions of their own), from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = [root], [root]
    while frontier:
        children = [pid for pid, ppid in parents.items() if ppid in frontier and pid not in found]
        found += children
        frontier = children
    return found


def _live(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _marked(marker: str) -> list[int]:
    """Live processes whose environment holds ``marker``: everything this test started and all their
    descendants, even those in sessions of their own or orphaned (re-parented to init) on the way."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes().split(b"\0") and _live(int(environ.parent.name)):
                found.append(int(environ.parent.name))
        except (OSError, ValueError):
            continue
    return found


def _wait_until(check: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _signal_tree(root: int, sig: signal.Signals) -> list[int]:
    """Send ``sig`` to the whole tree, again until no new process appears (one may fork meanwhile)."""
    sent: set[int] = set()
    while True:
        new = [pid for pid in _tree(root) if pid not in sent]
        if not new:
            return sorted(sent)
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        sent.update(new)


@pytest.mark.slow  # a Prefect server, three workers and three flow runs: minutes; CI runs it
@pytest.mark.e2e
@pytest.mark.skipif(pg_bin() is None and not IN_CI, reason="PostgreSQL is not installed (.ci/run installs it)")
def test_three_workers_two_chips_one_study_per_chip_one_store(tmp_path: Path) -> None:
    import httpx
    import optuna
    import prefect_api
    from optuna.trial import TrialState

    from kernsearch.studies._storage import GRACE_BEATS, make_storage

    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, **TELEMETRY_OFF, "PREFECT_HOME": str(prefect_api.migrated_home(tmp_path / "prefect-home")),
           "PREFECT_API_URL": api, "PREFECT_UI_ENABLED": "false", "PREFECT_SERVER_UI_ENABLED": "false",
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
            machines = {"mini-a": "M2 Max", "mini-b": "M2 Max", "studio-c": "M3 Max", "mini-d": "M2 Max"}
            workers: dict[str, subprocess.Popen] = {}

            def start_worker(machine: str) -> None:
                chip = machines[machine]
                pool = "kernsearch-" + chip.lower().replace(" ", "-")
                workers[machine] = start(machine, [*PREFECT, "worker", "start", "--pool", pool, "--limit", "1",
                                                   "--name", machine],
                                         {"KERNSEARCH_CHIP": chip, "KERNSEARCH_MACHINE": machine})

            def run_deployment(chip: str, *params: str) -> str:
                t = subprocess.run([*PREFECT, "deployment", "run", f"kernsearch-nightly/nightly-{chip}",
                                    *[a for p in params for a in ("--param", p)]], env=env,
                                   capture_output=True, text=True, timeout=180)
                assert t.returncode == 0, t.stdout + t.stderr
                return re.search(r"UUID: ([0-9a-f-]{36})", t.stdout).group(1)  # type: ignore[union-attr]

            for machine in ("mini-a", "mini-b", "studio-c"):
                start_worker(machine)
            ids: dict[str, str] = {}
            for label, chip in (("m2-1", "m2-max"), ("m2-2", "m2-max"), ("m3-1", "m3-max")):
                ids[label] = run_deployment(chip)

            def ask(method: str, path: str, **kw: Any) -> Any:
                """The API's answer, or None when the server is too busy to answer in time (asked again)."""
                try:
                    return httpx.request(method, f"{api}{path}", timeout=30, **kw).json()
                except httpx.TimeoutException:
                    return None

            def all_finished() -> list[dict] | None:
                runs = [ask("GET", f"/flow_runs/{i}") for i in ids.values()]
                if not all(runs):
                    return None
                done = all(r["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") for r in runs)
                return runs if done else None

            runs = _wait(all_finished, 480, "the three flow runs", procs)
            assert [r["state"]["type"] for r in runs] == ["COMPLETED"] * 3, [r["state"] for r in runs]

            # each chip's runs ran on that chip's machines only (the flow logs the machine it ran on)
            def ran_on_machine(run_id: str, label: str) -> str:
                def machine_logged() -> list[str] | None:  # logs reach the server in batches
                    logs_ = ask("POST", "/logs/filter", json={"logs": {"flow_run_id": {"any_": [run_id]}}}) or []
                    found = [m.group(1) for e in logs_ if (m := re.search(r"on machine (\S+):", e["message"]))]
                    return found or None

                found = _wait(machine_logged, 90, f"the machine line of run {label}", [server])
                assert len(found) == 1, found
                return found[0]

            ran_on = {label: ran_on_machine(run_id, label) for label, run_id in ids.items()}
            assert machines[ran_on["m3-1"]] == "M3 Max"
            assert {machines[ran_on["m2-1"]], machines[ran_on["m2-2"]]} == {"M2 Max"}
            # the two M2 Max runs ran on the two M2 Max machines (a worker with --limit 1 skips a run while busy):
            # the study below was shared across workers, not resumed by one
            assert {ran_on["m2-1"], ran_on["m2-2"]} == {"mini-a", "mini-b"}, ran_on

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

            # A machine dies mid-trial (every process of it killed at once): another machine's run fails the
            # dead trial by its stopped heartbeat, evaluates its config again, and the study goes on. Each trial
            # of this job is verified on the interpreter (a compile each), so a trial lasts long enough to be
            # caught running.
            long_jobs = write(tmp_path / "long.toml", JOBS.format(url=pg.url, trials=16)
                              .replace('name = "square"', 'name = "long"').replace("64,64,64", "72,72,72")
                              .replace("[defaults]", '[defaults]\nverify = "all"'))
            stop(workers["mini-b"])  # mini-a is the only M2 Max machine left: it takes the next run
            doomed = run_deployment("m2-max", f"job_file={long_jobs}")

            def study_trials() -> list:
                names = [s.study_name for s in optuna.get_all_study_summaries(storage) if "72x72x72" in s.study_name]
                return optuna.load_study(study_name=names[0], storage=storage).get_trials() if names else []

            # (mini-a is the only M2 Max machine up: the run is its; the flow logs its machine only at the end)
            from kernsearch import Space, get_chip, load_family, make_problem

            m2 = get_chip("M2 Max")
            space = Space(make_problem(load_family("gemm"), (72, 72, 72), "float16", m2), m2)

            def evaluated_now(trials: list) -> list:
                """The one running trial, if it is past the sampler and the checks (a valid config never seen
                before, no verdict yet): being compiled and verified, not being proposed."""
                running = [t for t in trials if t.state == TrialState.RUNNING]
                if len(running) != 1 or "config" not in running[0].user_attrs or "status" in running[0].user_attrs:
                    return []
                config = running[0].user_attrs["config"]
                seen = [t.user_attrs.get("config") for t in trials if t.number != running[0].number]
                return running if not space.violations(config) and config not in seen else []

            deadline = time.monotonic() + 300
            while True:  # freeze mini-a's whole tree; kill it if a trial is being evaluated, else thaw and retry
                assert time.monotonic() < deadline, "no trial of the long job was seen evaluated on mini-a"
                assert workers["mini-a"].poll() is None
                frozen = _signal_tree(workers["mini-a"].pid, signal.SIGSTOP)
                trials = study_trials()
                running = evaluated_now(trials)
                if running and sum(t.state == TrialState.COMPLETE for t in trials) >= 2:
                    break
                _signal_tree(workers["mini-a"].pid, signal.SIGCONT)
                time.sleep(0.2)
            _signal_tree(workers["mini-a"].pid, signal.SIGKILL)
            workers["mini-a"].wait(timeout=30)
            # SIGKILLed processes take a moment to exit (the worker alone was waited for): give them 60 s
            all_gone = _wait_until(lambda: not [pid for pid in frozen if _live(pid)], 60)
            assert all_gone, f"processes of the killed machine still alive: {[p for p in frozen if _live(p)]}"
            dead = running[0]
            time.sleep(GRACE_BEATS * 2 + 1)  # its heartbeat (every 2 s here) is now stale to anyone who looks
            start_worker("mini-d")
            rescue = run_deployment("m2-max", f"job_file={long_jobs}")

            def rescued() -> dict | None:
                run = ask("GET", f"/flow_runs/{rescue}")
                if not run:
                    return None
                state = run["state"]
                return state if state["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None

            assert _wait(rescued, 480, "the rescue run", [server, workers["mini-d"]])["type"] == "COMPLETED"
            assert ran_on_machine(rescue, "rescue") == "mini-d"
            assert prefect_api.get(f"{api}/flow_runs/{doomed}", timeout=60).json()["state"]["type"] != "COMPLETED"
            after = study_trials()
            assert next(t for t in after if t.number == dead.number).state == TrialState.FAIL
            again = [t for t in after if t.number > dead.number and t.params == dead.params]
            assert [t.user_attrs.get("status") for t in again] in (["ok"], ["failed"]), again  # evaluated again
            evaluated = [t for t in after if t.user_attrs.get("status") in ("ok", "failed")]
            assert len(evaluated) >= 16 and not [t for t in after if t.state == TrialState.RUNNING]
            store_long = tmp_path / "store" / "gemm" / "M2-Max" / "float16" / "72x72x72"
            assert sorted(p.parent.name for p in store_long.glob("v*/manifest.json")) == ["v1"]
        finally:
            for p in reversed(procs):  # stop every process this test started (and their children)
                stop(p)
            for f in logs:
                f.close()
    assert all(p.poll() is not None for p in procs) and not any(alive(p.pid) for p in procs)
    assert not pg.running()
    # and no process of theirs survived anywhere (a flow run's step process lives in a session of its own)
    marker = f"KERNSEARCH_HOME={env['KERNSEARCH_HOME']}"
    assert _wait_until(lambda: not _marked(marker), 60), f"still running: {_marked(marker)}"

"""Issue 17: CLI conventions (--version, -h, completion) and the friction points a new user met."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest

KERNSEARCH = [sys.executable, "-m", "kernsearch"]


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(KERNSEARCH + list(args), capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, **env})


@pytest.mark.slow
def test_version_help_and_completion() -> None:
    from importlib.metadata import version

    v = _run("--version")
    assert v.returncode == 0 and v.stdout.strip() == f"kernsearch {version('kernsearch')}"
    for args in (["-h"], ["tune", "-h"], ["artifacts", "list", "-h"], ["flows", "run", "-h"]):
        r = _run(*args)
        assert r.returncode == 0 and "Usage:" in r.stdout, (args, r.stderr)
    assert "--install-completion" in _run("-h").stdout
    # as a bash user runs it: Typer names the shell it finds among the command's parents (under `make`,
    # `sh`, which it does not support), so the command runs from bash (two commands: bash does not exec it)
    script = subprocess.run(["bash", "-c", shlex.join(KERNSEARCH + ["--show-completion"]) + "; exit $?"],
                            capture_output=True, text=True, timeout=300, check=False)
    assert script.returncode == 0 and "complete -o default -F _kernsearch_completion kernsearch" in script.stdout
    # what bash asks for while the user types `kernsearch tu<TAB>` and `kernsearch tune gemm --ba<TAB>`
    words = _run(_KERNSEARCH_COMPLETE="complete_bash", COMP_WORDS="kernsearch tu", COMP_CWORD="1")
    assert words.stdout.split() == ["tune"]
    words = _run(_KERNSEARCH_COMPLETE="complete_bash", COMP_WORDS="kernsearch tune gemm --ba", COMP_CWORD="3")
    assert words.stdout.split() == ["--backend"]


@pytest.mark.slow
def test_verify_samples_big_problems_on_the_interpreter_and_says_so() -> None:
    r = _run("verify", "gemm", "--shape", "1024,1024,32", "--config", "BM=32,BN=32")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "9 of 1024 threadgroups" in r.stdout and "sampled" in r.stdout
    small = _run("verify", "gemm", "--shape", "64,64,32", "--config", "BM=32,BN=32")
    assert small.returncode == 0 and "sampled" not in small.stdout  # 4 threadgroups: all of them run


def test_metal_refusal_hint_leads_somewhere_that_works() -> None:
    r = _run("tune", "gemm", "--backend", "metal", "--trials", "1")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "--backend model" in r.stderr and "kernsearch verify --backend cpu" in r.stderr
    assert "or cpu to check" not in r.stderr  # `tune --backend cpu` is itself refused


def test_replay_study_key_names_a_chip_and_no_dash_dtype(tmp_path) -> None:
    from kernsearch.studies._landscape import LandscapeWriter
    from kernsearch.studies._replay import Replay, replay_chip_name

    assert replay_chip_name("NVIDIA GeForce RTX 3090") == "RTX 3090"
    assert replay_chip_name("NVIDIA H100 80GB HBM3") == "H100"  # a device the registry knows: its name
    # a KernelTuner cache file as the device recorded it (no dtype in it), written here: never skipped
    land = tmp_path / "pnpoly_RTX_3090.json.gz"
    writer = LandscapeWriter(land, {"block_size_x": [32, 64]}, device_name="NVIDIA GeForce RTX 3090",
                             kernel_name="cn_pnpoly", problem_size=[20000000])
    writer.add({"block_size_x": 32}, [1.0, 1.1])
    writer.add({"block_size_x": 64}, [0.9, 0.95])
    writer.save()
    key = Replay(str(land)).objective("pnpoly").study_key
    assert key["chip"] == "RTX 3090" and key["dtype"] == "unknown-dtype" and key["backend"] == "replay"


def test_tune_without_a_compiler_refuses_before_searching(tmp_path) -> None:
    r = _run("tune", "gemm", "--shape", "64,64,64", "--trials", "3", PATH=str(tmp_path), KERNSEARCH_HOME=str(tmp_path))
    assert r.returncode == 2 and r.stderr.splitlines()[-1].startswith("error: ") and "g++" in r.stderr
    assert "trial 1/" not in r.stderr and "--verify none" in r.stderr  # refused before any trial, with a way on
    assert r.stderr.count("\n") <= 3  # the modeled note, the error; no traceback


@pytest.mark.slow
def test_dashboard_serves_the_studies_with_compact_attributes(tmp_path) -> None:
    import json
    import signal
    import socket
    import time
    import urllib.request

    env = {"KERNSEARCH_HOME": str(tmp_path)}
    tuned = _run("tune", "gemm", "--shape", "64,64,64", "--trials", "6", "--verify", "none", **env)
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(KERNSEARCH + ["dashboard", "--port", str(port)], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, studies = time.monotonic() + 60, None
        while studies is None and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=20) as r:
                    studies = json.load(r)["study_summaries"]
            except OSError:
                time.sleep(0.5)
        assert studies is not None, "optuna-dashboard did not answer in 60 s"
        (study,) = studies
        assert study["study_name"] == "gemm/M2 Max/float16/64x64x64/model"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{study['study_id']}?after=0",
                                    timeout=10) as r:
            trials = json.load(r)["trials"]
        attrs = [{a["key"]: a["value"] for a in t["user_attrs"]} for t in trials]
        ok = [a for a in attrs if a.get("status") == "ok"]
        assert ok and all("BM" in a["config"] for a in ok)
        assert max(len(a.get("record", "")) for a in ok) < 600  # compact: readable in the dashboard's table
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"the dashboard did not stop on SIGTERM: {err[-3000:]}") from None
    assert proc.returncode == 0, err[-2000:]
    assert "open http://127.0.0.1:" in err and "Traceback" not in err
    bad = _run("dashboard", "--port", "70000", **env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1

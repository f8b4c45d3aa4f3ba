"""Nothing wrong is published by a search measured on a GPU either (issue 36): `tune --publish` on a device (here
``benchmarks/interpreted_gpu.py``: the metal back-end's verification runs, kernels on the interpreter in grid order,
no check of its own) refuses an off-by-one at the ragged edge of a copy of the built-in gemv, with a FAIL line naming
its kind: a write past Y's end through the guard zone on the device, a read past W's end (invisible on a GPU)
through the interpreter's sanitized ragged check of the Metal template. The clean copy's winner records the checks
it passed. ``benchmarks/gpu_planted_bugs.py`` runs the same on a real GPU (its CUDA template planted)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernsearch.family._spec import builtin_families_dir

REPO = Path(__file__).resolve().parents[1]
WRITE = [("m0 + i < M && n0 + r < N", "m0 + i < M && n0 + r <= N"),
         ("m0 + i < M && c0 + e < N", "m0 + i < M && c0 + e <= N")]  # both layouts' write guards
READ = [("            if (n0 + r < N) {", "            if (n0 + r <= N) {")]  # the nk layout's load guard only


def tune(tmp_path: Path, changes: list[tuple[str, str]], *extra: str) -> subprocess.CompletedProcess[str]:
    folder = tmp_path / "gemv"
    shutil.copytree(builtin_families_dir() / "gemv", folder)
    text = (folder / "gemv.metal.j2").read_text()
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    (folder / "gemv.metal.j2").write_text(text)
    env = dict(os.environ, KERNSEARCH_ARTIFACTS=str(tmp_path / "store"), COLUMNS="200",
               PYTHONPATH=os.pathsep.join([str(REPO / "benchmarks"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "kernsearch", "tune", str(folder), "--backend",
                           "interpreted_gpu:InterpretedGPU", "--chip", "M2 Max", "--shape", "3,256,256", "--trials",
                           "6", "--storage", ":memory:", *extra], capture_output=True, text=True, timeout=900,
                          cwd=tmp_path, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["write", "read"])
def test_an_off_by_one_at_the_ragged_edge_is_never_published_from_the_device(tmp_path: Path, bug: str) -> None:
    done = tune(tmp_path, WRITE if bug == "write" else READ, "--publish")
    out = done.stdout + done.stderr
    assert "published as" not in out and not list((tmp_path / "store").rglob("manifest.json")), out[-4000:]
    fails = [line for line in out.splitlines() if line.startswith("trial ") and "FAIL (device_bounds)" in line]
    assert fails, out[-4000:]
    if bug == "write":  # every finalist: the guard zone after Y changed on the device
        assert all("a write past the end of output Y on the device" in line for line in fails), fails
    else:  # the device saw nothing; the interpreter's sanitizer build names the template line
        assert all("on the interpreter" in line and "gemv.metal.j2:" in line and "outside a device buffer" in line
                   for line in fails), fails


@pytest.mark.slow
def test_the_clean_winner_records_the_checks_it_passed(tmp_path: Path) -> None:
    done = tune(tmp_path, [], "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout)
    final = data["final"]
    check = final["checks"][str(final["winner"])]
    assert check["ok"] and check["also"] and check["bounds"] == {
        "device": True, "interpreter": "metal", "target": "metal", "why_not": ""}


@pytest.mark.slow
@pytest.mark.e2e
def test_the_gpu_script_dry_runs(tmp_path: Path) -> None:
    """``benchmarks/gpu_planted_bugs.py --dry-run``: every case as its docstring states (exit 0), its summary written.
    The e2e lane's (CI: make test-all): the script runs the three cases above (clean, the read and the write past the
    edge) again, through the script, in processes; make test runs them here."""
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_planted_bugs.py"), "--dry-run", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cases = json.loads((tmp_path / "gpu_planted_bugs_dry-run.json").read_text())
    assert [(c["name"], c["ok"], c["published"]) for c in cases] == [
        ("clean", True, False), ("write_off_by_one", True, False), ("read_off_by_one", True, False)]

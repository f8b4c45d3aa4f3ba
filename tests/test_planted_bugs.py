"""Nothing wrong is published (issue 36): four bugs planted in a user's family (tests/families/gate_gemv, a gated
GEMV for decoding, one template line each) and `tune --publish` refuses every one, with a line naming the bug's
kind and, where the checks can, its template line.

- an off-by-one at the ragged edge (the row guard ``n0 + r <= N``: reads a row past Wg and Wu, writes past a row
  of Y): the next threadgroup's right value used to overwrite the bad one, and the write past Y's end landed where
  nothing was compared; now the ragged shape is off every tile, threadgroups run in reverse, a guard zone after
  each output must stay untouched, and the sanitizer build names the line;
- a missing barrier (partial sums read before they are written): check mode names it;
- float16 accumulation: out of tolerance at the tuned shape;
- a template changed under a resumed study: the study's family hash differs, so the run works in another study
  (the old proof is never reused).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FAMILY = Path(__file__).parent / "families" / "gate_gemv"
TEMPLATE = "gate_gemv.metal.j2"
BUGS = {
    "off_by_one": ("const bool live = n0 + r < N;", "const bool live = n0 + r <= N;"),
    "missing_barrier": ("        su[tid] = u;\n        threadgroup_barrier(mem_flags::mem_threadgroup);\n",
                        "        su[tid] = u;\n"),
    "float16_accumulation": ("float g = 0.0f;\n        float u = 0.0f;", "T g = 0.0f;\n        T u = 0.0f;"),
}
WRITES_ZEROS = ("Y[b * N + n0 + r] = T(gate * su[0]);", "Y[b * N + n0 + r] = T(0.0f * gate);")


def plant(tmp_path: Path, change: tuple[str, str] | None, name: str = "gate_gemv") -> Path:
    folder = tmp_path / name
    if not folder.exists():
        shutil.copytree(FAMILY, folder)
    if change is not None:
        text = (folder / TEMPLATE).read_text()
        assert change[0] in text, change
        (folder / TEMPLATE).write_text(text.replace(change[0], change[1]))
    return folder


def tune(folder: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`kernsearch tune FOLDER --publish` on the model of an M2 Max, every config of the small space evaluated;
    the store is named by the environment (as a user's shell would), under ``tmp_path``."""
    env = dict(os.environ, KERNSEARCH_ARTIFACTS=str(tmp_path / "store"), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "kernsearch", "tune", str(folder), "--backend", "model", "--chip",
                           "M2 Max", "--trials", "6", "--publish", *extra], capture_output=True, text=True,
                          timeout=900, cwd=tmp_path, env=env)


def published(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "store").glob("gate_gemv/**/manifest.json"))


@pytest.mark.slow
def test_the_clean_family_is_published_with_its_bounds_checked(tmp_path: Path) -> None:
    done = tune(plant(tmp_path, None), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "published as v1" in done.stdout and "bounds: checked" in done.stdout, done.stdout[-3000:]
    assert published(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_planted_bug_is_never_published(tmp_path: Path, bug: str) -> None:
    # one finalist where the sanitizer names the bug: its build and run (~4 s of CPU) are the same for each leader
    done = tune(plant(tmp_path, BUGS[bug]), tmp_path, *(["--finalists", "1"] if bug == "off_by_one" else []))
    text = done.stdout + done.stderr
    assert "published as" not in text and not published(tmp_path), text[-4000:]
    fails = [line for line in text.splitlines() if "FAIL (" in line]
    assert fails, text[-4000:]
    if bug == "off_by_one":  # the kind and the template line of the read past Wg's end
        assert any("FAIL (device_bounds)" in line and f"{TEMPLATE}:" in line for line in fails), fails
    elif bug == "missing_barrier":  # check mode names it with its template line
        assert any(("race" in line or "uninitialized" in line) and f"{TEMPLATE}:" in line for line in fails), fails
    else:
        assert any("FAIL (wrong)" in line for line in fails), fails


@pytest.mark.slow
def test_a_template_changed_under_a_resumed_study_is_never_published_on_the_old_proof(tmp_path: Path) -> None:
    folder = plant(tmp_path, None)
    first = subprocess.run([sys.executable, "-m", "kernsearch", "tune", str(folder), "--backend", "model", "--chip",
                            "M2 Max", "--trials", "6", "--study", "S"], capture_output=True, text=True, timeout=900,
                           cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    plant(tmp_path, WRITES_ZEROS)
    done = tune(folder, tmp_path, "--study", "S")
    text = done.stdout + done.stderr
    assert "published as" not in text and not published(tmp_path), text[-4000:]
    assert "was made from another version of family gate_gemv" in done.stderr, done.stderr[-3000:]
    assert "FAIL (wrong)" in done.stdout, done.stdout[-3000:]

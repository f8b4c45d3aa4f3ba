"""Helpers for the adversarial suite: hostile family folders and the CLI run as a user runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GEMM_DIR = REPO / "templates" / "gemm"


def ks(*args: str, cwd: Path | None = None, timeout: float = 120, env: dict[str, str] | None = None
       ) -> subprocess.CompletedProcess[str]:
    """``python -m kernsearch ARGS`` in a fresh process (what a user or a nightly job runs)."""
    return subprocess.run([sys.executable, "-m", "kernsearch", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})})


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 2, exactly one line on stderr, no traceback; the line contains every needle."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def hostile_family(tmp_path: Path) -> Callable[..., Path]:
    """``make(toml=lambda text: text, metal=lambda text: text, name="fam")``: a copy of gemm, edited."""

    def make(toml: Callable[[str], str] = lambda t: t, metal: Callable[[str], str] = lambda t: t,
             name: str = "fam") -> Path:
        folder = tmp_path / name
        shutil.copytree(GEMM_DIR, folder)
        spec = folder / "family.toml"
        spec.write_text(toml(spec.read_text()))
        tmpl = folder / "gemm.metal.j2"
        tmpl.write_text(metal(tmpl.read_text()))
        return folder

    return make


def set_key(text: str, key: str, value: str) -> str:
    """Replace the top-level ``key = ...`` line of a family.toml."""
    out, done = [], False
    for line in text.splitlines():
        hit = not done and line.startswith(f"{key} =")
        out.append(f"{key} = {value}" if hit else line)
        done = done or hit
    return "\n".join(out) + "\n"


def _test_artifacts():  # noqa: ANN202 - the store helpers of tests/test_artifacts.py (one definition)
    import importlib.util

    spec = importlib.util.spec_from_file_location("_ks_test_artifacts", REPO / "tests" / "test_artifacts.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


_ARTS = _test_artifacts()
KEY, candidate, key = _ARTS.KEY, _ARTS.candidate, _ARTS.key

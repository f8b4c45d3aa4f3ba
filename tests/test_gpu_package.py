"""benchmarks/gpu_package.py's dry run: export, install and import the wheel of artifacts/, decide every row.

The e2e lane's (CI: make test-all): a benchmark script's dry run end to end over tune, verify, publish and export,
which make test's own tests run (its line coverage of kernsearch is the same without these: benchmarks/
test_suite_time.txt, ninth pass); the lead runs them before spending device time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.e2e  # the module docstring says why
#: The seven calls of issue 11's table (shape MxNxK, dtype): the benchmark must cover each.
ISSUE_ROWS = {("4096x4096x4096", "float16"), ("16x4096x4096", "float16"), ("2048x2048x2048", "float16"),
              ("3000x5000x2000", "float16"), ("8192x8192x8192", "float16"), ("1x4096x4096", "float16"),
              ("4096x4096x4096", "bfloat16"), ("1024x1024x1024", "float32")}


@pytest.mark.slow
def test_dry_run_installs_the_wheel_and_decides_every_row(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_package.py"), "--dry-run",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "imported kernsearch_kernels 0.0.1 from" in proc.stdout
    assert "/site/kernsearch_kernels" in proc.stdout  # the installed copy, not the source tree
    result = json.loads((tmp_path / "gpu_package.json").read_text())
    assert result["chip"] == "H100" and result["env"]["dry_run"] is True
    rows = {(r["shape"], r["dtype"]): r for r in result["rows"]}
    assert ISSUE_ROWS <= set(rows)
    for row in rows.values():
        assert row["level"] and row["chose"] and row["why"]  # the package said what it chose and why
        if row["package_ms"] is not None:  # MLX present: the CPU call path ran and agreed with mx.matmul
            assert row["max_rel_error"] < 1e-2
    assert "| gemm 4096x4096x4096 bfloat16 |" in proc.stdout

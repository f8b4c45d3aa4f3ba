"""The public API: kernsearch.__all__ is the documented surface, and docs/api.md's example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_all_lists_the_documented_names_and_each_resolves() -> None:
    import kernsearch

    doc = (REPO / "docs" / "api.md").read_text()
    for name in kernsearch.__all__:
        assert getattr(kernsearch, name) is not None
        assert f"`{name}" in doc, f"{name} is public but not documented in docs/api.md"
    with pytest.raises(AttributeError):
        kernsearch.no_such_thing  # noqa: B018


def test_import_kernsearch_stays_cheap() -> None:
    code = "import sys, kernsearch; print(sorted(m for m in ('optuna', 'mlx', 'prefect', 'jinja2') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.slow
def test_the_documented_example_runs(tmp_path: Path) -> None:
    """As a user runs it: saved as a script (issue 24: without its __main__ guard, the worker processes that import
    the script again printed ~230 lines of tracebacks)."""
    block = re.search(r"```python\n(.*?)```", (REPO / "docs" / "api.md").read_text(), re.S).group(1)
    (tmp_path / "example.py").write_text(block)
    out = subprocess.run([sys.executable, "example.py"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "Error" not in out.stderr, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert "modeled" in lines[0] and "the baseline" in lines[1] or "not modeled" in lines[1]
    assert lines[2].startswith("True ") and lines[3].endswith(".whl")


@pytest.mark.slow
def test_the_documented_variant_run_example_runs(tmp_path: Path) -> None:
    """docs/api.md's `kernsearch.run` block, as written, in a fresh process."""
    doc = (REPO / "docs" / "api.md").read_text()
    block = re.search(r"## Example: check a variant against your own NumPy.*?```python\n(.*?)```", doc, re.S).group(1)
    out = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "(3, 256) interpreted True"


def test_run_gives_every_output_and_refuses_bad_inputs() -> None:
    import numpy as np

    import kernsearch as ks

    family = REPO / "tests" / "families" / "residual_rmsnorm"
    x, r = np.full((2, 64), 0.5), np.full((2, 64), 0.25)
    result = ks.run(family, "TG=32,VEC=2", dtype="float32", inputs={"x": x, "r": r}, mode="check")
    assert result.shape == (2, 64) and set(result.outputs) == {"y", "h"} and not result.diagnostics
    np.testing.assert_array_equal(result.outputs["h"], 0.75)  # h = x + r
    np.testing.assert_allclose(result.outputs["y"], result.inputs["w"] * np.ones((2, 1)), rtol=1e-5)  # rms(h) = h
    with pytest.raises(ks.KernsearchError, match="no input named q"):
        ks.run(family, inputs={"q": x})
    with pytest.raises(ks.KernsearchError, match=r"input r has shape \(2, 63\); at 2x64 the spec says"):
        ks.run(family, "TG=32,VEC=1", dtype="float32", inputs={"x": x, "r": r[:, :63]})
    with pytest.raises(ks.VariantFailure):
        ks.run("gemm", "BM=64", shape="8,8,8", dtype="float32", timeout=0.001)

"""benchmarks/gpu_families.py --dry-run: the whole plan runs without a GPU (modeled times, interpreter checks),
writes a landscape in KernelTuner cache format, a report whose goals are stated, and a store of modeled
versions (never dispatched).

The e2e lane's (CI: make test-all): a benchmark script's dry run end to end over tune, verify, publish and export,
which make test's own tests run (its line coverage of kernsearch is the same without these: benchmarks/
test_suite_time.txt, ninth pass); the lead runs them before spending device time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.e2e  # the module docstring says why


@pytest.mark.slow
def test_dry_run_writes_landscapes_report_goals_and_modeled_store(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import gpu_families
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    from kernsearch.studies._landscape import Landscape

    report = gpu_families.main(["--out", str(tmp_path), "--dry-run", "--budget", "300", "--landscape", "10",
                                "--rounds", "5", "--families", "rmsnorm,swiglu"])
    text = capsys.readouterr().out
    assert "DRY RUN" in text and "goals (issue 13)" in text
    for fam, large in (("rmsnorm", {"4096x4096", "16384x4096"}), ("swiglu", {"4096x11008", "4096x14336"})):
        land = report["families"][fam]["landscape"]
        assert land["measured"] == 10
        loaded = Landscape.load(tmp_path / land["file"])
        assert len(loaded.entries) == 10 and json.loads((tmp_path / land["file"]).read_text())["evidence"].startswith(
            "dry-run")
        rows = {r["problem"]: r for r in report["families"][fam]["rows"]}
        assert set(rows) == large | {"32x8192", "1x4096"}
        for r in rows.values():
            assert r["evidence"].startswith("dry-run") and r["tuned"]["median_ms"] > 0 and r["op"]["speedup"] > 0
            assert r["tuned"]["pct_copy"] > 0
            assert ("per_call_ms" in r) == r["small"]
        assert ("eager" in rows["4096x11008"]) == (fam == "swiglu") if fam == "swiglu" else True
    goals = [g["goal"] for g in report["goals"]]
    assert "swiglu >= 1.5x the eager silu(a) * b at the large shapes" in goals
    assert "rmsnorm >= 1.0x mx.fast.rms_norm at the large shapes" in goals
    assert {g["met"] for g in report["goals"] if g["goal"].startswith(("rmsnorm", "swiglu"))} <= {True, False}
    assert all(g["met"] is None for g in report["goals"] if g["goal"].startswith(("layernorm", "softmax")))
    manifests = [m for m in (tmp_path / "store").rglob("manifest.json")]
    assert manifests and all(json.loads(m.read_text())["evidence"] == "modeled" for m in manifests)
    assert (tmp_path / "families.json").is_file()

"""benchmarks/gpu_decode.py --dry-run: the whole plan runs without a GPU (modeled times, interpreter checks),
writes a landscape in KernelTuner cache format, a report with goals, and a store whose versions say modeled.

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
def test_dry_run_writes_landscape_report_and_modeled_store(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import gpu_decode
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    from kernsearch.studies._landscape import Landscape

    report = gpu_decode.main(["--out", str(tmp_path), "--dry-run", "--budget", "300", "--landscape", "12",
                              "--rounds", "5", "--problems", "1,4096,4096;16,11008,4096"])
    text = capsys.readouterr().out
    assert "DRY RUN" in text and "measured" not in report["families"]["gemv"]["rows"][0]["evidence"].replace(
        "not measured", "")
    land = report["families"]["gemv"]["landscape"]
    assert land["measured"] == 12 and land["spearman_model_vs_measured"] is not None
    path = tmp_path / land["file"]
    loaded = Landscape.load(path)
    assert len(loaded.entries) == 12 and json.loads(path.read_text())["evidence"].startswith("dry-run")
    rows = {r["problem"]: r for r in report["families"]["gemv"]["rows"]}
    assert set(rows) == {"1x4096x4096", "16x11008x4096"}
    for r in rows.values():
        assert r["tuned"]["median_ms"] > 0 and r["op"]["median_ms"] > 0 and 0 < r["tuned_pct_copy"]
        assert r["publish"]["published"] is False or "modeled" in r["publish"]["reason"]
    goals = {g["goal"]: g for g in report["goals"]}
    assert goals["gemv >= 1.0x mx.matmul at M=1"]["met"] in (True, False)
    assert goals["qmatvec >= 1.5x mx.quantized_matmul at M=4 and 16"]["met"] is None or "qmatvec" not in report[
        "left_out"][0]
    assert (tmp_path / "decode.json").is_file() and "goals (issue 15)" in text
    manifests = list((tmp_path / "store").rglob("*.json"))
    assert manifests and all("measured" != json.loads(m.read_text()).get("evidence") for m in manifests)

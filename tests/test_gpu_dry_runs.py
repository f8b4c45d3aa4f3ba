"""The GPU scripts of issue 31 dry-run here, on the simulated GPU (benchmarks/simulated_gpu.py): what the lead
checks before spending device time. Nothing they write in a dry run is a measurement, and they say so.

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


def _script(name: str):  # noqa: ANN202
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


@pytest.mark.slow
def test_gpu_throughput_dry_run_times_both_arms_on_the_same_configs(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    report = _script("gpu_throughput").main(["--dry-run", "--out", str(tmp_path), "--configs", "4", "--compile-s",
                                             "0.2", "--workers", "2", "--noise", "0", "--shape", "64,64,64"])
    written = json.loads((tmp_path / "gpu_throughput_dry-run.json").read_text())
    assert written["dry_run"] and "nothing measured" in written["evidence"]
    serial, pipeline = written["arms"]
    assert serial["evaluated"] == pipeline["evaluated"] == 4 and not serial["failures"] and not pipeline["failures"]
    assert serial["compile_workers"] == 0 and not serial["racing"] and pipeline["racing"]
    # today's loop: the timing worker compiles each variant itself; the pipeline's only loads what was compiled
    assert serial["not_winning"] == 0 and serial["timer_first_launch_s_mean"] >= 0.2
    assert pipeline["timer_first_launch_s_mean"] < 0.1 and pipeline["timer_waited_for_compilers_s"] >= 0.2
    for key in ("serial_configs_per_min", "configs_per_min", "serial_winner", "serial_winner_ms", "winner",
                "winner_ms", "head_to_head", "ratio"):
        assert written[key] is not None, key
    assert report["ratio"] == pytest.approx(written["configs_per_min"] / written["serial_configs_per_min"])


@pytest.mark.slow
def test_gpu_landscape_dry_run_writes_partial_landscapes_when_cut_off(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from kernsearch.studies._landscape import Landscape

    summaries = _script("gpu_landscape").main(["--dry-run", "--out", str(tmp_path), "--pairs", "swiglu:128,512",
                                               "rmsnorm:64,256", "--limit", "400", "--time-limit", "10",
                                               "--workers", "2", "--compile-s", "0.2"])
    assert [s["file"] for s in summaries] == ["swiglu_H100_float16_128x512.json", "rmsnorm_H100_float16_64x256.json"]
    swiglu = json.loads((tmp_path / summaries[0]["file"]).read_text())
    assert swiglu["evidence"].startswith("dry run") and swiglu["toolchain"]["mlx"] and swiglu["chip"] == "H100"
    land = Landscape.load(tmp_path / summaries[0]["file"])
    measured = [e for e in land.entries.values() if not land.failed(e)]
    assert measured and all(len(e["times"]) == 10 for e in measured)  # every sample of LANDSCAPE_PLAN kept
    # cut off by the time limit: what was left is NotMeasured (dropped on reading), never a failure
    assert summaries[0]["failed_or_left"].get("NotMeasured", 0) + len(measured) == summaries[0]["swept"]
    assert land.meta["not_measured"] == summaries[0]["failed_or_left"]["NotMeasured"] > 0
    # a second run resumes: what the first measured is kept, only its NotMeasured configs are swept
    again = _script("gpu_landscape").main(["--dry-run", "--out", str(tmp_path), "--pairs", "swiglu:128,512",
                                           "--limit", "400", "--time-limit", "4", "--workers", "2",
                                           "--compile-s", "0.2"])
    assert again[0]["kept_from_before"] == len(land.entries) and again[0]["measured"] >= len(measured)
    kept = Landscape.load(tmp_path / summaries[0]["file"])
    assert all(kept.entries[k]["times"] == e["times"] for k, e in land.entries.items())


@pytest.mark.slow
def test_gpu_compile_cache_dry_run_shows_a_kernel_compiled_again_in_another_process(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    report = _script("gpu_compile_cache").main(["--dry-run", "--out", str(tmp_path), "--configs", "1",
                                                "--compile-s", "0.3", "--shape", "64,64,64"])
    written = json.loads((tmp_path / "gpu_compile_cache_dry-run.json").read_text())
    assert written == json.loads(json.dumps(report, default=str)) and "nothing measured" in written["evidence"]
    (row,) = written["configs"]
    # the simulated GPU keeps a kernel in the process that compiled it, as MLX does: a lookup there, a compile
    # in any other process, and nothing in the PTX cache folder
    assert row["compile_s"] >= 0.3 and row["same_process_s"] < 0.1 <= 0.3 <= row["fresh_process_s"]
    assert written["met"] and written["cache_dir"]["custom_kernel_files"] == []
    assert set(written["threads"]) >= {"serial_s", "threads_s", "concurrent"}


@pytest.mark.slow
def test_gpu_tune_budget_dry_run_counts_the_configs_a_timed_tune_evaluates(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    _script("gpu_tune_budget").main(["--dry-run", "--out", str(tmp_path), "--time-budget", "8s",
                                     "--compile-s", "0.2", "--workers", "2"])
    written = json.loads((tmp_path / "gpu_tune_budget_dry-run.json").read_text())
    (run,) = written["runs"]
    assert written["dry_run"] and run["evaluated"] > 0 and run["elapsed_s"] > 0
    assert run["configs_per_min"] == pytest.approx(run["evaluated"] / run["elapsed_s"] * 60, abs=0.1)
    assert written["before_configs_per_min"] == pytest.approx(27.3, abs=0.1)

"""``kernsearch bench decode --mlx-lm`` (issue 43): mlx-lm's own generation loop on an mlx-lm Llama model, with and
without ``patch``, on MLX's CPU back-end (a dry run: the timings are the CPU's)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from kernsearch import ArtifactStore
from kernsearch.bench._mlx_lm import LmConfig, MlxLmError, run_mlx_lm

TINY = LmConfig(hidden=128, ffn=256, layers=2, heads=4, kv_heads=2, vocab=300, bits=4, group=32, dtype="float16")


@pytest.mark.parametrize(("config", "says"), [
    (LmConfig(bits=3), "4 or 8 bits"),
    (LmConfig(group=16), "groups of 32, 64 or 128"),
    (LmConfig(hidden=4000), "--hidden 4000"),
    (LmConfig(heads=32, kv_heads=5), "--kv-heads 5 divide --heads"),
    (LmConfig(kv_heads=64), "--kv-heads at most --heads"),
    (LmConfig(dtype="int8"), "--dtype int8"),
])
def test_a_config_the_families_cannot_take_is_refused(config: LmConfig, says: str) -> None:
    with pytest.raises(MlxLmError, match=says):
        config.check()


@pytest.mark.slow
def test_the_dry_run_generates_the_same_tokens_patched_and_times_both_interleaved(tmp_path) -> None:
    lines: list[str] = []
    report = run_mlx_lm(TINY, prompt_tokens=12, tokens=34, rounds=2, store=ArtifactStore(tmp_path / "store"),
                        say=lines.append, always=True)  # no kernel runs on the CPU: route the steps all the same
    assert report.device == "cpu" and report.evidence is None
    assert any("CPU's, not a GPU's" in n for n in report.notes)
    assert any("always=True" in n for n in report.notes)
    assert len(report.plain) == len(report.patched) == 2
    assert all(r.decode_tps > 0 and r.prefill_tps > 0 for r in report.plain + report.patched)
    c = report.comparison
    assert c is not None and c.ok and c.generated == 34 and c.same_tokens == 34
    assert c.max_logprob_diff <= c.tolerance
    assert report.patched_layers == 2
    assert "norm + Q/K/V" in report.explain and "down + residual" in report.explain
    data = json.loads(json.dumps(report.to_json()))
    assert data["summary"]["tokens_ok"] is True
    assert data["summary"]["decode_speedup"] == pytest.approx(report.decode_speedup)
    assert data["summary"]["decode_interval"] == [0.0, math.inf]  # two rounds bound nothing, and it says so
    assert data["config"]["kv_heads"] == 2
    assert [line.startswith("round") for line in lines].count(True) == 2


@pytest.mark.slow
def test_the_gpu_command_runs_here_on_the_cpu_and_writes_its_json(tmp_path) -> None:
    out = tmp_path / "data" / "gpu_mlx_lm_cpu.json"
    # MLX's settings of the run's environment (what MLX read at its start, both forms under them) are recorded
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MLX_")}, "MLX_MAX_OPS_PER_BUFFER": "1000"}
    r = subprocess.run([sys.executable, "-m", "kernsearch.bench._mlx_lm", "--hidden", "128", "--ffn", "256",
                        "--layers", "1", "--heads", "4", "--kv-heads", "4", "--vocab", "200", "--group", "32",
                        "--prompt", "8", "--tokens", "32", "--rounds", "1", "--store", str(tmp_path / "store"),
                        "--json", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "decode tokens/s: mlx-lm" in r.stdout
    assert "MLX's settings (both forms): MLX_MAX_OPS_PER_BUFFER=1000" in r.stdout
    data = json.loads(out.read_text())
    assert data["summary"]["tokens_ok"] is True and len(data["plain"]) == 1
    assert data["mlx_settings"] == {"MLX_MAX_OPS_PER_BUFFER": "1000"}
    bad = subprocess.run([sys.executable, "-m", "kernsearch.bench._mlx_lm", "--bits", "3"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "4 or 8 bits" in bad.stderr

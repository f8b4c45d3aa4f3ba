"""benchmarks/gpu_ab_configs.py's candidates: what the GPU run times against a published config (its dry run is all
the CPU can check of it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.mark.slow  # the space's every valid config ranked by the model (~2 s)
def test_candidates_are_valid_distinct_neighbours_and_each_paths_best_never_the_published_config():
    from gpu_ab_configs import candidates

    from kernsearch import get_chip, load_family, make_problem
    from kernsearch.family._space import Space, format_config

    chip = get_chip("H200")
    fam = load_family("qmatvec_residual")
    space = Space(make_problem(fam, "4,4096,4096,512,64", "float16", chip), chip)
    published = {"PATH": "mma", "QBITS": 4, "TW": 1, "KS": 4, "RT": 2, "UNROLL": 4, "MB": 8}
    assert space.is_valid(published)
    picked = candidates(space, published, 8)
    keys = [format_config(c) for _, c in picked]
    assert 5 <= len(picked) <= 8 and len(set(keys)) == len(keys) and format_config(published) not in keys
    assert all(space.is_valid(c) for _, c in picked)
    assert {c["PATH"] for why, c in picked if why.startswith("model's best")} >= {"h2", "fma"}  # the other paths
    for why, cfg in picked:
        if not why.startswith("model's"):
            moved = [k for k in published if cfg[k] != published[k]]
            assert moved == [why.split("=")[0]], (why, cfg)
    few = candidates(space, published, 3)
    assert len(few) == 3 and {c["PATH"] for _, c in few} >= {"h2", "fma"}  # each path's best kept first


def test_only_a_candidate_whose_interval_clears_the_line_is_offered_and_the_best_of_them():
    from gpu_ab_publish import command, picks

    ab = {"rows": [
        {"family": "qmatvec_residual", "shape": [4, 4096, 4096, 512, 64], "dtype": "float16", "rows": [
            {"config": {"RT": 1}, "median": 1.30, "low": 1.21, "high": 1.40},
            {"config": {"RT": 2}, "median": 1.50, "low": 1.04, "high": 1.90},  # wide: its low is below the line
            {"config": {"KS": 2}, "median": 1.25, "low": 1.23, "high": 1.27},
            {"config": {"KS": 1}, "verified": "wrong"}]},  # not timed
        {"family": "rmsnorm_qmatvec", "shape": [4, 12288, 4096, 512, 64], "rows": [
            {"config": {"RT": 2}, "median": 1.02, "low": 0.99, "high": 1.05}]}]}
    (pick,) = picks(ab, 1.05)
    assert pick == ("qmatvec_residual", [4, 4096, 4096, 512, 64], "float16", {"KS": 2}, 1.23)
    cmd = command(*pick[:4], "/tmp/store", 6)
    assert cmd[cmd.index("--start") + 1] == "KS=2" and cmd[cmd.index("--dtype") + 1] == "float16" and "--publish" in cmd and cmd[cmd.index("--store") + 1] == "/tmp/store"
    assert picks(ab, 1.3) == []

"""benchmarks/search_landscapes.py: issue 41's tuned-on / held-out split is enforced, small files are summarised
apart (a 1 % budget of fewer than 20 trials says little)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kernsearch.studies._landscape import LandscapeWriter

REPO = Path(__file__).resolve().parents[1]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("search_landscapes", REPO / "benchmarks" / "search_landscapes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["search_landscapes"] = module
    spec.loader.exec_module(module)
    return module


def _tiny(path: Path) -> Path:
    writer = LandscapeWriter(path, {"a": [1, 2, 4, 8], "b": [0, 1]}, device_name="test GPU")
    for a in (1, 2, 4, 8):
        for b in (0, 1):
            writer.add({"a": a, "b": b}, [float(a + b), float(a + b) * 1.01])
    return writer.save()


def test_split_is_disjoint() -> None:
    bench = _bench()
    assert not set(bench.TUNED_ON) & set(bench.HELD_OUT)
    assert not set(bench.TUNED_ON) & set(bench.HELD_OUT_2) and not set(bench.HELD_OUT) & set(bench.HELD_OUT_2)


def test_bootstrap_interval_is_wide_on_a_needle_file_and_a_point_on_a_steady_one() -> None:
    """Half the seeds hit a needle (1.0), half stop in the basin (0.7): the median of 20 can land anywhere between;
    a file where every seed scores 0.99 moves the group's mean by nothing."""
    bench = _bench()
    lo, hi = bench.bootstrap_interval([[1.0] * 10 + [0.7] * 10])
    assert lo <= 0.75 and hi >= 0.95
    assert bench.bootstrap_interval([[0.99] * 20]) == pytest.approx((0.99, 0.99))
    lo2, hi2 = bench.bootstrap_interval([[1.0] * 10 + [0.7] * 10, [0.99] * 20])
    assert lo2 == pytest.approx((lo + 0.99) / 2) and hi2 == pytest.approx((hi + 0.99) / 2)


def test_held_out_refuses_a_tuned_on_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()
    path = _tiny(tmp_path / "pnpoly_RTX_3090.json")  # a TUNED_ON name
    with pytest.raises(SystemExit) as exc:
        bench.main(["--held-out", str(path), "--seeds", "1", "--budgets", "1", "--strategies", "random"])
    assert exc.value.code == 2
    assert "tuned on" in capsys.readouterr().err


@pytest.mark.slow
def test_small_files_are_summarised_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = _bench()
    path = _tiny(tmp_path / "tiny_landscape.json")
    bench.main(["--held-out", str(path), "--seeds", "2", "--budgets", "1", "--strategies", "random"])
    out = capsys.readouterr().out
    assert "1 SMALL file(s) where 1 % is < 20 trials (reported apart)" in out
    assert "file(s) where 1 % is >= 20 trials" not in out

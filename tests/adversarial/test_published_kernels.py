"""A published kernel is verified at the shape it was tuned for (a sample of its threadgroups on the
interpreter when the grid is big) and on a ragged shape, not only on a small stand-in problem."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernsearch import ArtifactStore, Space, geometry, get_backend, get_chip, load_family, make_problem, render
from kernsearch.evaluation._verify import sample_threadgroups, threadgroup_counts, verify_kernel

from .conftest import RANDOM, ks


def _wrong_where(condition: str, text: str) -> str:
    """The gemm template with 1 added to every C element it writes where ``condition`` holds."""
    out = text
    for lhs in ("C[r * N + c] = T(", "C[r * N + c + 1] = T("):
        out = out.replace(lhs, lhs.replace("= T(", f"= T(({condition}) ? 1.0f : 0.0f) + T("))
    assert out != text, "the gemm template no longer writes C as this test expects"
    return out


def _wrong_from_row_128(text: str) -> str:
    """Correct on a 96x96 problem, wrong wherever a row index reaches 128."""
    return _wrong_where("r >= 128", text)


@pytest.mark.slow
def test_a_kernel_wrong_at_the_tuned_shape_is_never_published(hostile_family, tmp_path: Path) -> None:
    folder = hostile_family(metal=_wrong_from_row_128)
    store = tmp_path / "store"
    small = ks("verify", str(folder), "--shape", "96,96,96", "--dtype", "float32", "--chip", "M2 Max")
    assert small.returncode == 0, small.stdout + small.stderr  # the trap: right on the stand-in problem
    proc = ks("tune", str(folder), "--backend", "model", "--chip", "M2 Max", "--shape", "512,512,512",
              "--dtype", "float32", "--trials", "3", "--finalists", "2", "--storage", ":memory:", "--publish", *RANDOM,
              env={"KERNSEARCH_ARTIFACTS": str(store)}, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "512x512x512" in proc.stdout and "FAIL" in proc.stdout
    assert ArtifactStore(store).keys() == [] or not any(ArtifactStore(store).versions(k) for k in ArtifactStore(store).keys())


def test_sampled_threadgroups_cover_corners_edges_and_interior() -> None:
    fam, chip = load_family("gemm"), get_chip("M2 Max")
    space = Space(make_problem(fam, (4096, 4096, 4096), "float32", chip), chip)
    geo = geometry(space, space.parse_config("BM=32,BN=32"))
    counts = threadgroup_counts(geo)
    picks = sample_threadgroups(geo, 12, seed=3)
    assert len(picks) == len(set(picks)) == 12
    for corner in [(0, 0, 0), (counts[0] - 1, 0, 0), (0, counts[1] - 1, 0), (counts[0] - 1, counts[1] - 1, 0)]:
        assert corner in picks
    assert any(0 < x < counts[0] - 1 and 0 < y < counts[1] - 1 for x, y, _ in picks)


def test_sampled_verification_catches_a_kernel_wrong_only_in_far_tiles(hostile_family) -> None:
    fam = load_family(str(hostile_family(metal=_wrong_from_row_128)))
    chip = get_chip("M2 Max")
    cpu = get_backend("cpu")
    for shape, ok in (((96, 96, 96), True), ((1024, 1024, 64), False)):
        space = Space(make_problem(fam, shape, "float32", chip), chip)
        cfg = space.parse_config("BM=32,BN=32")
        geo = geometry(space, cfg)
        check, _ = verify_kernel(cpu, render(fam, cfg, "float32"), geo, space.problem, 0,
                                 threadgroups=sample_threadgroups(geo, 8), chip=chip)
        assert check.ok is ok, check.summary()
    # a kernel that skips its tiles is not passed by writing nothing
    lazy = load_family(str(hostile_family(name="lazy", metal=lambda t: t.replace(
        "if (r < M && c < N) {", "if (r < M && c < N && r < 64) {").replace(
        "if (r < M && c + 1 < N) {", "if (r < M && c + 1 < N && r < 64) {"))))
    space = Space(make_problem(lazy, (1024, 1024, 64), "float32", chip), chip)
    cfg = space.parse_config("BM=32,BN=32")
    geo = geometry(space, cfg)
    check, _ = verify_kernel(cpu, render(lazy, cfg, "float32"), geo, space.problem, 0,
                             threadgroups=[(5, 20, 0), (10, 30, 0)], chip=chip)
    assert not check.ok and check.reason == "unwritten", check.summary()
    assert np.isfinite(check.max_abs_err)


def _wrong_on_ragged_shapes(text: str) -> str:
    """Correct whenever M and N are multiples of 16 (96³, 256³), wrong on every other shape."""
    return _wrong_where("M % 16 != 0 || N % 16 != 0", text)


@pytest.mark.slow
def test_a_kernel_wrong_only_on_ragged_shapes_is_never_published(hostile_family, tmp_path: Path) -> None:
    folder = hostile_family(metal=_wrong_on_ragged_shapes)
    store = tmp_path / "store"
    for shape, rc in (("96,96,96", 0), ("256,256,256", 0), ("92,92,92", 1)):  # the trap: right on tile multiples
        proc = ks("verify", str(folder), "--shape", shape, "--dtype", "float32", "--chip", "M2 Max")
        assert proc.returncode == rc, (shape, proc.stdout + proc.stderr)
    proc = ks("tune", str(folder), "--backend", "model", "--chip", "M2 Max", "--shape", "256,256,256",
              "--dtype", "float32", "--trials", "3", "--finalists", "2", "--storage", ":memory:", "--publish", *RANDOM,
              env={"KERNSEARCH_ARTIFACTS": str(store)}, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout, proc.stdout
    st = ArtifactStore(store)
    assert not any(st.versions(k) for k in st.keys()), proc.stdout

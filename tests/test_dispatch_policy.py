"""Never ship a slowdown: the gate and the exported dispatcher act only on measured evidence that a kernel
beats the MLX op (lower bound of the speedup above 1 + margin), level by level."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from test_export import H100, H200, M2MAX, M2PRO, arrays, candidate, import_package

from kernsearch import ArtifactStore, export, load_family
from kernsearch.artifacts._artifacts import ArtifactKey
from kernsearch.exporting.runtime import _runtime

REPO = Path(__file__).resolve().parents[1]
HERE = {"mlx": "0.32", "os": "Linux", "macos": None, "cuda_driver": None, "nvrtc": None}


def package(tmp_path: Path, *candidates) -> _runtime.Dispatcher:
    store = ArtifactStore(tmp_path / "store")
    for c in candidates:
        store.publish(c, margin=-1.0)  # the gate's own rule is tested below; here the package's is
    result = export(["gemm"], tmp_path / "dist", store, package="ks_policy", version="1.0")
    d = _runtime.Dispatcher(result.source_dir / "ks_policy")
    d.toolchain = dict(HERE)
    return d


def test_beats_op_is_the_lower_bound_above_one_plus_margin() -> None:
    assert _runtime.beats_op(1.04) and not _runtime.beats_op(1.03) and not _runtime.beats_op(None)
    assert _runtime.beats_op(1.11, margin=0.1) and not _runtime.beats_op(1.09, margin=0.1)
    assert not _runtime.beats_op(float("nan"))
    both = {"graph": {"low": 1.2}, "eager": {"low": 1.05}}
    assert _runtime.consumer_low(both) == 1.05 and _runtime.consumer_low({"graph": {"low": 1.2}}) is None
    assert _runtime.consumer_low(both, ("graph",)) == 1.2 and _runtime.consumer_low(None) is None


def test_gate_records_a_losing_measured_kernel_without_dispatching_it(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    lost = store.publish(candidate("M2 Max", (64, 64, 64), speedup=0.47))
    assert not lost.published and lost.version is None
    assert ("recorded, not dispatched: 0.47x (range 0.47-0.47) graph, 0.47x (range 0.47-0.47) eager of mx.matmul "
            "(measured as consumers call it") in lost.reason
    key = ArtifactKey.parse("gemm/M2-Max/float32/64x64x64")[0]
    assert store.versions(key) == [] and store.journal(key)[-1]["outcome"] == "rejected"
    narrow = store.publish(candidate("M2 Max", (64, 64, 64), speedup=1.035))  # low 1.025 < 1.03
    assert not narrow.published
    assert store.publish(candidate("M2 Max", (64, 64, 64), speedup=1.035), margin=0.01).published


@pytest.mark.slow
@pytest.mark.parametrize("chip, level", [(M2MAX, "exact chip"), (M2PRO, "same generation")])
def test_each_level_skips_a_kernel_slower_than_the_op(tmp_path: Path, chip, level: str) -> None:
    d = package(tmp_path, candidate("M2 Max", (64, 64, 64), speedup=0.62))
    decision = d.explain("gemm", *arrays(64, 64, 64), chip=chip)
    assert decision.level == "mlx op" and decision.entry is None
    assert (f"{level}: gemm/M2-Max/float32/64x64x64/v1 skipped: 0.62x (range 0.61-0.63) graph, 0.62x (range "
            "0.61-0.63) eager of mx.matmul (measured as consumers call it)") in str(decision)
    winner = package(tmp_path / "w", candidate("M2 Max", (64, 64, 64), speedup=1.5))
    assert winner.explain("gemm", *arrays(64, 64, 64), chip=chip).level == level


def test_other_chips_only_when_the_family_allows_transfer(tmp_path: Path) -> None:
    d = package(tmp_path, candidate("H100", (128, 128, 128), "float16", target="cuda"))
    assert d.explain("gemm", *arrays(128, 128, 128, mx.float16), chip=H200).level == "same generation and die"
    d.table["families"]["gemm"]["transfer"] = False
    d._decisions.clear()
    decision = d.explain("gemm", *arrays(128, 128, 128, mx.float16), chip=H200)
    assert decision.level == "mlx op" and "does not allow transferring a kernel between chips" in str(decision)


def test_modeled_artifacts_need_the_consumer_to_opt_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = package(tmp_path, candidate("M2 Max", (64, 64, 64), evidence="modeled"))
    decision = d.explain("gemm", *arrays(64, 64, 64), chip=M2MAX)
    assert decision.level == "mlx op" and "modeled, not measured" in str(decision)
    assert d.explain("gemm", *arrays(64, 64, 64), chip=M2MAX, modeled=True).level == "exact chip"
    monkeypatch.setenv("KERNSEARCH_KERNELS", "modeled")
    assert d.explain("gemm", *arrays(64, 64, 64), chip=M2MAX).level == "exact chip"


def test_interpreted_artifacts_are_never_dispatched(tmp_path: Path) -> None:
    d = package(tmp_path, candidate("M2 Max", (64, 64, 64), evidence="interpreted"))
    decision = d.explain("gemm", *arrays(64, 64, 64), chip=M2MAX, modeled=True)
    assert decision.level == "mlx op" and "interpreted (correctness only): never dispatched" in str(decision)


def test_family_default_needs_a_measured_artifact_of_the_default_config(tmp_path: Path) -> None:
    """The default config's kernel (shipped with every package) runs only where an intact artifact of that config
    was measured to win at the call's shape; a tampered artifact is no evidence at all."""
    default = dict(load_family("gemm").default)
    other = package(tmp_path / "a", candidate("M2 Max", (64, 64, 64), config={"BM": 64}))
    _tamper(other)
    refused = other.explain("gemm", *arrays(64, 64, 64), chip=M2MAX)
    assert refused.level == "mlx op" and "no measured evidence that the default config beats mx.matmul" in str(refused)
    proven = package(tmp_path / "b", candidate("M2 Max", (64, 64, 64), config=default))
    assert proven.explain("gemm", *arrays(64, 64, 64), chip=M2MAX).config == default
    assert proven.explain("gemm", *arrays(128, 64, 64), chip=M2MAX).level == "mlx op"  # not measured there
    _tamper(proven)
    assert proven.explain("gemm", *arrays(64, 64, 64), chip=M2MAX).level == "mlx op"
    slow = package(tmp_path / "c", candidate("M2 Max", (64, 64, 64), config=default, speedup=0.9))
    assert slow.explain("gemm", *arrays(64, 64, 64), chip=M2MAX).level == "mlx op"


def _tamper(d: _runtime.Dispatcher) -> None:
    source = next(d.root.glob("artifacts/gemm/M2-Max/float32/64x64x64/v1/source.metal"))
    source.write_text(source.read_text() + "// changed\n")
    for cache in (d._decisions, d._sources, d._refused, d._verdicts, d._plans):  # as a fresh process reads it
        cache.clear()


def test_a_toolchain_change_voids_a_measurement(tmp_path: Path) -> None:
    d = package(tmp_path, candidate("M2 Max", (64, 64, 64)))
    assert d.explain("gemm", *arrays(64, 64, 64), chip=M2MAX).level == "exact chip"
    d.toolchain = {**HERE, "mlx": "0.40"}
    d._decisions.clear()
    decision = d.explain("gemm", *arrays(64, 64, 64), chip=M2MAX)
    assert decision.level == "mlx op" and "measured with another toolchain (mlx 0.32 -> 0.40)" in str(decision)


def test_rejudged_repository_artifacts_route_every_h100_gemm_call_to_the_op(tmp_path: Path) -> None:
    store_dir = tmp_path / "artifacts"
    shutil.copytree(REPO / "artifacts", store_dir)
    store = ArtifactStore(store_dir)
    store.rejudge()  # already re-judged in the repository: nothing left to invalidate, and no error
    current = [p for k in store.keys() if k.family == "gemm" and (p := store.pointer(k))]  # gemv has a winner
    assert current and all(p.invalidated and "of mx.matmul (measured" in p.invalidated for p in current)
    result = export(["gemm"], tmp_path / "dist", store, package="ks_repo", version="1.0")
    assert result.artifacts == []
    pkg = import_package(result.source_dir, "ks_repo")
    rows = [((4096, 4096, 4096), mx.float16), ((16, 4096, 4096), mx.float16), ((2048, 2048, 2048), mx.float16),
            ((3000, 5000, 2000), mx.float16), ((8192, 8192, 8192), mx.float16), ((1, 4096, 4096), mx.float16),
            ((4096, 4096, 4096), mx.bfloat16), ((1024, 1024, 1024), mx.float32)]
    for (m, n, k), dtype in rows:
        decision = pkg.gemm.explain(*arrays(m, n, k, dtype), chip=H100)
        assert decision.level == "mlx op" and decision.entry is None, str(decision)
    text = str(pkg.gemm.explain(*arrays(4096, 4096, 4096, mx.float16), chip=H100))
    assert "gemm/H100/float16/4096x4096x4096/v3 skipped: invalidated: re-judged: v3 0.26x" in text


def test_tune_verdict_says_plainly_when_nothing_beats_the_op() -> None:
    from types import SimpleNamespace

    from kernsearch import FinalRound
    from kernsearch._records import Figures
    from kernsearch.studies._storage import StudyKey
    from kernsearch.studies._tune import verdict

    key = StudyKey("gemm", "H100", "float16", "2048x2048x2048", "cuda")
    lost: Any = SimpleNamespace(best=object(), evidence="measured",
                                final=FinalRound(0, figures=Figures(median_ms=1.0, spread=0.0, speedup=0.47,
                                                                    speedup_low=0.45, speedup_high=0.49)))
    said = verdict(lost, key, "mx.matmul", 0.03)
    assert said.beats is False and said.text == ("no variant beats mx.matmul on H100 at 2048x2048x2048 float16 "
                                                 "(best: 0.47x (range 0.45-0.49)); keep the MLX op")
    won: Any = SimpleNamespace(best=object(), evidence="measured",
                               final=FinalRound(0, figures=Figures(median_ms=1.0, spread=0.0, speedup=1.4,
                                                                   speedup_low=1.3, speedup_high=1.5)))
    assert verdict(won, key, "mx.matmul", 0.03).beats is True
    assert verdict(won, key, "mx.matmul", 0.5).beats is False  # the margin is the user's
    modeled: Any = SimpleNamespace(best=object(), evidence="modeled", final=None)
    said = verdict(modeled, key, "mx.matmul", 0.03)
    assert said.beats is None and "mx.matmul is not modeled" in said.text and "only when its consumer opts in" in said.text


def test_same_generation_and_die_skips_a_kernel_that_lost_on_its_own_chip(tmp_path: Path) -> None:
    d = package(tmp_path, candidate("H100", (128, 128, 128), "float16", target="cuda", speedup=0.62))
    decision = d.explain("gemm", *arrays(128, 128, 128, mx.float16), chip=H200)
    assert decision.level == "mlx op" and decision.entry is None
    assert ("same generation and die: gemm/H100/float16/128x128x128/v1 skipped: 0.62x (range 0.61-0.63) graph, "
            "0.62x (range 0.61-0.63) eager of mx.matmul (measured as consumers call it)") in str(decision)
    narrow = package(tmp_path / "n", candidate("H100", (128, 128, 128), "float16", target="cuda", speedup=1.03))
    assert narrow.explain("gemm", *arrays(128, 128, 128, mx.float16), chip=H200).level == "mlx op"  # low 1.02


def test_a_kernel_runs_only_at_the_shape_it_was_judged_at(tmp_path: Path) -> None:
    d = package(tmp_path, candidate("M2 Max", (64, 64, 64), config={"BM": 64}))  # not the default config
    assert d.explain("gemm", *arrays(64, 64, 64), chip=M2MAX).artifact == "gemm/M2-Max/float32/64x64x64/v1"
    for m, n, k in [(32, 128, 64), (65, 64, 64), (64, 64, 4096)]:
        decision = d.explain("gemm", *arrays(m, n, k), chip=M2MAX)
        assert decision.level == "mlx op" and decision.entry is None
        assert (f"exact chip: gemm/M2-Max/float32/64x64x64/v1 skipped: judged at 64x64x64, not at {m}x{n}x{k} (a "
                "kernel runs only at a shape it was measured to win at)") in str(decision)


def test_the_exported_functions_take_the_modeled_opt_in_as_a_call_argument(tmp_path: Path) -> None:
    import inspect

    store = ArtifactStore(tmp_path / "store")
    store.publish(candidate("M2 Max", (64, 64, 64), evidence="modeled"))
    result = export(["gemm"], tmp_path / "dist", store, package="ks_modeled", version="1.0")
    pkg = import_package(result.source_dir, "ks_modeled")
    assert "modeled" in inspect.signature(pkg.gemm).parameters
    assert pkg.gemm.explain(*arrays(64, 64, 64), chip=M2MAX).level == "mlx op"
    assert pkg.gemm.explain(*arrays(64, 64, 64), chip=M2MAX, modeled=True).level == "exact chip"
    assert pkg.explain("gemm", *arrays(64, 64, 64), chip=M2MAX, modeled=True).level == "exact chip"
    a, b = mx.ones((8, 4)), mx.ones((4, 6))
    assert mx.array_equal(pkg.gemm(a, b, modeled=True), mx.matmul(a, b)).item()  # no GPU here: the op runs


def test_a_family_that_cannot_run_a_kernel_here_calls_the_op_without_planning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a chip where no artifact of the family could be taken (any shape, any dtype), a call is the op plus
    one look-up; where one could, every call is planned, and opt-ins still reach the kernel."""
    winner = candidate("H100", (64, 64, 64), "float16", target="cuda", speedup=1.5)
    loser = candidate("H100", (64, 64, 64), "float16", target="cuda", speedup=0.5)
    a, b = mx.ones((64, 64), dtype=mx.float16), mx.ones((64, 64), dtype=mx.float16)
    monkeypatch.setattr(_runtime, "_gpu_available", lambda: True)  # the injected H100 is the running GPU
    for speedup, expect_op_only in ((loser, True), (winner, False)):
        root = tmp_path / str(expect_op_only)
        store = ArtifactStore(root / "store")
        store.publish(speedup, margin=-1.0)
        result = export(["gemm"], root / "dist", store, package="ks_fast", version="1.0")
        d = _runtime.Dispatcher(result.source_dir / "ks_fast", device_info=H100)
        d.toolchain = dict(HERE)
        launches: list[object] = []

        def kernel(log=launches, **kw):  # square all-ones inputs: the product whichever operand is transposed
            log.append(kw["grid"])
            return [mx.matmul(kw["inputs"][0], mx.transpose(kw["inputs"][1]))]

        d.kernel_factory = lambda source, shm: kernel
        assert mx.array_equal(d.call("gemm", a, b), mx.matmul(a, b))
        assert (d._how["gemm"][1] is mx.matmul) == expect_op_only
        planned = len(d._plans)
        d.call("gemm", a, b)
        assert len(d._plans) == planned  # nothing new planned either way
        assert bool(launches) != expect_op_only  # the kernel was traced (compiled) only where it may run
        # NumPy inputs: the op refuses them, the planned path converts them (the fast path falls through).
        got = d.call("gemm", np.ones((64, 64), np.float16), np.ones((64, 64), np.float16))
        assert mx.array_equal(got, mx.matmul(a, b)) and bool(launches) != expect_op_only
        monkeypatch.setenv("KERNSEARCH_KERNELS", "off")  # the switch still acts on the fast path
        traced = len(launches)
        assert d.explain("gemm", a, b).level == "mlx op"
        d.call("gemm", a, b)
        assert len(launches) == traced
        monkeypatch.delenv("KERNSEARCH_KERNELS")


def test_another_chips_kernel_keeps_the_op_path_only_where_a_level_could_take_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An H100 kernel on an H200: gemm transfers between chips of one generation, so its calls are planned with the
    kernel in view; a family that does not transfer runs the op there with no opt-in read (no level takes it)."""
    store = ArtifactStore(tmp_path / "store")
    store.publish(candidate("H100", (64, 64, 64), "float16", target="cuda", speedup=1.5), margin=-1.0)
    result = export(["gemm"], tmp_path / "dist", store, package="ks_h200", version="1.0")
    monkeypatch.setattr(_runtime, "_gpu_available", lambda: True)
    for transfer, kernels in ((True, True), (False, False)):
        d = _runtime.Dispatcher(result.source_dir / "ks_h200", device_info=H200)
        d.toolchain = dict(HERE)
        d.table["families"]["gemm"]["transfer"] = transfer
        assert (d._mode("gemm")[0] is _runtime._KERNELS) == kernels
        assert (d._mode("gemm")[1] is mx.matmul) != kernels  # the op itself, for every call


def test_a_bound_call_with_two_activations_repeats_its_kernel_plan_without_planning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``qmatvec_residual.bind(W, S, Bq)(X, R)``, the O and down projections of a decode layer: a call with the
    last call's activation shapes and dtypes runs the kept plan (no key built, no argument list merged); another
    shape or dtype, or the switch, goes through planning again."""
    from test_dispatch_cost import frames

    shape = (1, 256, 256, 32, 4)
    store = ArtifactStore(tmp_path / "store")
    store.publish(candidate("H100", shape, "float16", target="cuda", family="qmatvec_residual"), margin=-1.0)
    result = export(["qmatvec_residual"], tmp_path / "dist", store, package="ks_two", version="1.0")
    monkeypatch.setattr(_runtime, "_gpu_available", lambda: True)
    d = _runtime.Dispatcher(result.source_dir / "ks_two", device_info=H100)
    d.toolchain = dict(HERE)
    names: list[list[str]] = []

    def kernel(**kw):  # the inputs in the family's order (X, W, S, Bq, R): R + 2 X stands in for the product
        names.append([str(a.shape) for a in kw["inputs"]])
        return [kw["inputs"][4] + 2 * kw["inputs"][0]]

    d.kernel_factory = lambda source, shm: kernel
    w = mx.zeros((256, 32), dtype=mx.uint32)
    s, b = mx.zeros((256, 4), dtype=mx.float16), mx.zeros((256, 4), dtype=mx.float16)
    bound = d.bind("qmatvec_residual", w, s, b)
    x, r = mx.ones((1, 256), dtype=mx.float16), mx.full((1, 256), 3.0, dtype=mx.float16)
    assert mx.array_equal(bound(x, r), r + 2 * x).item() and names  # planned: the kernel was traced
    seen = frames(bound, x, r)
    assert "planned" not in seen and "merged" not in seen and seen[0] == "bound"  # the kept plan, called at once
    x2 = mx.full((1, 256), 5.0, dtype=mx.float16)
    assert mx.array_equal(bound(x2, r), r + 2 * x2).item()  # new values, same shapes: the same plan
    r32 = r.astype(mx.float32)
    assert "planned" in frames(bound, x, r32)  # another dtype: planned again (here the op: float32 was not tuned)
    assert "planned" in frames(bound, x, r)  # back to float16: its plan is kept (not made again), filed as the last
    assert "planned" not in frames(bound, x, r) and len(names) == 1  # the fast path again; traced once in all
    monkeypatch.setenv("KERNSEARCH_KERNELS", "off")
    assert "planned" in frames(bound, x, r)  # the switch is read on every call

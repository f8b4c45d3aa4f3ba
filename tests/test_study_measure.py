"""The timing method (on a fake clock), isolated workers (crash, hang, errors), the Metal back-end's
refusal without Metal, and the finalist judgement."""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any

import pytest

from kernsearch import KernsearchError
from kernsearch._errors import BackendError, VariantFailure
from kernsearch.evaluation._measure import (
    TimingPlan,
    input_sets_needed,
    interleaved,
    lead_exceeds_noise,
    measure,
    speedup,
    spread,
)
from kernsearch.evaluation._worker import Worker


class FakeGPU:
    """launch() queues ``kernel_ms`` of work on a virtual clock; sync() costs ``sync_ms`` and drains it."""

    def __init__(self, kernel_ms: float, sync_ms: float = 0.05, launch_ms: float = 0.0) -> None:
        self.now = 0.0
        self.kernel_ms, self.sync_ms, self.launch_ms = kernel_ms, sync_ms, launch_ms
        self.launches: list[int] = []
        self.syncs = 0

    def clock(self) -> float:
        return self.now / 1e3

    def launch(self, i: int) -> None:
        self.launches.append(i)
        self.now += self.kernel_ms + self.launch_ms

    def sync(self) -> None:
        self.syncs += 1
        self.now += self.sync_ms


def test_batches_are_long_enough_that_sync_cost_vanishes():
    gpu = FakeGPU(kernel_ms=0.05, sync_ms=0.5)  # a small kernel behind an expensive sync
    plan = TimingPlan(warmup=2, min_batch_ms=20.0, min_samples=10, max_samples=40)
    samples = measure(gpu.launch, gpu.sync, plan=plan, clock=gpu.clock)
    assert 10 <= len(samples) <= 40
    # one launch per sync would read 0.55 ms (11x too slow); batches of >= 20 ms leave the sync < 3 %
    assert all(0.05 <= s < 0.05 * 1.03 for s in samples), samples[:3]
    capped = measure(gpu.launch, gpu.sync, plan=TimingPlan(warmup=0, max_batch=4, min_samples=3, max_samples=3),
                     clock=gpu.clock)
    assert capped[0] == pytest.approx(0.05 + 0.5 / 4)  # the batch cap (memory of pending outputs) holds


def test_input_sets_rotate_and_are_sized_by_the_cache():
    gpu = FakeGPU(kernel_ms=1.0)
    measure(gpu.launch, gpu.sync, input_sets=3, plan=TimingPlan(warmup=1, min_batch_ms=2.0, min_samples=5,
                                                                max_samples=5), clock=gpu.clock)
    assert set(gpu.launches) == {0, 1, 2}
    assert input_sets_needed(100e6, 48e6) == 1  # does not fit in cache: one set is honest
    assert input_sets_needed(4e6, 48e6) > 2  # fits: rotate enough copies to flush it
    assert input_sets_needed(0, 48e6) == 1


def test_interleaved_rounds_alternate_order_and_judge_noise():
    a, b = FakeGPU(1.0), FakeGPU(2.0)
    order: list[str] = []

    def tagged(gpu, name):
        def launch(i):
            order.append(name)
            gpu.launch(i)
        return launch

    def clock():
        return (a.now + b.now) / 1e3

    samples = interleaved({"a": (tagged(a, "a"), a.sync), "b": (tagged(b, "b"), b.sync)}, rounds=4,
                          plan=TimingPlan(warmup=1, min_batch_ms=1.0), clock=clock)
    assert len(samples["a"]) == len(samples["b"]) == 4
    assert abs(samples["a"][0] - 1.0) < 0.1 and abs(samples["b"][0] - 2.0) < 0.1
    assert lead_exceeds_noise(samples["a"], samples["b"]) and not lead_exceeds_noise(samples["b"], samples["a"])
    assert not lead_exceeds_noise([1.0, 1.2, 0.9, 1.1], [1.05, 1.15, 1.0, 1.1])  # overlapping: no lead
    s = speedup([1.0, 1.0, 1.0], [2.0, 2.2, 1.8])
    assert s.median == pytest.approx(2.0) and s.low < s.median < s.high
    assert spread([1.0]) == 0.0 and spread([1.0, 1.0, 2.0]) > 0


def _slow(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


def _fail() -> None:
    raise VariantFailure("wrong", "planted")


def _user_error() -> None:
    raise KernsearchError("bad input")


def _bug() -> None:
    raise ZeroDivisionError("planted bug")


@pytest.mark.slow
def test_worker_survives_crash_hang_and_errors():
    with Worker(timeout=20) as worker:
        assert worker.call(os.getpid) != os.getpid()  # really another process
        assert worker.call(_slow, 0.01) == "done"
        with pytest.raises(VariantFailure) as exc:
            worker.call(ctypes.string_at, 0)  # segfault in the child
        assert exc.value.reason == "crash" and "SIGSEGV" in exc.value.detail
        with pytest.raises(VariantFailure) as exc:
            worker.call(os._exit, 3)
        assert exc.value.reason == "crash" and "exit code 3" in exc.value.detail
        start = time.monotonic()
        with pytest.raises(VariantFailure) as exc:
            worker.call(_slow, 60, timeout=1.0)
        assert exc.value.reason == "timeout" and time.monotonic() - start < 10
        with pytest.raises(VariantFailure) as exc:
            worker.call(_fail)
        assert (exc.value.reason, exc.value.detail) == ("wrong", "planted")
        with pytest.raises(VariantFailure) as exc:
            worker.call(_bug)
        assert exc.value.reason == "error" and "ZeroDivisionError" in exc.value.detail
        with pytest.raises(KernsearchError, match="bad input"):
            worker.call(_user_error)
        assert worker.call(_slow, 0) == "done"  # a fresh child after each death
        assert worker.starts == 4  # first start + after the segfault, the exit and the hang


def test_metal_backend_refuses_cleanly_without_metal():
    import mlx.core as mx

    from kernsearch import get_backend

    backend = get_backend("metal")
    assert backend.evidence.value == "measured" and backend.target == "metal"
    if mx.metal.is_available():
        pytest.skip("a Metal device is present here: the refusal path does not apply")
    with pytest.raises(BackendError, match="no Metal device"):
        backend.check_available()


def _timings(finalists: list[list[float]], baseline: list[float]) -> Any:
    """The final round's samples in graph mode only (as a final round without eager timing would give)."""
    from kernsearch._records import FinalTimings, ModeSamples

    return FinalTimings({"graph": ModeSamples(tuple(map(tuple, finalists)), tuple(baseline))})


def test_judge_picks_the_fastest_finalist_and_reports_the_speedup():
    from kernsearch._vocabulary import Evidence, TrialStatus
    from kernsearch.studies._final import judge
    from kernsearch.studies._trial import Record, Trial

    top = [Trial(n, c, TrialStatus.OK, Record(t, Evidence.MEASURED), t) for n, c, t in ((5, {"a": 1}, 1.0),
                                                                                       (9, {"a": 2}, 1.1))]
    judged = judge(top, _timings([[1.30, 1.31, 1.29, 1.30], [1.00, 1.01, 0.99, 1.00]], [2.0, 2.02, 1.98, 2.0]))
    assert judged.winner == 9  # re-measured, the second leader is faster
    assert judged.lead_exceeds_noise and judged.beats_baseline
    f = judged.figures
    assert f is not None and f.speedup == pytest.approx(2.0) and f.speedup_low <= 2.0 <= f.speedup_high
    tie = judge(top, _timings([[1.0, 1.1, 0.9], [1.0, 1.05, 0.95]], [1.0, 1.1, 0.9]))
    assert tie.lead_exceeds_noise is False and tie.beats_baseline is False
    stored = judged.to_dict()  # the form stored on the study and printed by `tune --json`, as it always was
    assert list(stored) == ["winner", "finalists", "lead_exceeds_noise", "baseline_median_ms", "baseline_spread",
                            "speedup", "speedup_low", "speedup_high", "modes", "beats_baseline"]
    assert stored["winner"] == 9 and set(stored["finalists"]) == {"5", "9"}
    assert set(stored["finalists"]["9"]) == {"median_ms", "spread"}


def test_precompile_builds_each_input_in_its_own_dtype() -> None:
    """The compile worker builds the kernel the timing process runs: MLX generates its signature from the input
    dtypes. With every input in the problem's dtype, layernorm's float32 ``eps`` became float16 and the CUDA twin
    failed NVRTC on the H100 ('more than one operator "+"'): every trial of `tune layernorm` failed to compile."""
    import mlx.core as mx

    from kernsearch import Space, geometry, get_chip, load_family, make_problem, render
    from kernsearch.backends._mlx_cuda import CudaBackend
    from kernsearch.evaluation._verify import kernel_inputs, make_inputs

    seen: list[list] = []

    class Recording(CudaBackend):
        def _call(self, source, geometry, arrays, init_value):  # noqa: ANN001, ANN202 - records, launches nothing
            seen.append([a.dtype for a in arrays])
            return []

    chip = get_chip("H100")
    fam = load_family("layernorm")
    problem = make_problem(fam, (8, 256), "float16", chip)
    cfg = dict(fam.default)
    geo = geometry(Space(problem, chip), cfg)
    shapes = [tuple(x.shape) for x in kernel_inputs(problem, make_inputs(problem, 0), geo)]
    Recording().precompile(render(fam, cfg, "float16", "cuda"), geo, shapes, "float16")
    assert seen == [[mx.float16, mx.float16, mx.float16, mx.float32]]  # x, w, b in float16; eps in float32

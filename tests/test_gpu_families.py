"""On an NVIDIA GPU (pytest -m gpu): each row family is measured against its MLX op, offered to the gate,
exported, installed from its source tree and called through the package, whose answer must match the float64
reference whether it dispatched the kernel (a measured win) or fell back to the op."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

FAMILIES = {"rmsnorm": "4096,4096", "layernorm": "4096,4096", "softmax": "4096,4096", "swiglu": "4096,11008",
            # the fused decode families on the quantized matrix-vector core (4-bit, group 64), at their defaults
            "rmsnorm_qmatvec": "1,12288,4096,512,64", "qmatvec_residual": "1,4096,4096,512,64",
            "rmsnorm_swiglu_qmatvec": "1,11008,4096,512,64"}
#: The row families win with a held row in registers; the others run their default config.
ROW_FAMILIES = ("rmsnorm", "layernorm", "softmax")
#: The built-in families this file does not take through the package, and where their GPU runs are instead.
ELSEWHERE = {"gemm": "tests/test_gpu_cuda.py (ragged shapes, timing, published artifacts through the package)",
             "gemv": "benchmarks/gpu_consumer.py", "qmatvec": "benchmarks/gpu_consumer.py",
             "swiglu_qmatvec": "benchmarks/gpu_consumer.py", "mlp_block": "benchmarks/gpu_tune_decode.py"}


def test_every_builtin_family_is_taken_through_the_package_here_or_has_its_gpu_runs_named() -> None:
    """The families are found in the family folders (conftest.builtin_families): a new one fails here until it has
    a shape above (and runs through the package on the GPU) or names where its GPU runs are."""
    from conftest import builtin_families

    assert not set(FAMILIES) & set(ELSEWHERE)
    assert sorted({*FAMILIES, *ELSEWHERE}) == builtin_families()
    assert set(ROW_FAMILIES) <= set(FAMILIES)


def _cuda() -> bool:
    try:
        import mlx.core as mx

        return bool(getattr(mx, "cuda", None) and mx.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs MLX with its CUDA back-end on an NVIDIA GPU")
@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_through_the_exported_package(name: str, tmp_path: Path) -> None:
    import mlx.core as mx

    from kernsearch import (
        ArtifactStore,
        Candidate,
        Space,
        detect_chip,
        export,
        geometry,
        get_backend,
        load_family,
        make_problem,
        render,
    )
    from kernsearch.artifacts._manifest import Correctness, Measurements
    from kernsearch.evaluation._measure import TimingPlan, interleaved, speedup
    from kernsearch.evaluation._verify import kernel_inputs, make_inputs, reference, verify_kernel

    fam, chip = load_family(name), detect_chip()
    space = Space(make_problem(fam, FAMILIES[name], "float16", chip), chip)
    cfg = dict(fam.default)
    if name in ROW_FAMILIES:  # a held row in registers: the configuration these families win with
        cfg.update(TG=512, ROWS=1, VEC=8, UNROLL=1, HOLD="registers")
    cfg = space.validate(cfg)
    cuda = get_backend("cuda")
    kernel, geo = render(fam, cfg, "float16", "cuda"), geometry(space, cfg)
    check, _ = verify_kernel(cuda, kernel, geo, space.problem, seed=3)
    assert check.ok, check.summary()
    logical = make_inputs(space.problem, 4)
    sets = cuda.input_sets(list(logical.values()), "float16")
    samples = interleaved({"k": cuda.launcher(kernel, geo, kernel_inputs(space.problem, logical, geo), "float16",
                                              sets=sets),
                           "op": cuda.baseline_launcher(fam, space.problem, logical, sets=sets)},
                          rounds=10, plan=TimingPlan(min_batch_ms=10.0))
    sp = speedup(samples["k"], samples["op"])
    meas = Measurements(median_ms=float(np.median(samples["k"])), spread=0.01, samples_ms=samples["k"],
                        baseline_median_ms=float(np.median(samples["op"])), baseline_spread=0.01,
                        speedup=sp.median, speedup_low=sp.low, speedup_high=sp.high)
    store = ArtifactStore(tmp_path / "store")
    outcome = store.publish(Candidate.for_config(space, cfg, target="cuda", evidence="measured", measurements=meas,
                                                 correctness=Correctness.from_checks(
                                                     "device", [(space.problem.shape_text, check)]),
                                                 study="tests/test_gpu_families.py"))
    result = export([name], tmp_path / "dist", store, package=f"ks_gpu_{name}", version="1.0")
    pkg = result.source_dir / f"ks_gpu_{name}"
    spec = importlib.util.spec_from_file_location(f"ks_gpu_{name}", pkg / "__init__.py",
                                                  submodule_search_locations=[str(pkg)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        arrays = [mx.array(logical[t.name].astype(np.dtype(t.resolved_dtype("float16")))) for t in fam.inputs]
        decision = getattr(module, name).explain(*arrays)
        assert (decision.entry is not None) == bool(outcome.published), (str(decision), outcome.reason)
        out = np.array(getattr(module, name)(*arrays).astype(mx.float32), dtype=np.float64)
        ref = reference(space.problem, logical)[0]
        k = space.problem.dims.get("K", 1)  # a K-long sum (the quantized families): float16 rounding grows with it
        np.testing.assert_allclose(out, ref, rtol=4e-3, atol=4e-3 * max(1.0, float(np.sqrt(k))))
    finally:
        sys.modules.pop(spec.name, None)

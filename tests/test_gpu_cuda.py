"""The cuda back-end on a real NVIDIA GPU: build, verify and time kernels end to end (measured).

Every test here needs MLX's CUDA back-end and a CUDA device; elsewhere they are skipped with the reason
(``check_available``'s one-line message). Run on the GPU machine: ``pytest -m gpu tests/test_gpu_cuda.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from kernsearch import Geometry, KernelSource, Space, geometry, get_backend, get_chip, make_problem, render
from kernsearch._errors import BackendError, VariantFailure
from kernsearch.backends import Evidence
from kernsearch.evaluation._verify import SENTINEL, verify_kernel

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda():  # noqa: ANN201
    backend = get_backend("cuda")
    try:
        backend.check_available()
    except BackendError as exc:
        pytest.skip(f"needs a CUDA GPU with MLX's CUDA back-end: {exc}")
    return backend


def _axpb(n: int, upto: str = "x_shape[0]") -> tuple[KernelSource, Geometry]:
    """y = 2x + 1, one thread per element, written for i < ``upto``."""
    body = ("    const int i = int(blockIdx.x * blockDim.x + threadIdx.x);\n"
            f"    if (i < {upto}) {{\n"
            "        y[i] = static_cast<T>(2.0f * static_cast<float>(x[i]) + 1.0f);\n"
            "    }\n")
    kernel = KernelSource(name=f"kernsearch_test_axpb_{abs(hash(upto)) % 10**8}", target="cuda",
                          input_names=("x",), output_names=("y",), header="", source=body,
                          template=(("T", "float32"),))
    geo = Geometry(grid=(n, 1, 1), threadgroup=(256, 1, 1), output_shapes=((n,),), output_dtypes=("float32",))
    return kernel, geo


def test_elementwise_kernel_builds_runs_and_times(cuda) -> None:  # noqa: ANN001
    n = 100_003  # not a multiple of the block: the last block is partial
    x = np.random.default_rng(0).uniform(-1, 1, n).astype(np.float32).astype(np.float64)
    kernel, geo = _axpb(n)
    result = cuda.run(kernel, geo, [x], "float32")
    np.testing.assert_array_equal(result.outputs[0], (2 * x.astype(np.float32) + 1).astype(np.float64))
    timing = cuda.time(kernel, geo, [x], "float32")
    assert timing.evidence is Evidence.MEASURED
    assert len(timing.samples_ms) >= 10 and 0 < timing.median_ms < 10
    print(f"\nelementwise y=2x+1, n={n}: first launch (compile+run) {result.compile_seconds * 1e3:.1f} ms, "
          f"median {timing.median_ms * 1e3:.2f} us over {len(timing.samples_ms)} samples, "
          f"spread {timing.spread:.1%}, y[:3]={result.outputs[0][:3].tolist()} for x[:3]={x[:3].tolist()}")


def test_unwritten_outputs_keep_the_fill_value(cuda) -> None:  # noqa: ANN001
    n = 1000
    kernel, geo = _axpb(n, upto="x_shape[0] - 10")
    x = np.linspace(-1, 1, n)
    nan_run = cuda.run(kernel, geo, [x], "float32").outputs[0]
    assert np.isnan(nan_run[-10:]).all() and not np.isnan(nan_run[:-10]).any()
    sentinel_run = cuda.run(kernel, geo, [x], "float32", init_value=SENTINEL).outputs[0]
    assert (sentinel_run[-10:] == np.float32(SENTINEL)).all()


def test_compile_error_is_a_variant_failure_with_the_compiler_message(cuda) -> None:  # noqa: ANN001
    kernel, geo = _axpb(64)
    broken = KernelSource(name="kernsearch_test_broken", target="cuda", input_names=("x",), output_names=("y",),
                          header="", source="    y[0] = undefined_name_here;\n", template=(("T", "float32"),))
    with pytest.raises(VariantFailure) as info:
        cuda.run(broken, geo, [np.zeros(64)], "float32")
    assert info.value.reason == "compile" and "undefined_name_here" in info.value.detail


GEMM_CASES = [
    ("float16", "77,93,61", ""),  # the family default: WMMA, 32x32x16 tile
    ("float16", "77,96,64", "BM=128,BN=128,BK=32,WM=2,WN=2,VEC=4,DOUBLE_BUFFER=true,PAD=4"),
    ("float16", "77,96,64", "BM=64,BN=128,BK=32,WM=2,WN=4,VEC=2,DOUBLE_BUFFER=true,LAYOUT_B=t"),
    ("bfloat16", "77,93,61", "BM=64,BN=64,BK=16,WM=2,WN=2,PAD=4,LAYOUT_B=t"),
    ("float16", "77,93,61", "BM=64,BN=64,MMA=scalar,STAGE=none"),
    ("float16", "77,93,61", "BM=64,BN=32,MMA=scalar,STAGE=A,LAYOUT_B=t,DOUBLE_BUFFER=true"),
    ("float32", "77,96,64", "BM=64,BN=64,BK=32,MMA=scalar,STAGE=AB,VEC=4,DOUBLE_BUFFER=true,PAD=4"),
    ("float32", "77,93,61", "BM=32,BN=64,BK=8,WM=1,WN=2,MMA=scalar,STAGE=B,PAD=4"),
]


@pytest.mark.parametrize(("dtype", "shape", "text"), GEMM_CASES)
def test_gemm_variants_match_the_float64_reference_on_ragged_shapes(cuda, gemm, dtype, shape, text) -> None:  # noqa: ANN001
    chip = get_chip("H100")
    space = Space(make_problem(gemm, shape, dtype, chip), chip)
    config = space.validate(space.parse_config(text))
    kernel = render(gemm, config, dtype, "cuda")
    check, _ = verify_kernel(cuda, kernel, geometry(space, config), space.problem, seed=3)
    assert check.ok, check.summary()


def test_gemm_timing_and_the_baseline_are_measured(cuda, gemm) -> None:  # noqa: ANN001
    from kernsearch.evaluation._measure import TimingPlan, measure
    from kernsearch.evaluation._verify import kernel_inputs, make_inputs

    chip = get_chip("H100")
    space = Space(make_problem(gemm, "1024,1024,1024", "float16", chip), chip)
    config = dict(gemm.default)
    geo = geometry(space, config)
    logical = make_inputs(space.problem, 0)
    timing = cuda.time(render(gemm, config, "float16", "cuda"), geo, kernel_inputs(space.problem, logical, geo),
                       "float16")
    assert timing.evidence is Evidence.MEASURED and 0 < timing.median_ms < 100
    launch, sync = cuda.baseline_launcher(gemm, space.problem, logical)
    base = measure(launch, sync, plan=TimingPlan(min_samples=5, max_samples=5))
    assert len(base) == 5 and all(0 < t < 100 for t in base)


def test_published_h100_artifacts_run_through_the_exported_package(cuda, tmp_path) -> None:  # noqa: ANN001
    """The measured artifacts committed in artifacts/ dispatch and compute correctly from an exported wheel."""
    import importlib.util
    import sys
    from pathlib import Path

    import mlx.core as mx

    from kernsearch import ArtifactStore, export

    store = ArtifactStore(Path(__file__).resolve().parents[1] / "artifacts")
    result = export(["gemm"], tmp_path / "dist", store, package="ks_h100_kernels", version="1.0.0")
    pkg_dir = result.source_dir / "ks_h100_kernels"
    spec = importlib.util.spec_from_file_location("ks_h100_kernels", pkg_dir / "__init__.py",
                                                  submodule_search_locations=[str(pkg_dir)])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules["ks_h100_kernels"] = pkg
    spec.loader.exec_module(pkg)
    rng = np.random.default_rng(5)
    a, b = rng.uniform(-1, 1, (16, 4096)), rng.uniform(-1, 1, (4096, 4096))
    ma, mb = mx.array(a.astype(np.float16)), mx.array(b.astype(np.float16))
    decision = pkg.gemm.explain(ma, mb)
    assert "gemm/H100/float16/16x4096x4096" in str(decision), str(decision)
    c = np.array(pkg.gemm(ma, mb).astype(mx.float32), dtype=np.float64)
    ref = a.astype(np.float16).astype(np.float64) @ b.astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(c, ref, rtol=2e-3, atol=2e-3 * np.sqrt(4096))
    print(f"\nexported package on this GPU: {decision}")

"""Split-K in the GEMM family: the SPLIT_K knob adds configs only where the C tiles leave the GPU idle (every
existing config stays valid at SPLIT_K = 1), the CUDA twin adds partial sums atomically into a zero-filled C
(launch.zero_outputs, honoured by verification, timing and the exported runtime), and the model sees the
extra parallelism."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from nvcc import NVCC, nvcc
from test_gemv import cuda_unit

from kernsearch import Space, geometry, get_backend, get_chip, make_problem, render
from kernsearch.evaluation._verify import make_inputs, reference, verify_outputs

H100 = get_chip("H100")
M2 = get_chip("M2 Max")


@pytest.mark.slow
def test_split_k_only_adds_configs(gemm) -> None:  # noqa: ANN001
    decode = Space(make_problem(gemm, "16,4096,4096", "float16", H100), H100)
    valid = decode.enumerate().valid
    split = [c for c in valid if c["SPLIT_K"] > 1]
    assert len(split) > 1000 and {c["SPLIT_K"] for c in split} == {2, 4, 8, 16}
    # the big square problem fills the GPU with C tiles alone: no split-K there
    square = Space(make_problem(gemm, "4096,4096,4096", "float16", H100), H100)
    assert all(c["SPLIT_K"] == 1 for c in square.enumerate().valid[::7])
    # Apple keeps SPLIT_K = 1 (the Metal twin has no split-K yet): the M2 Max space is what it was
    apple = Space(make_problem(gemm, "16,4096,4096", "float16", M2), M2)
    assert not apple.is_valid({**gemm.default, "SPLIT_K": 4})
    assert "split_k_target" in {v.constraint for v in apple.violations({**gemm.default, "SPLIT_K": 4})}


def test_geometry_splits_the_grid_and_zero_fills(gemm) -> None:  # noqa: ANN001
    space = Space(make_problem(gemm, "16,4096,4096", "float16", H100), H100)
    cfg = space.validate(space.parse_config("BM=16,BN=64,BK=32,WM=1,WN=2,MMA=simdgroup,VEC=4,SPLIT_K=8,LAYOUT_B=t"))
    geo = geometry(space, cfg)
    assert geo.grid == (64 * 64, 1, 8) and geo.zero_outputs and geo.init_value == 0.0
    plain = geometry(space, {**cfg, "SPLIT_K": 1})
    assert plain.grid[2] == 1 and not plain.zero_outputs and plain.init_value is None
    src = render(gemm, cfg, "float16", "cuda").source
    assert "atomicAdd(&C[r * N + c]" in src and "blockIdx.z" in src
    assert "atomicAdd" not in render(gemm, {**cfg, "SPLIT_K": 1}, "float16", "cuda").source


def test_verification_of_an_accumulating_kernel_starts_from_zero(gemm) -> None:  # noqa: ANN001
    """zero_outputs: one run on zero-filled outputs; a kernel that adds into them is right, one that skips an
    element leaves a 0 there and is caught."""
    problem = make_problem(gemm, "8,16,64", "float32", H100)
    logical = make_inputs(problem, 0)
    ref = reference(problem, logical)[0]
    inits: list[float] = []

    def good(init: float) -> list[np.ndarray]:
        inits.append(init)
        return [np.full(ref.shape, init) + ref]  # adds its result into what was there

    assert verify_outputs(problem, good, logical, zero_outputs=True).ok and inits == [0.0]

    def skips(init: float) -> list[np.ndarray]:
        out = np.full(ref.shape, init) + ref
        out[3, 5] = init
        return [out]

    check = verify_outputs(problem, skips, logical, zero_outputs=True)
    assert not check.ok and check.reason == "wrong"
    # without zero_outputs, the same accumulating kernel meets NaN-filled outputs and fails
    assert not verify_outputs(problem, good, logical).ok


def test_model_predicts_split_k_helps_a_starved_grid(gemm) -> None:  # noqa: ANN001
    model = get_backend("model")
    space = Space(make_problem(gemm, "16,4096,4096", "float16", H100), H100)
    cfg = space.validate(space.parse_config("BM=16,BN=128,BK=32,WM=1,WN=4,MMA=simdgroup,VEC=4,LAYOUT_B=t,PAD=4"))
    one = model.predict_ms(space, cfg)
    eight = model.predict_ms(space, {**cfg, "SPLIT_K": 8})
    assert eight < one  # 32 blocks on 132 SMs vs 256


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed (the CUDA twin is compiled offline where it is)")
def test_split_k_cuda_sample_compiles(gemm, tmp_path: Path) -> None:  # noqa: ANN001
    space = Space(make_problem(gemm, "16,4096,4096", "float16", H100), H100)
    split = [c for c in space.enumerate().valid if c["SPLIT_K"] > 1]
    sample = random.Random(1).sample(split, 40)
    kernels = []
    for i, c in enumerate(sample):  # WMMA takes float16/bfloat16; scalar configs also float32
        dtype = ("float16", "bfloat16", "float32")[i % 3] if c["MMA"] == "scalar" else ("float16", "bfloat16")[i % 2]
        kernels.append(render(gemm, c, dtype, "cuda"))
    done = nvcc(["--ptx", "-arch=sm_90"], cuda_unit(kernels), timeout=600)
    assert done.returncode == 0, done.stderr[:2000]

"""GEMM with Metal 4 tensor ops (MMA=tensor, M5 chips) on the interpreter's MPP subset: a knob-covering
sample verifies in fast and check mode on ragged shapes, and a missing barrier before the op is a race."""

from __future__ import annotations

import random

import pytest

from kernsearch import KernelSource, Space, geometry, get_backend, get_chip, make_problem, render
from kernsearch.evaluation._verify import kernel_inputs, make_inputs, verify_kernel
from kernsearch.family._space import format_config

TENSOR_KNOBS = ("TSCOPE", "TACC", "STAGE", "LAYOUT_B", "DOUBLE_BUFFER", "BK", "WM", "WN")


def tensor_sample(gemm, n: int, seed: int) -> list[dict]:
    """``n`` valid MMA=tensor configs on M5 Max covering every value those knobs take there."""
    chip = get_chip("M5 Max")
    valid = [c for c in Space(make_problem(gemm, "64,64,64", "float16", chip), chip).enumerate().valid
             if c["MMA"] == "tensor"]
    rng = random.Random(seed)
    rng.shuffle(valid)
    chosen: list[dict] = []
    for name in TENSOR_KNOBS:
        for value in sorted({c[name] for c in valid}, key=str):
            if not any(c[name] == value for c in chosen):
                chosen.append(next(c for c in valid if c[name] == value))
    for c in valid:
        if len(chosen) >= n:
            break
        if c not in chosen:
            chosen.append(c)
    return chosen


@pytest.mark.slow
def test_tensor_configs_only_on_chips_with_neural_accelerators(gemm):
    tensor = tensor_sample(gemm, 40, seed=1)  # valid on M5 Max
    assert len(tensor) == 40
    for name, expected in (("M5", True), ("M5 Pro", True), ("M4 Max", False), ("M2 Max", False), ("H100", False)):
        chip = get_chip(name)
        space = Space(make_problem(gemm, "64,64,64", "float16", chip), chip)
        assert any(space.is_valid(c) for c in tensor) is expected, name
        if not expected:
            assert not any(space.is_valid(c) for c in tensor), name


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast", "check"])
def test_tensor_gemm_sample_verifies_on_ragged_shapes(gemm, mode):
    chip = get_chip("M5 Max")
    configs = tensor_sample(gemm, 12 if mode == "fast" else 6, seed=5)
    covered = {name: {c[name] for c in configs} for name in TENSOR_KNOBS}
    assert covered["TSCOPE"] == {"threadgroup", "simdgroup"} and covered["TACC"] == {"float32", "input"}
    assert covered["STAGE"] == {"AB", "A", "B", "none"} and covered["LAYOUT_B"] == {"n", "t"}
    cpu = get_backend("cpu")
    failures, runs = [], 0
    for i, cfg in enumerate(configs):
        for dtype in (("float16", "bfloat16", "float32") if cfg["TACC"] == "float32" else ("float16",)):
            for shape in ("33,65,7", "100,72,40"):
                problem = make_problem(gemm, shape, dtype, chip)
                space = Space(problem, chip)
                if not space.is_valid(cfg):
                    continue
                check, diags = verify_kernel(cpu, render(gemm, cfg, dtype), geometry(space, cfg), problem,
                                             seed=i, mode=mode, chip=chip)
                runs += 1
                if not check.ok or diags:
                    failures.append(f"{format_config(cfg)} {shape} {dtype}: {check.summary()} "
                                    f"{[str(d) for d in diags]}")
    assert not failures, "\n".join(failures[:5])
    assert runs >= len(configs)


def test_missing_barrier_before_the_tensor_op_is_a_race(gemm):
    chip = get_chip("M5 Max")
    problem = make_problem(gemm, "64,64,32", "float16", chip)
    space = Space(problem, chip)
    cfg = space.validate(space.parse_config("BM=32,BN=32,BK=16,WM=2,WN=2,MMA=tensor,STAGE=AB,TSCOPE=threadgroup"))
    good = render(gemm, cfg, "float16")
    assert "matmul2d<desc, execution_simdgroups<4>> op;" in good.source
    barrier = "        threadgroup_barrier(mem_flags::mem_threadgroup);\n"
    assert good.source.count(barrier) == 2
    planted = good.source.replace(barrier, "        // (barrier removed)\n", 1)
    bad = KernelSource(good.name + "_bug", "metal", good.input_names, good.output_names, good.header, planted,
                       good.template)
    geo = geometry(space, cfg)
    inputs = kernel_inputs(problem, make_inputs(problem), geo)
    cpu = get_backend("cpu")
    assert cpu.run(good, geo, inputs, "float16", mode="check").diagnostics == []
    races = [d for d in cpu.run(bad, geo, inputs, "float16", mode="check").diagnostics if d.kind == "race"]
    # the op's operand reads race with the tile stores of other threads (named at the op's line)
    assert any("op.run(" in d.message and "reads what thread" in d.message for d in races), races


def test_tensor_op_reading_past_its_extents_is_reported(gemm):
    """A static-K descriptor on the short last K step reads past the view's extents (undefined in MSL)."""
    chip = get_chip("M5 Max")
    problem = make_problem(gemm, "32,32,24", "float16", chip)
    space = Space(problem, chip)
    cfg = space.validate(space.parse_config("BM=32,BN=32,BK=16,WM=2,WN=2,MMA=tensor,STAGE=none,TSCOPE=simdgroup"))
    good = render(gemm, cfg, "float16")
    planted = good.source.replace("matmul2d_descriptor(TILE_M, TILE_N, static_cast<int>(dynamic_extent),",
                                  "matmul2d_descriptor(TILE_M, TILE_N, BK,")
    assert planted != good.source
    bad = KernelSource(good.name + "_oob", "metal", good.input_names, good.output_names, good.header, planted,
                       good.template)
    geo = geometry(space, cfg)
    inputs = kernel_inputs(problem, make_inputs(problem), geo)
    diags = get_backend("cpu").run(bad, geo, inputs, "float16", mode="fast").diagnostics
    assert any("outside the tensor's extents" in d.message for d in diags)

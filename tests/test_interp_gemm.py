"""The GEMM template on the interpreter: a 3-way covering sample of the valid configs (every combination of three
knob values, the dtype counted as a knob, found in a pool of them), each on ragged and square shapes, matches the
float64 reference (fast mode); a stratified subset is clean in check mode."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from covering import covering_sample as tway_sample

from kernsearch import Space, geometry, get_backend, get_chip, make_problem, render
from kernsearch.evaluation._verify import verify_kernel
from kernsearch.family._space import format_config

SHAPES = ("33,65,7", "100,72,40", "64,64,64")
DTYPES = ("float32", "float16", "bfloat16")
#: Valid configs drawn (seeded) as the pool the 3-way sample covers; with every knob value's own config added.
POOL = 2000
CHECK_SUBSET = 16


def covering_sample(space: Space, n: int, seed: int, valid: list[dict] | None = None) -> list[dict]:
    """``n`` valid configs such that every value of every knob appears at least once (``valid``: the space's)."""
    valid = list(space.enumerate().valid if valid is None else valid)
    rng = random.Random(seed)
    rng.shuffle(valid)
    chosen: list[dict] = []
    for name, knob in space.family.knobs.items():
        for value in knob.values:
            if not any(c[name] == value for c in valid):
                continue  # not valid on this chip (e.g. MMA=tensor without neural accelerators)
            if not any(c[name] == value for c in chosen):
                chosen.append(next(c for c in valid if c[name] == value))
    keys = {format_config(c) for c in chosen}
    for c in valid:
        if len(chosen) >= n:
            break
        if format_config(c) not in keys:
            chosen.append(c)
            keys.add(format_config(c))
    return chosen


def _precompile(jobs: list[tuple]) -> None:
    """Compile every variant first, two at a time (compiles are subprocesses); runs stay sequential."""
    from kernsearch.interp._compile import compile_unit
    from kernsearch.interp._source import cpp_unit, signature

    def one(job: tuple) -> None:
        kernel, mode, dtype = job
        sig = signature(kernel.name, kernel.input_names, kernel.output_names, kernel.source, [dtype, dtype],
                        [(64, 64), (64, 64)], [dtype], kernel.template)
        compile_unit(cpp_unit(sig, kernel.header, kernel.source, check=mode == "check"), mode)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(one, jobs))


@pytest.mark.slow
@pytest.mark.parametrize("strength", [2, pytest.param(3, marks=pytest.mark.e2e)])
def test_gemm_sample_matches_reference_on_all_shapes_and_dtypes(gemm, strength: int):
    """Every 3-way interaction of knob values and dtype found in a pool of 2,000 random valid configs (ten times
    the 200 random configs run before in every dtype: 600 compiles, CI's third slowest test) and one config per
    knob value: about 100 compiled variants, each on every shape where it is valid. ``make test`` runs every 2-way
    interaction (~24 variants, ~8 s of CPU); the 3-way sample is the e2e lane's (CI: make test-all; ~25 s), which
    runs the same lines."""
    chip = get_chip("M2 Max")
    square = Space(make_problem(gemm, "64,64,64", "float32", chip), chip)
    reachable = square.enumerate().valid
    every_value = covering_sample(square, 0, seed=3, valid=reachable)  # one config per knob value valid on the chip
    pool = every_value + random.Random(3).sample(reachable, POOL)
    sample = tway_sample([{**cfg, "dtype": dt} for cfg in pool for dt in DTYPES], strength, seed=3)
    plan = [({k: v for k, v in c.items() if k != "dtype"}, c["dtype"]) for c in sample]
    for name in gemm.knobs:  # every knob value valid on the chip appears
        assert {c[name] for c, _ in plan} == {c[name] for c in reachable}, name
    assert {(c[name], dt) for c, dt in plan for name in ("MMA", "VEC", "SPLIT_K")} == {
        (c[name], dt) for c in pool for dt in DTYPES for name in ("MMA", "VEC", "SPLIT_K")}  # each in each dtype
    assert (60 <= len(plan) <= 200) if strength == 3 else (20 <= len(plan) <= 60), len(plan)
    _precompile([(render(gemm, cfg, dt), "fast", dt) for cfg, dt in plan])
    cpu = get_backend("cpu")
    runs, failures, dtypes_seen = 0, [], set()
    for cfg, dtype in plan:
        for shape in SHAPES:
            problem = make_problem(gemm, shape, dtype, chip)
            space = Space(problem, chip)
            if not space.is_valid(cfg):  # e.g. VEC > 1 needs K % VEC == 0; K = 7 allows VEC = 1 only
                continue
            check, diags = verify_kernel(cpu, render(gemm, cfg, dtype), geometry(space, cfg), problem, seed=runs)
            runs += 1
            dtypes_seen.add(dtype)
            errors = [d for d in diags if d.severity == "error"]
            if not check.ok or errors:
                failures.append(f"{format_config(cfg)} {shape} {dtype}: {check.summary()} {errors}")
    assert not failures, "\n".join(failures[:10])
    assert dtypes_seen == set(DTYPES)
    assert runs >= 2 * len(plan)  # every (config, dtype) ran on the square shape and at least one ragged one


@pytest.mark.slow
def test_gemm_stratified_subset_is_clean_in_check_mode(gemm):
    chip = get_chip("M2 Max")
    square = Space(make_problem(gemm, "64,64,64", "float32", chip), chip)
    configs = covering_sample(square, CHECK_SUBSET, seed=11)
    plan = [(cfg, DTYPES[i % len(DTYPES)]) for i, cfg in enumerate(configs)]
    _precompile([(render(gemm, cfg, dt), "check", dt) for cfg, dt in plan])
    cpu = get_backend("cpu")
    for i, (cfg, dtype) in enumerate(plan):
        shape = "33,65,7" if cfg["VEC"] == 1 else "100,72,40"
        problem = make_problem(gemm, shape, dtype, chip)
        space = Space(problem, chip)
        check, diags = verify_kernel(cpu, render(gemm, cfg, dtype), geometry(space, cfg), problem, seed=i,
                                     mode="check", chip=chip)
        assert check.ok, f"{format_config(cfg)} {shape} {dtype}: {check.summary()}"
        assert diags == [], f"{format_config(cfg)} {shape} {dtype}: {[str(d) for d in diags]}"

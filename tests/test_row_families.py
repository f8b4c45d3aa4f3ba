"""The row families (rmsnorm, layernorm, softmax, swiglu): each Metal template verifies on the interpreter
over a knob-covering sample of configs at ragged shapes (fast mode; check mode for a share of them), the
CUDA twins compile with nvcc for sm_90, a broken kernel is caught, and the model ranks the knobs sensibly."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import builtin_families
from covering import covering_sample as tway_sample
from rowfamilies import DTYPES, H100, M2, NVCC, covering_sample, nvcc_compiles, run_all, valid

from kernsearch import Space, get_backend, get_chip, load_family, make_problem

#: The row families found (a row count and a row length), not listed: each needs its shapes below.
FAMILIES = builtin_families(dims=2)
#: A single row, ragged rows (odd, prime lengths: VEC = 1 only), several rows per threadgroup, aligned rows.
SHAPES = {"rmsnorm": ("1,96", "7,77", "9,40", "3,256"), "layernorm": ("1,96", "7,77", "9,40", "3,256"),
          "softmax": ("1,96", "7,77", "9,40", "3,256"), "swiglu": ("1,96", "7,77", "3,256")}


def test_every_row_family_found_has_its_shapes() -> None:
    assert FAMILIES and sorted(SHAPES) == sorted(FAMILIES)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest):  # noqa: ANN201
    return load_family(request.param)


def test_listed_with_both_targets_and_a_valid_default(family) -> None:  # noqa: ANN001
    assert set(family.templates) == {"metal", "cuda"} and family.description
    for chip in (M2, H100):
        for shape in SHAPES[family.name]:
            sp = Space(make_problem(family, shape, "float16", chip), chip)
            if shape.endswith(("96", "256", "40")):
                assert sp.is_valid(dict(family.default)) or family.default.get("VEC", 1) > 1


@pytest.mark.slow
def test_every_knob_value_is_reachable_at_large_shapes(family) -> None:  # noqa: ANN001
    shapes = ("16384,4096", "4096,4096", "32,8192", "1,4096", "8192,1024") if family.name != "swiglu" else (
        "4096,11008", "4096,14336", "32,11008", "1,4096")
    seen: dict[str, set] = {k: set() for k in family.knobs}
    for chip in (M2, H100):
        for shape in shapes:
            for cfg in valid(family, shape, chip):
                for k, v in cfg.items():
                    seen[k].add(v)
    for name, knob in family.knobs.items():
        assert seen[name] == set(knob.values), (name, seen[name])


@pytest.mark.slow
def test_sample_matches_reference_on_ragged_shapes(family) -> None:  # noqa: ANN001
    """Fast lane: every knob value valid at a ragged and an aligned shape at least once, dtypes rotated."""
    plan = covering_sample(family, ("7,77", "3,256"), per_shape=4)
    runs, failures = run_all(family, plan, "fast")
    assert runs == len(plan) >= 6 and not failures, failures[:3]


@pytest.mark.slow
def test_sample_is_race_free_in_check_mode(family) -> None:  # noqa: ANN001
    """Threadgroup races, uninitialised threadgroup reads, barrier divergence: check mode on a sample."""
    plan = covering_sample(family, SHAPES[family.name][1:3], per_shape=4, seed=9)
    runs, failures = run_all(family, plan, "check")
    assert runs == len(plan) >= 6 and not failures, failures[:3]


@pytest.mark.slow
@pytest.mark.parametrize("strength", [1, pytest.param(2, marks=pytest.mark.e2e)])
def test_wider_sweep_fast_mode(family, strength: int) -> None:  # noqa: ANN001
    """Every shape (a single row, ragged rows, several rows per threadgroup, aligned rows) in every dtype: a 2-way
    covering sample of the valid configs at every shape in every dtype (each pair of values of two knobs, a knob and
    the shape or the dtype, the shape and the dtype, that the space has; ~36 variants). Before: every knob value at
    each shape and random others, 16 a shape (64 variants), which ran no pair this misses by design.

    ``make test`` runs a 1-way sample with the shape and dtype as one knob (every shape in every dtype, every knob
    value: ~12 variants, ~8 s of CPU for the four families); the 2-way sample is the e2e lane's (CI: make test-all;
    ~24 s), which runs the same lines."""
    candidates = [{**c, "shape": shape, "dtype": dtype} for shape in SHAPES[family.name] for dtype in DTYPES
                  for c in valid(family, shape, M2, dtype)]
    if strength == 1:  # the shape and the dtype as one knob: every pair of them is a value to cover
        sample = [{**c, "at": (c["shape"], c["dtype"])} for c in candidates]
        chosen = [{k: v for k, v in c.items() if k != "at"} for c in tway_sample(sample, 1, seed=11)]
    else:
        chosen = tway_sample(candidates, 2, seed=11)
    plan = [({k: v for k, v in c.items() if k in family.knobs}, c["dtype"], c["shape"]) for c in chosen]
    assert {(d, s) for _, d, s in plan} == {(c["dtype"], c["shape"]) for c in candidates}
    for name in family.knobs:
        assert {c[name] for c, _, _ in plan} == {c[name] for c in candidates}, name
    runs, failures = run_all(family, plan, "fast")
    assert runs == len(plan) >= (20 if strength == 2 else 8) and not failures, failures[:3]


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed (the CUDA twins are compiled offline where it is)")
@pytest.mark.parametrize("sample", ["each_value", pytest.param("stride", marks=pytest.mark.e2e)])
def test_cuda_twin_compiles_for_h100(family, tmp_path: Path, sample: str) -> None:  # noqa: ANN001
    """The CUDA twin compiles with nvcc for sm_90: ``make test`` compiles a 1-way covering sample of the valid H100
    configs and the dtypes (every knob value and every dtype: ~6 kernels, ~2 s of CPU a family for ~5); the e2e
    lane (CI: make test-all) every (count / 60)-th valid config in a rotating dtype (~60), which runs the same
    lines."""
    shape = "4096,4096" if family.name != "swiglu" else "4096,11008"
    pool = valid(family, shape, H100)
    configs = []
    if sample == "each_value":
        candidates = [{**c, "dtype": dtype} for dtype in ("float16", "bfloat16", "float32")
                      for c in valid(family, shape, H100, dtype)]
        configs = [({k: v for k, v in c.items() if k != "dtype"}, c["dtype"]) for c in tway_sample(candidates, 1)]
        for name in family.knobs:
            assert {c[name] for c, _ in configs} == {c[name] for c in pool}, name
        assert {d for _, d in configs} == {"float16", "bfloat16", "float32"}
    else:
        step = max(1, len(pool) // 60)
        for i, cfg in enumerate(pool[::step]):
            for dtype in ("float16", "bfloat16", "float32")[i % 3:] + ("float16",):
                if Space(make_problem(family, shape, dtype, H100), H100).is_valid(cfg):
                    configs.append((cfg, dtype))
                    break
        assert len(configs) >= 30
    errors = nvcc_compiles(family, configs, tmp_path)
    assert not errors, errors


def test_a_broken_reduction_is_caught(tmp_path: Path) -> None:
    """Dropping the threadgroup round of the simd reduction (rows of several simdgroups) must fail."""
    fam = load_family("rmsnorm")
    folder = tmp_path / "rmsnorm"
    shutil.copytree(fam.path, folder)
    tmpl = folder / "rmsnorm.metal.j2"
    tmpl.write_text(tmpl.read_text().replace("for (int k = 1; k < SPR; ++k)", "for (int k = 1; k < 1; ++k)"))
    bad = load_family(folder)
    cfg = {**bad.default, "TG": 128, "ROWS": 1, "VEC": 1, "HOLD": "device", "REDUCE": "simd"}
    runs, failures = run_all(bad, [(cfg, "float32", "3,256")], "fast")
    assert runs == 1 and len(failures) == 1 and "wrong" in failures[0]


def test_model_prefers_held_rows_at_large_shapes() -> None:
    model = get_backend("model", chip="H100")
    for name in builtin_families(dims=2, knob="HOLD"):
        fam = load_family(name)
        sp = Space(make_problem(fam, "16384,4096", "float16", H100), H100)
        base = {**fam.default, "TG": 512, "ROWS": 1, "VEC": 8, "UNROLL": 1}
        held = model.predict_ms(sp, {**base, "HOLD": "registers"})
        assert held < model.predict_ms(sp, {**base, "HOLD": "device"}), name  # x re-read from memory
        bytes_ = sp.problem.bytes()
        assert bytes_ / (held * 1e-3) < get_chip("H100").memory_bandwidth_gbs * 1e9  # never above the roofline

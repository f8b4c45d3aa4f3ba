"""The gemv family: every valid config on the interpreter (ragged shapes, all dtypes), the CUDA twin through
nvcc, the layout knob's transposed input, and the model's coverage."""

from __future__ import annotations

import random
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from covering import covering_sample as tway_sample
from nvcc import NVCC, nvcc

from kernsearch import Space, geometry, get_backend, get_chip, load_family, make_problem, render
from kernsearch.evaluation._verify import verify_kernel

M2 = get_chip("M2 Max")
H100 = get_chip("H100")
#: M = 1 (the decode case), a ragged M and N, K not a multiple of any vector (VEC = 1 only), an aligned one.
SHAPES = ("1,100,72", "5,37,96", "16,64,33", "3,130,256")
DTYPES = ("float16", "bfloat16", "float32")


@pytest.fixture(scope="module")
def gemv():
    return load_family("gemv")


def _valid(fam, shape: str, chip=M2, dtype: str = "float16") -> list[dict]:  # noqa: ANN001
    return Space(make_problem(fam, shape, dtype, chip), chip).enumerate().valid


def test_space_covers_every_knob_value_and_the_default_is_valid(gemv) -> None:  # noqa: ANN001
    at_16 = _valid(gemv, "16,4096,4096")
    for name, knob in gemv.knobs.items():
        assert {c[name] for c in at_16} == set(knob.values), name
    assert dict(gemv.default) in _valid(gemv, "1,4096,4096")
    # M = 1: a row block of one; the layout decides whether W arrives transposed
    at_1 = _valid(gemv, "1,4096,4096")
    assert {c["MB"] for c in at_1} == {1} and len(at_1) >= 200
    space = Space(make_problem(gemv, "1,4096,4096", "float16", M2), M2)
    assert geometry(space, {**gemv.default, "LAYOUT_W": "nk"}).transposed_inputs == ("W",)
    assert geometry(space, {**gemv.default, "LAYOUT_W": "kn", "KS": 1}).transposed_inputs == ()


def _run_all(fam, plan: list[tuple[dict, str, str]], mode: str) -> tuple[int, list[str]]:  # noqa: ANN001
    from kernsearch.interp._compile import compile_unit
    from kernsearch.interp._source import cpp_unit, signature

    kernels = {(str(sorted(c.items())), d): render(fam, c, d) for c, d, _ in plan}

    def compile_one(kernel) -> None:  # noqa: ANN001
        dt = kernel.template[0][1]
        dtypes = list(fam.kernel_input_dtypes(dt))
        sig = signature(kernel.name, kernel.input_names, kernel.output_names, kernel.source, dtypes,
                        [(64, 64)] * len(dtypes), list(fam.output_dtypes(dt)), kernel.template)
        compile_unit(cpp_unit(sig, kernel.header, kernel.source, check=mode == "check"), mode)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(compile_one, kernels.values()))
    cpu = get_backend("cpu", mode=mode)
    failures, runs = [], 0
    for cfg, dtype, shape in plan:
        problem = make_problem(fam, shape, dtype, M2)
        space = Space(problem, M2)
        check, diags = verify_kernel(cpu, kernels[(str(sorted(cfg.items())), dtype)], geometry(space, cfg),
                                     problem, seed=runs)
        runs += 1
        if not check.ok or any(d.severity == "error" for d in diags):
            failures.append(f"{shape} {dtype} {cfg}: {check.summary()} {[d.message for d in diags][:2]}")
    return runs, failures


@pytest.mark.slow
def test_sample_matches_reference_on_ragged_shapes_in_every_dtype(gemv) -> None:  # noqa: ANN001
    """Fast lane: a knob-covering sample of configs, each at every shape where it is valid, dtypes rotated."""
    rng = random.Random(5)
    plan = []
    for shape in SHAPES:
        valid = _valid(gemv, shape)
        rng.shuffle(valid)
        chosen = []
        for name, knob in gemv.knobs.items():  # every knob value valid at this shape appears
            for value in knob.values:
                hit = next((c for c in valid if c[name] == value and c not in chosen), None)
                if hit is not None and not any(c[name] == value for c in chosen):
                    chosen.append(hit)
        chosen += [c for c in valid if c not in chosen][: 12 - len(chosen)]
        plan += [(c, DTYPES[i % 3], shape) for i, c in enumerate(chosen)]
    runs, failures = _run_all(gemv, plan, "fast")
    assert runs == len(plan) >= 40 and not failures, failures[:5]


def _split(candidate: dict) -> tuple[dict, str, str]:
    """(config, dtype, shape) of a covering sample's candidate."""
    return {k: v for k, v in candidate.items() if k not in ("dtype", "shape")}, candidate["dtype"], candidate["shape"]


@pytest.mark.slow
@pytest.mark.parametrize("strength", [2, pytest.param(3, marks=pytest.mark.e2e)])
def test_every_t_way_interaction_of_the_valid_configs_matches_reference_fast_and_check(gemv, strength: int) -> None:  # noqa: ANN001
    """The valid configs at M = 16 (so every row block), each on a ragged shape where it is valid (K = 33 allows
    VEC = 1 only), in each dtype: a 3-way covering sample of them (every combination of three knob values, dtype
    and shape counted as knobs, that the space has: ~140 variants) in fast mode, a 2-way one also in check mode
    (races, out-of-bounds, uninitialised reads, barrier divergence). Before: every other valid config in four
    quarters (~530 variants, CI's four slowest tests after the servers), which ran no 3-way interaction this
    misses; test_sample_matches_reference_on_ragged_shapes_in_every_dtype above runs every knob value.

    ``make test`` runs the 2-way sample in fast mode (~28 variants) and the 2-way one in check mode; the 3-way
    sample in fast mode is the e2e lane's (CI: make test-all; ~26 s of CPU with the check-mode half, for ~11 s),
    which runs the same lines."""
    everything = _valid(gemv, "16,64,96")
    assert len(everything) > 1000
    shapes = {s: _valid(gemv, s) for s in ("16,37,96", "9,64,33", "16,130,256")}
    candidates = [{**c, "dtype": dt, "shape": s} for c in everything for s, there in shapes.items() if c in there
                  for dt in DTYPES]
    plan = [_split(c) for c in tway_sample(candidates, strength, seed=5)]
    assert {k: {c[k] for c, _, _ in plan} for k in gemv.knobs} == {k: {c[k] for c in everything} for k in gemv.knobs}
    assert (80 <= len(plan) <= 250) if strength == 3 else (20 <= len(plan) <= 60), len(plan)
    runs, failures = _run_all(gemv, plan, "fast")
    assert runs == len(plan) and not failures, failures[:5]
    if strength == 3:
        return  # the check-mode half runs in make test's case
    checked = [_split(c) for c in tway_sample(candidates, 2, seed=6)]
    runs, failures = _run_all(gemv, checked, "check")
    assert runs == len(checked) >= 20 and not failures, failures[:5]


def test_a_wrong_kernel_is_caught(gemv, tmp_path: Path) -> None:  # noqa: ANN001
    """The sweep can fail: a template that drops the last K split's partial sum is reported wrong."""
    folder = tmp_path / "gemv"
    shutil.copytree(gemv.path, folder)
    tmpl = folder / "gemv.metal.j2"
    tmpl.write_text(tmpl.read_text().replace("for (int p = 1; p < KS; ++p)", "for (int p = 1; p < KS - 1; ++p)"))
    bad = load_family(str(folder))
    cfg = {**bad.default, "KS": 4, "SG": 4, "VEC": 1}  # K = 128: every split has work
    runs, failures = _run_all(bad, [(cfg, "float32", "2,40,128")], "fast")
    assert runs == 1 and len(failures) == 1 and "wrong" in failures[0]


_CTYPE = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float"}


def cuda_unit(kernels: list, fixed: dict[str, str] | None = None) -> str:  # noqa: ANN001
    """Rendered CUDA bodies wrapped as MLX's cuda_kernel wraps them (inputs, shapes, outputs), one namespace each;
    ``fixed`` gives inputs of a fixed C type (e.g. ``{"W": "unsigned int"}``), the rest are ``T``."""
    fixed = fixed or {}
    parts = ["#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <mma.h>\n"]
    for i, k in enumerate(kernels):
        header = "\n".join(line for line in k.header.splitlines() if not line.startswith("#include"))
        header = header.replace("namespace wmma = nvcuda::wmma;", "namespace wmma = ::nvcuda::wmma;")
        ct = _CTYPE[k.template[0][1]]
        args = ", ".join([f"const {fixed.get(n, 'T')}* {n}, const int* {n}_shape" for n in k.input_names]
                         + [f"T* {n}" for n in k.output_names])
        inst = ", ".join([f"const {fixed.get(n, ct)}*, const int*" for n in k.input_names] + [f"{ct}*" for _ in k.output_names])
        parts.append(f"namespace v{i} {{\n{header}\ntemplate <typename T> __global__ void kernel({args}) {{\n"
                     f"{k.source}}}\ntemplate __global__ void kernel<{ct}>({inst});\n}}\n")
    return "".join(parts)


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed (the CUDA twin is compiled offline where it is)")
@pytest.mark.parametrize("strength", [2, pytest.param(3, marks=pytest.mark.e2e)])
def test_cuda_twin_compiles_for_h100(gemv, tmp_path: Path, strength: int) -> None:  # noqa: ANN001
    """Every valid H100 config renders to distinct code; a 3-way covering sample of them and the dtypes (every
    combination of three knob values and dtype the space has: ~130 kernels, where compiling all ~1060 took CI
    137 s) compiles. ``make test`` compiles the 2-way sample (~30 kernels, every pair of knob values and dtype;
    ~4 s of CPU for ~11); the 3-way one is the e2e lane's (CI: make test-all), which runs the same lines."""
    valid = _valid(gemv, "16,4096,4096", H100)
    assert len(valid) > 600
    kernels = [render(gemv, c, DTYPES[i % 3], "cuda") for i, c in enumerate(valid)]
    assert len({k.sha256 for k in kernels}) == len(kernels)
    sample = tway_sample([{**c, "dtype": dt} for c in valid for dt in DTYPES], strength, seed=1)
    assert {c["dtype"] for c in sample} == set(DTYPES) and len(sample) >= (60 if strength == 3 else 20)
    kernels = [render(gemv, {k: v for k, v in c.items() if k != "dtype"}, c["dtype"], "cuda") for c in sample]
    done = nvcc(["--ptx", "-arch=sm_90"], cuda_unit(kernels), timeout=600)
    assert done.returncode == 0, done.stderr[:2000]


def test_model_ranks_gemv_by_weight_traffic(gemv) -> None:  # noqa: ANN001
    """Modeled times exist for every config; re-reading W per row of X (MB=1 at M=16) is predicted slower."""
    model = get_backend("model", chip="H100")
    space = Space(make_problem(gemv, "16,4096,4096", "float16", H100), H100)
    base = {**gemv.default, "MB": 16, "R": 1, "VEC": 4, "SG": 4}
    t_once = model.predict_ms(space, base)
    t_16x = model.predict_ms(space, {**base, "MB": 1})
    assert 0 < t_once < t_16x
    for cfg in space.enumerate().valid[::25]:
        assert model.predict_ms(space, cfg) > 0

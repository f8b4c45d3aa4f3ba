"""The qmatvec family (MLX affine quantization, bits 4/8, groups 32/64/128): the space, every layout on the
interpreter against the float64 dequantizing reference (ragged shapes, every dtype), the CUDA twin through
nvcc, and the model."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest
from test_gemv import NVCC, _run_all, cuda_unit

from kernsearch import Space, geometry, get_backend, get_chip, load_family, make_problem, render

M2 = get_chip("M2 Max")
H100 = get_chip("H100")
DTYPES = ("float16", "bfloat16", "float32")
#: (M, N, K, KW = K·BITS/32, NG = K/G): M = 1 and ragged M/N; every group size; both widths; K a few groups long.
SHAPES = ("1,40,256,32,4", "5,37,256,32,8", "3,29,384,96,3", "16,64,128,32,4")


@pytest.fixture(scope="module")
def qmatvec():
    return load_family("qmatvec")


def _valid(fam, shape: str, chip=M2, dtype: str = "float16") -> list[dict]:  # noqa: ANN001
    return Space(make_problem(fam, shape, dtype, chip), chip).enumerate().valid


def test_space_pins_the_field_width_and_covers_every_knob(qmatvec) -> None:  # noqa: ANN001
    four, eight = _valid(qmatvec, "16,4096,4096,512,64"), _valid(qmatvec, "16,4096,4096,1024,64")
    assert {c["QBITS"] for c in four} == {4} and {c["QBITS"] for c in eight} == {8}
    for name, knob in qmatvec.knobs.items():
        assert {c[name] for c in four + eight} == set(knob.values), name
    assert dict(qmatvec.default) in _valid(qmatvec, "1,4096,4096,512,64")
    space = Space(make_problem(qmatvec, "1,4096,4096,512,64", "float16", M2), M2)
    assert not space.is_valid({**qmatvec.default, "QBITS": 8})
    bad_group = Space(make_problem(qmatvec, "1,4096,4096,512,256", "float16", M2), M2)  # groups of 16
    assert "quantization" in {v.constraint for v in bad_group.violations(dict(qmatvec.default))}
    cols = {**qmatvec.default, "LAYOUT_Q": "cols", "R": 1}
    assert geometry(space, cols).transposed_inputs == ("W", "S", "Bq")
    assert geometry(space, dict(qmatvec.default)).transposed_inputs == ()
    assert geometry(space, dict(qmatvec.default)).input_dtypes == ("float16", "uint32", "float16", "float16")


@pytest.mark.slow
def test_sample_matches_the_dequantizing_reference(qmatvec) -> None:  # noqa: ANN001
    rng = random.Random(2)
    plan = []
    for shape in SHAPES:
        valid = _valid(qmatvec, shape)
        rng.shuffle(valid)
        chosen: list[dict] = []
        for name, knob in qmatvec.knobs.items():
            for value in knob.values:
                hit = next((c for c in valid if c[name] == value), None)
                if hit is not None and not any(c[name] == value for c in chosen):
                    chosen.append(hit)
        chosen += [c for c in valid if c not in chosen][: 10 - len(chosen)]
        plan += [(c, DTYPES[i % 3], shape) for i, c in enumerate(chosen)]
    runs, failures = _run_all(qmatvec, plan, "fast")
    assert runs == len(plan) >= 36 and not failures, failures[:5]


@pytest.mark.slow
@pytest.mark.parametrize("quarter", range(4))
def test_every_valid_config_matches_fast_and_check(qmatvec, quarter: int) -> None:  # noqa: ANN001
    """Every valid config of both widths once (ragged shapes, dtypes rotated); every eighth in check mode.
    In four quarters, so test workers share it."""
    plan = []
    for bits, shapes in ((4, ("16,37,256,32,4", "9,40,512,64,4")), (8, ("16,29,384,96,12", "9,64,256,64,2"))):
        for i, c in enumerate(_valid(qmatvec, f"16,64,512,{16 * bits},8")):
            ok = [s for s in shapes if c in _valid(qmatvec, s)]
            plan.append((c, DTYPES[i % 3], ok[i % len(ok)]))
    assert len(plan) > 1000
    plan = plan[quarter::4]
    runs, failures = _run_all(qmatvec, plan, "fast")
    assert runs == len(plan) and not failures, failures[:5]
    runs, failures = _run_all(qmatvec, plan[::8], "check")
    assert not failures, failures[:5]


def test_wrong_unpacking_is_caught(qmatvec, tmp_path: Path) -> None:  # noqa: ANN001
    import shutil

    folder = tmp_path / "qmatvec"
    shutil.copytree(qmatvec.path, folder)
    tmpl = folder / "qmatvec.metal.j2"
    tmpl.write_text(tmpl.read_text().replace("(QB * f)", "(QB * (PW - 1 - f))"))  # high bits first: wrong
    bad = load_family(str(folder))
    runs, failures = _run_all(bad, [(dict(bad.default), "float32", "2,40,256,32,4")], "fast")
    assert runs == 1 and len(failures) == 1 and "wrong" in failures[0]


def test_model_predicts_every_config(qmatvec) -> None:  # noqa: ANN001
    """The model covers the family: a finite positive prediction for every valid config, not all alike, and
    the 8-bit problem (twice the weight bytes) predicted slower at its best than the 4-bit one."""
    model = get_backend("model", chip="H100")
    best = {}
    for bits in (4, 8):
        space = Space(make_problem(qmatvec, f"1,4096,4096,{128 * bits},64", "float16", H100), H100)
        times = [model.predict_ms(space, c) for c in space.enumerate().valid]
        assert all(0 < t < 10 for t in times) and len(set(times)) > len(times) // 4
        best[bits] = min(times)
    assert best[4] < best[8]


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed (the CUDA twin is compiled offline where it is)")
def test_cuda_twin_compiles_for_h100(qmatvec, tmp_path: Path) -> None:  # noqa: ANN001
    kernels = []
    for bits in (4, 8):
        valid = _valid(qmatvec, f"16,4096,4096,{128 * bits},64", H100)
        kernels += [render(qmatvec, c, DTYPES[i % 3], "cuda") for i, c in enumerate(valid) if i % 6 == bits % 6]
    assert len(kernels) > 150
    (tmp_path / "q.cu").write_text(cuda_unit(kernels, {"W": "unsigned int"}))
    done = subprocess.run([NVCC, "--ptx", "-arch=sm_90", "-o", str(tmp_path / "q.ptx"), str(tmp_path / "q.cu")],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[:2000]


def test_explain_names_the_layout_a_kernel_expects(qmatvec) -> None:  # noqa: ANN001
    """The exported dispatcher's explanation says which inputs a chosen kernel takes pre-transposed."""
    from kernsearch.exporting._export import _family_table
    from kernsearch.exporting.runtime._runtime import Decision, Dispatcher

    table = _family_table(qmatvec)
    chip = {"name": "H100", "vendor": "nvidia", "simd_width": 32, "max_threads_per_threadgroup": 1024,
            "threadgroup_memory_bytes": 232448, "gpu_cores": 132, "neural_accelerators": False}
    dims = {"M": 1, "N": 4096, "K": 4096, "KW": 512, "NG": 64}
    for layout, expect in (("cols", "takes W, S, Bq transposed"), ("rows", "inputs as given")):
        cfg = {**qmatvec.default, "LAYOUT_Q": layout, "R": 1}
        decision = Decision("qmatvec", "exact chip", "H100", (1, 4096, 4096, 512, 64), "float16", entry={"config": cfg})
        Dispatcher._layout_note(decision, table, dims, chip)
        assert any(expect in w and f"LAYOUT_Q={layout}" in w for w in decision.why), decision.why

"""The family contract as data: per-input dtypes and distributions, scalar parameters, a fused MLX baseline
from the vocabulary, every spec error at once, one default chip — on a toy family added as data only
(tests/families/scaled_rmsnorm: x and w of the problem dtype, scale uint32, eps a parameter)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernsearch import Space, geometry, get_chip, load_family, make_problem, render
from kernsearch._errors import SpecError
from kernsearch.evaluation._verify import kernel_inputs, make_inputs, reference, verify_kernel
from kernsearch.exporting.runtime import _runtime
from kernsearch.family._spec import parse_family
from kernsearch.family._vocab import ARRAY_FUNCTIONS, numpy_namespace, unpack

TOY = Path(__file__).parent / "families" / "scaled_rmsnorm"
M2MAX = get_chip("M2 Max")


def run_cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    import os

    env = {**os.environ, "KERNSEARCH_HOME": str(home), "KERNSEARCH_ARTIFACTS": str(home / "artifacts")}
    return subprocess.run([sys.executable, "-m", "kernsearch", *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=home.parent)


def toy_space(shape: str = "5,77", dtype: str = "float32") -> Space:
    fam = load_family(TOY)
    return Space(make_problem(fam, shape, dtype, M2MAX), M2MAX)


# -- the spec ---------------------------------------------------------------------------------------------

def test_toy_family_declares_dtypes_distributions_params_and_baseline() -> None:
    fam = load_family(TOY)
    assert [t.dtype for t in fam.inputs] == ["T", "T", "uint32"]
    assert [t.distribution.kind for t in fam.inputs] == ["uniform", "positive", "integer"]
    assert fam.kernel_input_names == ("x", "w", "scale", "eps")
    assert fam.kernel_input_dtypes("float16") == ("float16", "float16", "uint32", "float32")
    assert fam.param_values == {"eps": pytest.approx(1e-5)}
    assert fam.baseline_name.startswith("MLX rms_norm(x, w, eps)")


def test_inputs_follow_their_distribution_and_dtype_and_params_are_one_element_inputs() -> None:
    sp = toy_space("40,300", "float16")
    logical = make_inputs(sp.problem, seed=3)
    x, w, scale = logical["x"], logical["w"], logical["scale"]
    assert x.dtype == np.float64 and x.min() >= -1 and x.max() <= 1 and x.min() < -0.5
    assert np.array_equal(x.astype(np.float16).astype(np.float64), x)  # exact in float16
    assert w.min() >= 0.5 and w.max() <= 1.5
    assert scale.dtype == np.uint32 and set(np.unique(scale)) == {1, 2, 3, 4}
    cfg = sp.parse_config("")
    arrays = kernel_inputs(sp.problem, logical, geometry(sp, cfg))
    assert [a.dtype for a in arrays[2:]] == [np.uint32, np.float32]
    assert arrays[3].shape == (1,) and arrays[3][0] == np.float32(1e-5)
    ref = reference(sp.problem, logical)[0]
    expected = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + float(np.float32(1e-5))) * w * scale[:, None]
    np.testing.assert_allclose(ref, expected, rtol=1e-12)


def test_geometry_carries_each_kernel_input_dtype() -> None:
    sp = toy_space("5,77", "bfloat16")
    geo = geometry(sp, sp.parse_config("TG=32"))
    assert geo.input_dtypes == ("bfloat16", "bfloat16", "uint32", "float32")
    assert geo.output_dtypes == ("bfloat16",)
    assert render(sp.family, sp.parse_config("TG=32"), "bfloat16").input_names == ("x", "w", "scale", "eps")


def spec(**changes: object) -> dict:
    import tomllib

    data = tomllib.loads((TOY / "family.toml").read_text())
    data.update(changes)
    return data


@pytest.mark.parametrize("change, message", [
    ({"inputs": [{"name": "x", "shape": "[R, N]", "dtype": "uint32"}]}, "integer or packed distribution"),
    ({"inputs": [{"name": "x", "shape": "[R, N]", "distribution": {"kind": "packed", "bits": 4}}]},
     'needs dtype = "uint32"'),
    ({"inputs": [{"name": "x", "shape": "[R, N]", "distribution": {"kind": "positive", "low": -1}}]}, "low > 0"),
    ({"inputs": [{"name": "x", "shape": "[R, N]", "distribution": {"kind": "integer"}}]}, "whole low and high"),
    ({"inputs": [{"name": "x", "shape": "[R, N]", "dtype": "int8"}]}, "dtype"),
    ({"params": {"eps": True}}, "not a boolean"),
    ({"params": {"eps": {"value": 1.5, "dtype": "int32"}}}, "fractional"),
    ({"params": {"N": 1.0}}, "params.N: name is taken"),
    ({"baseline": "rms_norm(x, w, eps, nope)"}, "unknown name(s) nope"),
    ({"baseline": "eval(x)"}, "unknown name(s) eval"),
])
def test_bad_contract_fields_are_named(change: dict, message: str) -> None:
    with pytest.raises(SpecError, match=None) as info:
        parse_family(spec(**change), TOY / "family.toml")
    assert message in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_every_error_of_a_spec_is_reported_at_once() -> None:
    data = spec(baseline="rms_norm(x, w, epsilon)", reference="nothing(x)", default={"TG": 64, "ACC": "bad"})
    with pytest.raises(SpecError) as info:
        parse_family(data, "family.toml")
    text = str(info.value)
    assert text.startswith("family.toml (3 errors): ")
    for part in ("baseline: unknown name(s) epsilon", "reference: unknown name(s) nothing", "default.ACC: 'bad'"):
        assert part in text
    fields = spec(name="Bad Name", knobs={"TG": {"kind": "nope", "values": [1]}})
    with pytest.raises(SpecError) as info:
        parse_family(fields, "family.toml")
    assert "errors)" in str(info.value) and "name:" in str(info.value) and "knobs.TG.kind" in str(info.value)


def test_vocabulary_is_the_same_in_kernsearch_and_the_exported_runtime() -> None:
    import mlx.core as mx

    assert set(_runtime.mlx_vocabulary(mx)) == set(ARRAY_FUNCTIONS) == set(numpy_namespace())


def test_fused_baselines_match_their_numpy_meaning_on_mlx() -> None:
    """Each fused op of the vocabulary (as the exported package and the back-ends run it) against NumPy."""
    import mlx.core as mx

    from kernsearch.backends._mlx_base import mlx_namespace

    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (4, 64)).astype(np.float32)
    w, b = rng.uniform(0.5, 1.5, 64).astype(np.float32), rng.uniform(-1, 1, 64).astype(np.float32)
    words = rng.integers(0, 2**32, (8, 8), dtype=np.uint64).astype(np.uint32)
    scales, biases = rng.uniform(0.5, 1, (8, 1)).astype(np.float32), rng.uniform(-1, 0, (8, 1)).astype(np.float32)
    q = rng.uniform(-1, 1, (3, 64)).astype(np.float32)
    cases = {
        "rms_norm": ((x, w, 1e-5), {}), "layer_norm": ((x, w, b, 1e-5), {}), "softmax": ((x,), {}),
        "silu": ((x,), {}), "sigmoid": ((x,), {}), "gelu": ((x,), {}), "rsqrt": ((w,), {}),
        "dequantize": ((words, scales, biases), {"group_size": 64, "bits": 4}),
        "quantized_matmul": ((q, words, scales, biases), {"transpose": True, "group_size": 64, "bits": 4}),
    }
    ref_ns, ns = numpy_namespace(), mlx_namespace()
    for name, (args, kwargs) in cases.items():
        want = ref_ns[name](*[a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype != np.uint32 else a
                              for a in args], **kwargs)
        for fn in (ns[name], _runtime.mlx_vocabulary(mx)[name]):
            got = fn(*[mx.array(a) if isinstance(a, np.ndarray) else a for a in args], **kwargs)
            np.testing.assert_allclose(np.array(got), want, rtol=2e-5, atol=2e-5, err_msg=name)
    parts = ns["split"](mx.array(x), 2)
    assert [tuple(p.shape) for p in parts] == [(4, 32), (4, 32)]


def test_unpack_reads_mlx_packing() -> None:
    import mlx.core as mx

    w = np.random.default_rng(1).uniform(-1, 1, (4, 64)).astype(np.float32)
    wq, scales, biases = mx.quantize(mx.array(w), group_size=64, bits=4)
    fields = unpack(np.array(wq), 4)
    got = fields.reshape(4, 1, 64) * np.array(scales)[..., None] + np.array(biases)[..., None]
    np.testing.assert_allclose(got.reshape(4, 64), np.array(mx.dequantize(wq, scales, biases, 64, 4)), atol=1e-6)


# -- the commands on the toy family ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_toy_verifies_on_the_interpreter_with_ragged_rows(dtype: str) -> None:
    from kernsearch import get_backend

    sp = toy_space("7,301", dtype)
    cfg = sp.parse_config("TG=64")
    check, _ = verify_kernel(get_backend("cpu"), render(sp.family, cfg, dtype), geometry(sp, cfg), sp.problem,
                             chip=M2MAX)
    assert check.ok, check.summary()


def test_a_wrong_scale_dtype_is_caught_by_verification(tmp_path: Path) -> None:
    """The uint32 input really reaches the kernel as uint32: read as float it gives garbage (a failing check)."""
    from kernsearch import get_backend

    folder = tmp_path / "toy"
    folder.mkdir()
    (folder / "toy.metal.j2").write_text((TOY / "toy.metal.j2").read_text().replace(
        "float(scale[row])", "as_type<float>(scale[row])"))
    (folder / "family.toml").write_text((TOY / "family.toml").read_text())
    fam = load_family(folder)
    sp = Space(make_problem(fam, "3,40", "float32", M2MAX), M2MAX)
    cfg = sp.parse_config("")
    check, _ = verify_kernel(get_backend("cpu"), render(fam, cfg, "float32"), geometry(sp, cfg), sp.problem,
                             chip=M2MAX)
    assert not check.ok


@pytest.mark.slow
def test_space_render_verify_tune_export_on_the_toy_family(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    space = run_cli("space", str(TOY), home=home)
    assert space.returncode == 0, space.stderr
    assert "scaled_rmsnorm 64x1000 float16 on M2 Max" in space.stdout and "4 valid" in space.stdout
    predict = run_cli("predict", str(TOY), "--json", home=home)
    assert predict.returncode == 0 and json.loads(predict.stdout)["chip"] == "M2 Max"  # one default chip
    rendered = run_cli("render", str(TOY), "--config", "TG=128", home=home)
    assert rendered.returncode == 0 and "constexpr uint TG = 128;" in rendered.stdout
    assert "x, w, scale, eps" in rendered.stdout
    verify = run_cli("verify", str(TOY), "--shape", "9,130", "--dtype", "float32", "--check", home=home)
    assert verify.returncode == 0 and "pass" in verify.stdout, verify.stdout + verify.stderr
    tune = run_cli("tune", str(TOY), "--shape", "33,300", "--dtype", "float32", "--publish", home=home)
    assert tune.returncode == 0, tune.stderr
    assert "published as v1" in tune.stdout + tune.stderr
    exported = run_cli("export", str(TOY), "--out", str(tmp_path / "dist"), home=home)
    assert exported.returncode == 0, exported.stderr
    src = next((tmp_path / "dist").glob("kernsearch_kernels-*/kernsearch_kernels"))
    table = json.loads((src / "dispatch.json").read_text())["families"]["scaled_rmsnorm"]
    assert table["params"] == [{"name": "eps", "value": pytest.approx(1e-5), "dtype": "float32"}]
    assert [i["dtype"] for i in table["inputs"]] == ["T", "T", "uint32"]
    assert table["artifacts"][0]["kernel"]["input_names"] == ["x", "w", "scale", "eps"]

    # The package (no GPU here: the MLX op) gives the reference's answer, its dtype read off x, not scale.
    spec_ = importlib.util.spec_from_file_location("kernsearch_kernels", src / "__init__.py",
                                                   submodule_search_locations=[str(src)])
    module = importlib.util.module_from_spec(spec_)
    sys.modules["kernsearch_kernels"] = module
    try:
        spec_.loader.exec_module(module)
        import mlx.core as mx

        sp = toy_space("6,50", "float32")
        logical = make_inputs(sp.problem, 1)
        args = [mx.array(logical["x"].astype(np.float32)), mx.array(logical["w"].astype(np.float32)),
                mx.array(logical["scale"])]
        out = module.scaled_rmsnorm(*args)
        np.testing.assert_allclose(np.array(out), reference(sp.problem, logical)[0], rtol=1e-5, atol=1e-5)
        assert module.scaled_rmsnorm.explain(*args).dtype == "float32"
    finally:
        sys.modules.pop("kernsearch_kernels", None)

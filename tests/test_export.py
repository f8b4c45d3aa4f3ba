"""The exported package: dispatch through the fallback chain, run-time geometry, hash checks, and the wheel."""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import mlx.core as mx
import numpy as np
import pytest
from judged import consumer_modes

from kernsearch import (
    ArtifactStore,
    Candidate,
    KernsearchError,
    Space,
    export,
    geometry,
    get_chip,
    load_family,
    make_problem,
)
from kernsearch.artifacts._artifacts import ArtifactKey
from kernsearch.artifacts._manifest import ArtifactError, Correctness, Measurements
from kernsearch.exporting._export import ExportError, expr_tree
from kernsearch.exporting.runtime import _runtime

M2MAX = {"architecture": "applegpu_g14c", "device_name": "Apple M2 Max"}
M2PRO = {"architecture": "applegpu_g14s", "device_name": "Apple M2 Pro"}
M3MAX = {"architecture": "applegpu_g15c", "device_name": "Apple M3 Max"}
H100 = {"architecture": "sm_90", "device_name": "NVIDIA H100 80GB HBM3"}
H200 = {"architecture": "sm_90", "device_name": "NVIDIA H200"}
CPU = {"architecture": "x86_64", "device_name": "AMD EPYC"}
HAS_CUDA_TEMPLATE = "cuda" in load_family("gemm").templates
needs_cuda_template = pytest.mark.skipif(not HAS_CUDA_TEMPLATE, reason="gemm has no CUDA template in this checkout")


DETECTED = {"M2 Max": M2MAX, "M2 Pro": M2PRO, "M3 Max": M3MAX, "H100": H100, "H200": H200}


def candidate(chip: str, shape: tuple[int, ...], dtype: str = "float32", config: dict | None = None,
              median: float = 1.0, target: str = "metal", evidence: str = "measured",
              speedup: float = 1.5, family: str = "gemm") -> Candidate:
    """A measured candidate (detected on ``chip``) that beats the op by ``speedup`` (range +-1 %)."""
    fam = load_family(family)
    c = get_chip(chip)
    if evidence == "measured":
        c = c.model_copy(update={"detected": DETECTED[chip]})
    space = Space(make_problem(fam, shape, dtype, c), c)
    corr = Correctness(verifier="device" if evidence == "measured" else "interpreter", passed=True,
                       shapes_checked=["x".join(map(str, shape))], max_abs_error=1e-6, checks_run=1)
    meas = Measurements(median_ms=median, spread=0.01, baseline_median_ms=median * speedup, baseline_spread=0.01,
                        speedup_low=speedup * 0.99, speedup_high=speedup * 1.01,
                        modes=consumer_modes(median, speedup, speedup * 0.99, speedup * 1.01))
    return Candidate.for_config(space, space.parse_config(config or {}), target=target, correctness=corr,
                                evidence=evidence, measurements=None if evidence == "interpreted" else meas,
                                study="test")


def import_package(source_dir: Path, name: str) -> ModuleType:
    """Import an exported package from its source tree under its own name."""
    pkg = source_dir / name
    spec = importlib.util.spec_from_file_location(name, pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("export")
    store = ArtifactStore(root / "store")
    published = [
        store.publish(candidate("M2 Max", (64, 64, 64), config={"LAYOUT_B": "t"})),
        store.publish(candidate("M2 Max", (2048, 2048, 2048), config={"BM": 64, "BN": 64, "VEC": 4})),
    ]
    if HAS_CUDA_TEMPLATE:
        published.append(store.publish(candidate("H100", (64, 64, 64), "float16", target="cuda")))
    assert all(p.published for p in published), published
    result = export(["gemm"], root / "dist", store, package="ks_test_kernels", version="1.0.0")
    return result, store, import_package(result.source_dir, "ks_test_kernels")


def arrays(m: int, n: int, k: int, dtype=mx.float32):
    return mx.zeros((m, k), dtype=dtype), mx.zeros((k, n), dtype=dtype)  # lazy: never allocated


# -- the fallback chain ------------------------------------------------------------------------------------

@pytest.mark.parametrize("chip, dtype, level, artifact", [
    (M2MAX, mx.float32, "exact chip", "gemm/M2-Max/float32/64x64x64/v1"),
    (M2PRO, mx.float32, "same generation", "gemm/M2-Max/float32/64x64x64/v1"),
    ("M2 Pro", mx.float32, "same generation", "gemm/M2-Max/float32/64x64x64/v1"),  # a chip named, not detected
    (M3MAX, mx.float32, "mlx op", None),  # no measured evidence that the default config wins there
    ({"architecture": "applegpu_g17c", "device_name": "Apple M9 Max"}, mx.float32, "mlx op", None),
    (CPU, mx.float32, "mlx op", None),
    (None, mx.float32, "mlx op", None),  # this machine: no GPU back-end
    (M2MAX, mx.int32, "mlx op", None),  # a dtype the family does not support
    pytest.param(H100, mx.float16, "exact chip", "gemm/H100/float16/64x64x64/v1", marks=needs_cuda_template),
    pytest.param(H200, mx.float16, "same generation and die", "gemm/H100/float16/64x64x64/v1",
                 marks=needs_cuda_template),
])
@pytest.mark.slow
def test_each_level_of_the_fallback_chain(exported, chip, dtype, level: str, artifact: str | None) -> None:
    _, _, pkg = exported
    decision = pkg.gemm.explain(*arrays(64, 64, 64, dtype), chip=chip)
    assert decision.level == level, str(decision)
    assert decision.artifact == artifact, str(decision)
    if level == "family default":
        assert decision.config == dict(load_family("gemm").default)
    assert pkg.explain("gemm", *arrays(64, 64, 64, dtype), chip=chip).level == level
    assert str(decision).count("\n") == len(decision.why)  # one line per reason


def test_tuned_kernels_can_be_switched_off(exported, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, pkg = exported
    assert pkg.gemm.explain(*arrays(64, 64, 64), chip=M2MAX).level == "exact chip"
    monkeypatch.setenv("KERNSEARCH_KERNELS", "off")
    decision = pkg.gemm.explain(*arrays(64, 64, 64), chip=M2MAX)
    assert decision.level == "mlx op" and "switched off" in str(decision)


def test_the_chain_says_why_each_level_was_passed(exported) -> None:
    _, _, pkg = exported
    text = str(pkg.gemm.explain(*arrays(64, 64, 64), chip=M3MAX))
    assert "exact chip: no metal float32 artifact" in text
    assert "family default: skipped: no measured evidence that the default config beats mx.matmul on M3 Max" in text
    assert "no GPU back-end here" in str(pkg.gemm.explain(*arrays(8, 8, 8)))
    assert "A has 3 dimensions" in str(pkg.gemm.explain(mx.zeros((2, 3, 4)), mx.zeros((4, 5)), chip=M2MAX))


@pytest.mark.parametrize("shape, tuned", [
    ((2048, 2048, 2048), "2048x2048x2048"),
    ((64, 64, 64), "64x64x64"),
    ((1500, 1500, 1500), None),  # no kernel was judged there: the op, whatever is near
    ((64, 64, 65), None),
])
def test_a_kernel_runs_only_at_a_shape_it_was_judged_at(exported, shape, tuned: str | None) -> None:
    _, _, pkg = exported
    m, n, k = shape
    decision = pkg.gemm.explain(*arrays(m, n, k), chip=M2MAX)
    if tuned is None:
        assert decision.level == "mlx op" and "a kernel runs only at a shape it was measured to win at" \
            in str(decision), str(decision)
    else:
        assert decision.level == "exact chip" and decision.artifact.split("/")[3] == tuned, str(decision)


# -- run-time expressions agree with kernsearch's --------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("chip_name", ["M2 Max", "M1", "H100"])
def test_runtime_constraints_and_geometry_match_kernsearch(exported, chip_name: str) -> None:
    result, _, _ = exported
    table = json.loads((result.source_dir / "ks_test_kernels" / "dispatch.json").read_text())
    fam_table = table["families"]["gemm"]
    fam = load_family("gemm")
    chip = get_chip(chip_name)
    record = next(c for c in table["chips"] if c["name"] == chip_name)
    rng = random.Random(7)
    seen = {True: 0, False: 0}
    for shape in [(64, 64, 64), (100, 37, 513), (4096, 16, 4096)]:
        dtype = "float16"
        space = Space(make_problem(fam, shape, dtype, chip), chip)
        # 1,500 configs of the product drawn at random (each knob's value uniformly, as a uniform draw from
        # Space.iter_all is: listing its 2.5 million configs to draw from took ~10 s a shape)
        configs = [{name: rng.choice(knob.values) for name, knob in fam.knobs.items()} for _ in range(1500)]
        # SPLIT_K > 1 is valid on NVIDIA only: half the sample at SPLIT_K = 1 keeps Apple's valid share
        configs = [c if i % 2 else {**c, "SPLIT_K": 1} for i, c in enumerate(configs)]
        dims = dict(zip(fam.dims, shape))
        for config in configs:
            bad = _runtime.violation(fam_table, config, dims, record, dtype)
            assert (bad == "") == space.is_valid(config), (config, bad)
            seen[not bad] += 1
            if not bad:
                names = _runtime._context(fam_table, config, dims, record, dtype)
                geo = geometry(space, config)
                launch = fam_table["launch"]
                assert tuple(_runtime.evaluate(launch["grid"], names)) == geo.grid
                assert tuple(_runtime.evaluate(launch["threadgroup"], names)) == geo.threadgroup
                if "shared_memory" in launch:
                    assert _runtime.evaluate(launch["shared_memory"], names) == geo.shared_memory
                assert tuple(_runtime.evaluate(fam_table["outputs"][0]["shape"], names)) == geo.output_shapes[0]
                assert bool(_runtime.evaluate(launch["zero_outputs"], names)) == geo.zero_outputs
    assert seen[True] >= 100 and seen[False] >= 100  # both verdicts were compared, many times


def test_expression_trees_evaluate_like_the_spec_sandbox() -> None:
    ctx = {"a": 7, "b": 2, "s": "AB", "chip": {"vendor": "nvidia"}, "xs": [3, 4]}
    for text in ["a // b + a % b * 3 - -a", "a / b", "a ** b", "ceil_div(a, b) * 2", "'A' in s and not 'C' in s",
                 "1 < a <= 7 != b", "a if chip.vendor == 'nvidia' else b", "[a, b, max(a, b, 9)]", "xs[1]",
                 "s ~ 'x'", "round_up(a, 4) == 8 or false", "is_pow2(b) and abs(-a) == a",
                 "xs[0:1]", "(a, b)"]:  # one evaluator on both sides (_rules): slices and tuples export too
        from kernsearch.family._expr import BUILTINS, Expr

        assert _runtime.evaluate(expr_tree(text), {**_runtime.FUNCTIONS, **ctx}) == Expr(text)({**BUILTINS, **ctx}), text
    for refused in ["a | abs", "a is even", "f(*xs)", "xs.__class__"]:
        with pytest.raises(ExportError):
            expr_tree(refused)


# -- launching and hash checks ----------------------------------------------------------------------------

def test_a_kernel_is_built_once_and_launched_with_the_runtime_geometry(exported) -> None:
    """The planned call is compiled once (mx.compile): the kernel object is called while tracing, with the
    geometry kernsearch computes; later calls replay the compiled graph and build nothing."""
    result, _, _ = exported
    dispatcher = _runtime.Dispatcher(result.source_dir / "ks_test_kernels")
    built, launches = [], []

    def factory(source: dict, shared_memory: int):
        built.append(source["sha256"])

        def kernel(*, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
            launches.append((grid, threadgroup, output_shapes, template))
            a, b = inputs
            assert b.shape == (output_shapes[0][1], a.shape[1])  # LAYOUT_B = t: B arrives as [N, K]
            return [mx.matmul(a, mx.transpose(b)).astype(output_dtypes[0])]

        return kernel

    dispatcher.kernel_factory = factory
    rng = np.random.default_rng(0)
    fam, chip = load_family("gemm"), get_chip("M2 Max")
    for _seed in range(3):
        a, b = rng.uniform(-1, 1, (64, 64)).astype(np.float32), rng.uniform(-1, 1, (64, 64)).astype(np.float32)
        c = dispatcher.call("gemm", mx.array(a), mx.array(b), chip="M2 Max")  # a name: hashable, planned once
        np.testing.assert_allclose(np.array(c), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    decision = dispatcher.explain("gemm", mx.array(a), mx.array(b), chip=M2MAX)
    assert decision.artifact == "gemm/M2-Max/float32/64x64x64/v1"
    geo = geometry(Space(make_problem(fam, (64, 64, 64), "float32", chip), chip), decision.config)
    # traced by mx.compile (at most twice: MLX traces again on the second call), then replayed
    assert all(x == (geo.grid, geo.threadgroup, [geo.output_shapes[0]], [("T", mx.float32)]) for x in launches)
    assert len(built) == 1 and 1 <= len(launches) <= 2  # built once; three calls
    before = len(launches)
    dispatcher.call("gemm", mx.array(a), mx.array(b), chip="M2 Max")
    assert len(launches) == before


def test_a_call_is_planned_once_per_key_and_the_off_switch_still_acts_per_call(exported, monkeypatch) -> None:
    """The package must not slow the op down: a repeated call skips deciding and planning."""
    result, _, _ = exported
    dispatcher = _runtime.Dispatcher(result.source_dir / "ks_test_kernels")
    traced, decided = [], []
    dispatcher.kernel_factory = lambda source, shm: (
        lambda **kw: traced.append(kw["grid"]) or [mx.matmul(kw["inputs"][0], mx.transpose(kw["inputs"][1]))])
    real_decide = dispatcher.decide
    dispatcher.decide = lambda *a, **kw: decided.append(a[1]) or real_decide(*a, **kw)  # type: ignore[method-assign]
    real_plan = dispatcher._plan
    planned = []
    dispatcher._plan = lambda *a, **kw: planned.append(a[0]) or real_plan(*a, **kw)  # type: ignore[method-assign]
    rng = np.random.default_rng(1)
    a, b = rng.uniform(-1, 1, (64, 64)).astype(np.float32), rng.uniform(-1, 1, (64, 64)).astype(np.float32)
    for _ in range(3):
        c = dispatcher.call("gemm", mx.array(a), mx.array(b), chip="M2 Max")
        np.testing.assert_allclose(np.array(c), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert len(decided) == 1 and len(planned) == 1 and len(traced) <= 2  # decided, planned once, compiled
    np.testing.assert_allclose(np.array(dispatcher.call("gemm", a, b, chip="M2 Max")), a @ b, rtol=1e-4, atol=1e-4)
    assert len(decided) == 2 and len(planned) == 2  # NumPy inputs: another key, same kernel
    monkeypatch.setenv("KERNSEARCH_KERNELS", "off")
    c = dispatcher.call("gemm", mx.array(a), mx.array(b), chip="M2 Max")
    assert len(planned) == 3 and planned[-1] == "gemm"  # switched off between two calls: the op's plan, at once
    assert dispatcher.explain("gemm", mx.array(a), mx.array(b), chip="M2 Max").level == "mlx op"
    np.testing.assert_allclose(np.array(c), a @ b, rtol=1e-4, atol=1e-4)
    monkeypatch.delenv("KERNSEARCH_KERNELS")
    dispatcher.call("gemm", mx.array(a), mx.array(b), chip="M2 Max")
    assert len(planned) == 3  # back on: the first key's plan again
    c = dispatcher.call("gemm", mx.array(a[:, :8]), mx.array(b[:8]), chip="H100")  # nothing for H100: the op
    np.testing.assert_allclose(np.array(c), a[:, :8] @ b[:8], rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not HAS_CUDA_TEMPLATE, reason="gemm has no CUDA template in this checkout")
def test_cuda_kernels_get_the_launch_shared_memory(exported) -> None:
    result, _, _ = exported
    dispatcher = _runtime.Dispatcher(result.source_dir / "ks_test_kernels")
    built = []
    dispatcher.kernel_factory = lambda source, shm: built.append((source["target"], shm)) or (
        lambda **kw: [mx.matmul(*kw["inputs"])])
    dispatcher.call("gemm", mx.ones((64, 64), dtype=mx.float16), mx.ones((64, 64), dtype=mx.float16), chip=H200)
    fam, chip = load_family("gemm"), get_chip("H200")
    decision = dispatcher.explain("gemm", *arrays(64, 64, 64, mx.float16), chip=H200)
    geo = geometry(Space(make_problem(fam, (64, 64, 64), "float16", chip), chip), decision.config)
    assert built == [("cuda", geo.shared_memory)] and geo.shared_memory > 0


def test_a_tampered_kernel_in_the_package_is_refused_and_the_chain_goes_on(exported, tmp_path: Path) -> None:
    import shutil

    result, _, _ = exported
    copy = tmp_path / "pkg"
    shutil.copytree(result.source_dir / "ks_test_kernels", copy)
    (copy / "artifacts/gemm/M2-Max/float32/64x64x64/v1/source.metal").write_text("kernel void evil() {}\n")
    dispatcher = _runtime.Dispatcher(copy)
    with pytest.warns(RuntimeWarning, match="content hash mismatch"):
        decision = dispatcher.explain("gemm", *arrays(64, 64, 64), chip=M2MAX)
    # refused, and the level's other artifact was judged at 2048^3 only: the MLX op runs
    assert decision.level == "mlx op" and "64x64x64/v1 skipped: refused: its manifest or kernel files are not what " \
        "the store recorded at publish" in str(decision)
    decision = dispatcher.explain("gemm", *arrays(2048, 2048, 2048), chip=M2MAX)  # the intact one still serves
    assert decision.level == "exact chip" and decision.artifact == "gemm/M2-Max/float32/2048x2048x2048/v1"


def test_a_package_names_only_dtypes_of_mlx() -> None:
    """A package's tables and manifests are data: a template value, an output's or a parameter's dtype naming
    anything of ``mlx.core`` but a dtype (a forged package: ``eval``, ``array``) is not looked up as that object."""
    from kernsearch.exporting.runtime import _checks

    got = _runtime._template_args(mx, [["T", "float16"], ["N", 4], ["F", "eval"], ["A", "array"], ["B", True]])
    assert got == [("T", mx.float16), ("N", 4), ("F", "eval"), ("A", "array"), ("B", True)]
    assert _checks.mx_dtype("bfloat16") == mx.bfloat16 and _checks._out_dtype({}, "float32") == mx.float32
    for name in ("eval", "array", "Dtype", "__import__", 3, None):
        with pytest.raises(ValueError, match="is not an MLX dtype"):
            _checks.mx_dtype(name)
    with pytest.raises(ValueError, match="is not an MLX dtype"):
        _checks._out_dtype({"dtype": "compile"}, "float16")


# -- building -----------------------------------------------------------------------------------------------

def test_export_refuses_tampered_artifacts_and_skips_invalidated_ones(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    only_defaults = export(["gemm"], tmp_path / "dist", store, version="1.0")
    assert only_defaults.artifacts == [] and "measured to beat the MLX op" in only_defaults.notes[0]
    store.publish(candidate("M2 Max", (64, 64, 64)))
    store.publish(candidate("M2 Pro", (64, 64, 64)))
    key = ArtifactKey.parse("gemm/M2-Pro/float32/64x64x64")[0]
    store.invalidate(key, "bad")
    shipped = export(None, tmp_path / "dist", store, version="1.1")
    assert shipped.artifacts == ["gemm/M2-Max/float32/64x64x64/v1"]
    (store.key_dir(ArtifactKey.parse("gemm/M2-Max/float32/64x64x64")[0]) / "v1" / "manifest.json").write_text("{}")
    with pytest.raises(ArtifactError, match="malformed manifest"):
        export(None, tmp_path / "dist", store, version="1.2")
    with pytest.raises(ExportError, match="lower-case Python identifier"):
        export(["gemm"], tmp_path / "dist", store, package="Bad-Name")


CONSUMER = textwrap.dedent("""
    import importlib.util, json, sys
    import numpy as np, mlx.core as mx
    import {name} as pkg
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (64, 64)).astype(np.float32)  # the tuned shape, 64x64x64
    b = rng.uniform(-1, 1, (64, 64)).astype(np.float32)
    c = pkg.gemm(mx.array(a), mx.array(b))
    print(json.dumps({{
        "err": float(np.abs(np.array(c) - a.astype(np.float64) @ b).max()),
        "shape": list(c.shape),
        "level": pkg.gemm.explain(mx.array(a), mx.array(b)).level,
        "m2max": str(pkg.explain("gemm", mx.array(a), mx.array(b), chip={m2max!r})),
        "file": pkg.__file__,
        "kernsearch_importable": importlib.util.find_spec("kernsearch") is not None,
        "heavy_modules": sorted(m for m in ("kernsearch", "jinja2", "pydantic", "optuna") if m in sys.modules),
    }}))
""")


@pytest.mark.slow
def test_publish_list_show_export_install_import_call(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kernsearch.cli import app

    store_dir = tmp_path / "store"
    outcome = ArtifactStore(store_dir).publish(candidate("M2 Max", (64, 64, 64), config={"BM": 64}, median=0.7))
    assert outcome.published
    runner = CliRunner()
    listed = runner.invoke(app, ["artifacts", "list", "--store", str(store_dir)])
    assert listed.exit_code == 0 and "gemm/M2-Max/float32/64x64x64  v1" in listed.output and "current" in listed.output
    shown = runner.invoke(app, ["artifacts", "show", "gemm/M2-Max/float32/64x64x64", "--store", str(store_dir)])
    assert shown.exit_code == 0 and "measured" in shown.output and "BM=64" in shown.output
    assert "first version for this key" in shown.output
    verified = runner.invoke(app, ["artifacts", "verify", "--store", str(store_dir)])
    assert verified.exit_code == 0 and "1 version(s) verified" in verified.output
    built = runner.invoke(app, ["export", "gemm", "--store", str(store_dir), "--out", str(tmp_path / "dist"),
                                "--name", "ks_e2e_kernels", "--version", "2.0.1"])
    assert built.exit_code == 0, built.output
    wheel = tmp_path / "dist" / "ks_e2e_kernels-2.0.1-py3-none-any.whl"
    assert wheel.is_file()

    # A fresh venv that sees only mlx and numpy (through a .pth to a folder holding just those).
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = tmp_path / "deps"
    deps.mkdir()
    test_site = Path(np.__file__).resolve().parents[1]
    for entry in test_site.iterdir():
        if entry.name.split("-")[0].split(".")[0] in ("mlx", "mlx_cpu", "numpy"):
            (deps / entry.name).symlink_to(entry)
    Path(site, "deps.pth").write_text(f"{deps}\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "-q", str(wheel)], check=True, capture_output=True, timeout=300)
    res = subprocess.run([str(python), "-I", "-c", CONSUMER.format(name="ks_e2e_kernels", m2max=M2MAX)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["file"].startswith(str(venv)) and report["shape"] == [64, 64]
    assert report["err"] < 1e-4 and report["level"] == "mlx op"
    assert "exact chip -> gemm/M2-Max/float32/64x64x64/v1" in report["m2max"]
    assert not report["kernsearch_importable"] and report["heavy_modules"] == []


@pytest.mark.slow
def test_the_wheel_is_the_flit_build_of_the_source_tree_and_its_version_is_normal(tmp_path: Path) -> None:
    """Export's wheel is what pip builds from the source tree beside it; versions are PEP 440 normal forms."""
    import zipfile

    store = ArtifactStore(tmp_path / "store")
    store.publish(candidate("M2 Max", (64, 64, 64), config={"BM": 64}, median=0.7))
    result = export(["gemm"], tmp_path / "dist", store, package="ks_flit", version="2026.05.03.021500")
    assert result.version == "2026.5.3.21500" and result.source_dir.name == "ks_flit-2026.5.3.21500"
    assert result.wheel == tmp_path / "dist" / "ks_flit-2026.5.3.21500-py3-none-any.whl"
    assert 'build-backend = "flit_core.buildapi"' in (result.source_dir / "pyproject.toml").read_text()
    rebuilt = tmp_path / "rebuilt"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(rebuilt), str(result.source_dir)], check=True, capture_output=True, timeout=300)
    with zipfile.ZipFile(result.wheel) as ours, zipfile.ZipFile(rebuilt / result.wheel.name) as theirs:
        assert sorted(ours.namelist()) == sorted(theirs.namelist())
        assert all(ours.read(n) == theirs.read(n) for n in ours.namelist() if ".dist-info/" not in n)
        metadata = ours.read("ks_flit-2026.5.3.21500.dist-info/METADATA").decode()
    assert "Name: ks-flit\n" in metadata and "Version: 2026.5.3.21500\n" in metadata
    assert "Requires-Dist: numpy>=1.26" in metadata
    assert json.loads((result.source_dir / "ks_flit" / "dispatch.json").read_text())["version"] == result.version


def _gpu() -> str:
    if mx.metal.is_available():
        return "metal"
    cuda = getattr(mx, "cuda", None)
    return "cuda" if cuda is not None and cuda.is_available() else ""


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs a GPU MLX can use (Metal, or CUDA through MLX's CUDA back-end)")
def test_exported_kernel_runs_on_this_gpu(tmp_path: Path) -> None:
    """The package's own launch path (mx.fast.metal_kernel / cuda_kernel) on real hardware."""
    fam = load_family("gemm")
    if _gpu() not in fam.templates:
        pytest.skip(f"gemm has no {_gpu()} template in this checkout")
    from kernsearch import detect_chip

    here = detect_chip()
    store = ArtifactStore(tmp_path / "store")
    space = Space(make_problem(fam, (300, 200, 260), "float16", here), here)
    corr = Correctness(verifier="interpreter", passed=True, shapes_checked=["300x200x260"], max_abs_error=1e-3,
                       checks_run=1)
    assert store.publish(Candidate.for_config(space, dict(fam.default), target=_gpu(), correctness=corr,
                                              evidence="modeled", measurements=Measurements(median_ms=1.0, spread=0.0),
                                              study="gpu-test")).published
    result = export(["gemm"], tmp_path / "dist", store, package="ks_gpu_kernels", version="1.0.0")
    pkg = import_package(result.source_dir, "ks_gpu_kernels")
    rng = np.random.default_rng(3)
    a, b = rng.uniform(-1, 1, (300, 260)), rng.uniform(-1, 1, (260, 200))
    ma, mb = mx.array(a.astype(np.float16)), mx.array(b.astype(np.float16))
    assert pkg.gemm.explain(ma, mb).level == "mlx op"  # a modeled artifact runs only on the consumer's opt-in
    decision = pkg._dispatcher.explain("gemm", ma, mb, modeled=True)
    assert decision.level == "exact chip", str(decision)
    # the package's own launch path (mx.fast.metal_kernel / cuda_kernel) on this GPU
    c = np.array(pkg._dispatcher.call("gemm", ma, mb, modeled=True).astype(mx.float32), dtype=np.float64)
    ref = a.astype(np.float16).astype(np.float64) @ b.astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(c, ref, rtol=2e-3, atol=2e-3 * np.sqrt(260))


# -- --out: built aside, moved into place, one current wheel (issues 24, 25) -----------------------------------

def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None for a folder)."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def test_a_failed_export_after_a_successful_one_changes_nothing_in_out(tmp_path: Path) -> None:
    """The second export fails midway (gemm written, then a family that does not load): the first one's wheel
    and source tree stay byte-identical, with the same version (the source tree used to be emptied and left
    half-written) and with the default one (a new timestamped folder used to be left empty)."""
    store = ArtifactStore(tmp_path / "store")
    out = tmp_path / "dist"
    for version in ("1.0", None):
        first = export(["gemm"], out, store, version=version)
        before = _tree(out)
        assert first.wheel.name in before and first.source_dir.name in before
        with pytest.raises(KernsearchError, match="no family.toml"):
            export(["gemm", str(tmp_path / "no-such-family")], out, store, version=version)
        assert _tree(out) == before
    with pytest.raises(KernsearchError):  # into a folder that did not exist: it is not left behind either
        export(["gemm", str(tmp_path / "no-such-family")], tmp_path / "new", store)
    assert not (tmp_path / "new").exists()


def test_repeated_exports_leave_one_current_wheel_and_versions_never_collide(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    out = tmp_path / "dist"
    (out / "notes.txt").parent.mkdir()
    (out / "notes.txt").write_text("mine\n")  # not the package's: left alone
    other = export(["gemm"], out, store, package="ks_other", version="3.0")
    versions = []
    for _ in range(3):  # the default version is the UTC second: these land in the same second or the next
        result = export(["gemm"], out, store)
        versions.append(result.version)
        assert sorted(p.name for p in out.iterdir()) == sorted(
            ["notes.txt", other.wheel.name, other.source_dir.name, result.wheel.name, result.source_dir.name])
    # a second export in one second is VERSION.1, not the same name; versions only go up (pip upgrades)
    assert len(set(versions)) == 3 and sorted(versions, key=lambda v: [int(p) for p in v.split(".")]) == versions
    again = export(["gemm"], out, store, version="7.0")
    assert again.wheel.exists() and not result.wheel.exists() and not result.source_dir.exists()
    same = export(["gemm"], out, store, version="7.0")  # the same version again replaces it, once complete
    assert same.wheel == again.wheel and same.wheel.exists() and (same.source_dir / "pyproject.toml").is_file()


def test_a_default_version_taken_in_the_output_folder_goes_up(tmp_path: Path) -> None:
    """The next free version, whatever the clock did (the test above reaches this only when two exports land in one
    second): a version taken gets ``.N`` above every one there, an older one climbs above the top, a newer is kept."""
    from kernsearch.exporting._export import _free_version

    (tmp_path / "pkg-5.0-py3-none-any.whl").write_text("")
    (tmp_path / "pkg-5.0.1").mkdir()
    (tmp_path / "pkgother-9.0").mkdir()  # another package's: not counted
    assert _free_version(tmp_path, "pkg", "5.0") == "5.0.2" and _free_version(tmp_path, "pkg", "4.0") == "5.0.1.1"
    assert _free_version(tmp_path, "pkg", "6") == "6" and _free_version(tmp_path / "absent", "pkg", "5.0") == "5.0"


def test_plain_export_ships_every_builtin_family(tmp_path: Path) -> None:
    """`kernsearch export` with no family named: every built-in family, the MLX op for those without artifacts."""
    from kernsearch.family._spec import builtin_family_names

    result = export(None, tmp_path / "dist", ArtifactStore(tmp_path / "store"), package="ks_all", version="1.0")
    assert result.families == builtin_family_names() and result.artifacts == []
    assert len(result.notes) == 1 and result.notes[0].startswith(", ".join(builtin_family_names()[:6]) + ",")
    try:
        pkg = import_package(result.source_dir, "ks_all")
        x, w = np.random.default_rng(0).uniform(-1, 1, (3, 64)), np.full(64, 1.5)
        y = pkg.rmsnorm(mx.array(x.astype(np.float32)), mx.array(w.astype(np.float32)))  # `from ks_all import rmsnorm`
        np.testing.assert_allclose(np.array(y), x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * w, rtol=1e-5)
        assert pkg.rmsnorm.explain(mx.array(x.astype(np.float32)), mx.array(w.astype(np.float32))).level == "mlx op"
    finally:
        sys.modules.pop("ks_all", None)


def test_export_warns_when_a_family_ships_only_modeled_artifacts(tmp_path: Path) -> None:
    from kernsearch.artifacts._manifest import MODELED_POLICY

    store = ArtifactStore(tmp_path / "store")
    outcome = store.publish(candidate("M2 Max", (64, 64, 64), evidence="modeled"))
    assert outcome.published and outcome.reason.endswith(MODELED_POLICY)  # tune --publish says it too
    result = export(["gemm"], tmp_path / "dist", store, version="1.0")
    assert result.notes == [f"gemm: ships only modeled artifacts (1), none measured: {MODELED_POLICY}"]
    store.publish(candidate("M2 Pro", (64, 64, 64)))  # a measured one: no warning
    assert export(["gemm"], tmp_path / "dist", store, version="1.1").notes == []


def test_one_wording_for_modeled_results_in_the_docs_and_the_verdict() -> None:
    """What happens to a modeled result is said in one wording: the gate's reason, export's warning, the report,
    tune's verdict and the docs (README, docs/artifacts.md, docs/api.md)."""
    from kernsearch._vocabulary import TrialStatus
    from kernsearch.artifacts._manifest import MODELED_POLICY
    from kernsearch.studies._storage import StudyKey
    from kernsearch.studies._study import Record, Stop, StopReason, StudyResult, Trial
    from kernsearch.studies._tune import verdict

    repo = Path(__file__).resolve().parents[1]
    for doc in ("README.md", "docs/artifacts.md", "docs/api.md"):
        text = " ".join((repo / doc).read_text().replace("`", "").split())
        assert MODELED_POLICY in text, doc
    best = Trial(0, {}, TrialStatus.OK, Record(1.0, "modeled"), 1.0)
    result = StudyResult("s", "", "model", "modeled", {}, best, [best], 1, __import__("collections").Counter(), 0,
                         1.0, Stop(StopReason.BUDGET))
    key = StudyKey("gemm", "M2 Max", "float16", "64x64x64", "model")
    assert verdict(result, key, "mx.matmul").text.endswith(MODELED_POLICY)
